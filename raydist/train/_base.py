"""What every facade shares: argument checks, Ray Train configs, fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raydist.errors import TrainingConfigError

__all__ = ["Facade"]


class Facade:
    """Builds one Ray Train trainer from a few arguments and runs it on a
    raydist cluster. Subclasses say which Ray trainer and how the user's
    function is wrapped; the Ray objects stay reachable (``.trainer``)."""

    def __init__(
        self,
        train_fn: Callable[..., Any],
        *,
        config: Mapping[str, Any] | None = None,
        workers: int = 2,
        use_gpu: bool = False,
        resources_per_worker: Mapping[str, float] | None = None,
        run_config: Any = None,
        failure_config: Any = None,
        checkpoint_config: Any = None,
        cluster: Any = None,
        keep_warm_s: float | None = None,
        **trainer_kwargs: Any,
    ) -> None:
        if not callable(train_fn):
            raise TrainingConfigError("train_fn", train_fn, "expected a function run on every worker")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise TrainingConfigError("workers", workers, "expected a whole number of at least 1")
        if resources_per_worker is not None and not isinstance(resources_per_worker, Mapping):
            raise TrainingConfigError(
                "resources_per_worker", resources_per_worker, 'expected a mapping such as {"CPU": 1}'
            )
        self.train_fn = train_fn
        self.config = dict(config or {})
        self.workers = workers
        self.use_gpu = bool(use_gpu)
        self.resources_per_worker = dict(resources_per_worker or {"CPU": 1})
        self.run_config = run_config
        self.failure_config = failure_config
        self.checkpoint_config = checkpoint_config
        self.cluster = cluster
        self.keep_warm_s = keep_warm_s
        self.trainer_kwargs = trainer_kwargs
        self.trainer: Any = None
        """The Ray Train trainer of the last ``fit`` (built lazily)."""
        self.last_result: Any = None
        """Ray Train's Result of the last ``run``."""
        self._mlflow: Any = None  # the driver's MLflow context for the fit in progress
        self._progress: Any = None  # the callback that passes the fit's reports to this process

    # subclass hooks ----------------------------------------------------------

    def _ray_trainer_class(self) -> Any:
        raise NotImplementedError

    def _worker_fn(self) -> Callable[..., Any]:
        return self.train_fn

    def _extra_kwargs(self) -> dict[str, Any]:
        return {}

    def _loop_config(self) -> dict[str, Any]:
        """The ``train_loop_config`` of a run about to start (connected)."""
        return self.config

    # building and running ----------------------------------------------------

    def scaling_config(self) -> Any:
        from ray.train import ScalingConfig

        return ScalingConfig(
            num_workers=self.workers, use_gpu=self.use_gpu, resources_per_worker=self.resources_per_worker
        )

    def build_run_config(self) -> Any:
        from ray.train import RunConfig

        run = self.run_config or RunConfig()
        changes = {}
        if self.failure_config is not None:
            changes["failure_config"] = self.failure_config
        if self.checkpoint_config is not None:
            changes["checkpoint_config"] = self.checkpoint_config
        if self._progress is not None:
            changes["callbacks"] = [*(run.callbacks or []), self._progress]
        if changes:
            import dataclasses

            run = dataclasses.replace(run, **changes)
        return run

    def build(self) -> Any:
        """The Ray Train trainer this facade runs (for users who need more)."""
        from raydist.train._progress import quiet_reports

        cls = self._ray_trainer_class()
        worker = quiet_reports(self._worker_fn())  # rank 0's reports are shown here instead
        self.trainer = cls(
            self._mlflow.wrap(worker) if self._mlflow is not None else worker,
            train_loop_config=self._loop_config(),
            scaling_config=self.scaling_config(),
            run_config=self.build_run_config(),
            **self._extra_kwargs(),
            **self.trainer_kwargs,
        )
        return self.trainer

    def run(self) -> Any:
        """``fit()``, then rank 0's return value; a failed run raises its error.
        The Result stays in ``last_result``."""
        result = self.fit()
        self.last_result = result
        if result.error is not None:
            raise result.error
        return result.return_value

    def fit(self) -> Any:
        """Train on the cluster; returns Ray Train's ``Result``
        (``.metrics``, ``.checkpoint``, ``.return_value`` of rank 0)."""
        from raydist.train._fit import fit_ready
        from raydist.train._mlflow import tracked_run
        from raydist.train._progress import shown_progress
        from raydist.train._signals import keyboard_interrupts
        from raydist.train.session import training_session

        session = training_session()
        session.warm_runs.release()  # warm workers of this process would hold the CPUs this fit needs
        with keyboard_interrupts(), tracked_run(type(self).__name__, self.workers, self.use_gpu) as mlflow:
            self._mlflow = mlflow
            try:
                with session.connected(
                    self.cluster, workers=self.workers, resources_per_worker=self.resources_per_worker,
                    use_gpu=self.use_gpu, keep_warm_s=self.keep_warm_s,
                ) as handle, shown_progress(type(self).__name__) as progress:
                    self._progress = progress
                    return fit_ready(self.build(), raydist_cluster=handle is not None).fit()
            finally:
                self._mlflow = self._progress = None
