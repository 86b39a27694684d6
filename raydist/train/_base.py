"""What every facade shares: argument checks, Ray Train configs, fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raydist.errors import TrainingConfigError

__all__ = ["Facade", "fit_ready"]


def fit_ready(trainer: Any, *, raydist_cluster: bool) -> Any:
    """Adapt a Ray Train trainer to the cluster this process is connected to,
    just before ``fit``; returns it. Ctrl-C aborts the run and raises
    KeyboardInterrupt at once (:mod:`raydist.train._signals`). Leaves out
    what can do nothing there, each a Python process of its own (on a small
    host, a second or more of CPU at the start of every run): on a raydist
    cluster (``raydist_cluster``) Ray's autoscaling coordinator, which those
    clusters do not use (:mod:`raydist.train._policy`), and anywhere two of
    Ray Train V2's default helpers:

    - the datasets helper (``DatasetsCallback``), when the trainer has no
      datasets: it starts a dataset-manager actor, and Ray Data's autoscaling
      coordinator with it, either way;
    - the placement-group cleaner, when the cluster serves no State API
      (raydist's clusters run the dashboard that serves it only on request,
      ``ClusterSpec.dashboard``): it asks that API every second whether the
      run's controller is alive and, without it, only logs a warning to the
      driver each time. The run's placement group still goes with its
      controller.
    """
    import ray._private.worker as ray_worker
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from raydist.train._signals import abort_on_interrupt

    abort_on_interrupt(trainer)
    if raydist_cluster:
        _without_autoscaling_coordinator(trainer)
    node = getattr(ray_worker, "_global_node", None)
    idle: list[type] = []
    if node is not None and not getattr(node, "webui_url", None):
        idle.append(PlacementGroupCleanerCallback)
    if not getattr(trainer, "datasets", None):
        idle.append(DatasetsCallback)
    if not idle:
        return trainer
    make = trainer._create_default_callbacks

    def callbacks() -> list[Any]:
        return [c for c in make() if not isinstance(c, tuple(idle))]

    trainer._create_default_callbacks = callbacks
    return trainer


def _without_autoscaling_coordinator(trainer: Any) -> None:
    """Give the run's controller Ray's fixed scaling policy without its
    registration with Ray's autoscaling coordinator (:mod:`raydist.train._policy`
    says why); any other policy is left as it is."""
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    from raydist.train._policy import FixedScalingWithoutCoordinator

    start = trainer._initialize_and_run_controller

    def initialize_and_run_controller(**kwargs: Any) -> Any:
        policy = kwargs.get("scaling_policy")
        if type(policy) is FixedScalingPolicy:
            kwargs["scaling_policy"] = FixedScalingWithoutCoordinator(policy.scaling_config)
        return start(**kwargs)

    trainer._initialize_and_run_controller = initialize_and_run_controller


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

    # subclass hooks ----------------------------------------------------------

    def _ray_trainer_class(self) -> Any:
        raise NotImplementedError

    def _worker_fn(self) -> Callable[..., Any]:
        return self.train_fn

    def _extra_kwargs(self) -> dict[str, Any]:
        return {}

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
        if changes:
            import dataclasses

            run = dataclasses.replace(run, **changes)
        return run

    def build(self) -> Any:
        """The Ray Train trainer this facade runs (for users who need more)."""
        cls = self._ray_trainer_class()
        self.trainer = cls(
            self._worker_fn(),
            train_loop_config=self.config,
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
        from raydist.train._signals import keyboard_interrupts
        from raydist.train.session import training_session

        session = training_session()
        session.resident.release()  # resident workers of this process would hold the CPUs this fit needs
        cpus = int(self.resources_per_worker.get("CPU", 1) or 0)
        with keyboard_interrupts(), session.connected(
            self.cluster, workers=self.workers, cpus_per_worker=cpus, use_gpu=self.use_gpu,
            keep_warm_s=self.keep_warm_s,
        ) as handle:
            return fit_ready(self.build(), raydist_cluster=handle is not None).fit()
