"""[Experimental] ``TorchDistributor`` with pyspark's signature, on Ray Train."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from raydist.compat._torchrun import as_torchrun_worker, run_script
from raydist.errors import ClusterFailedError, TrainingConfigError
from raydist.train.resident import DEFAULT_KEEP_ALIVE_S

__all__ = ["TorchDistributor"]


def _function_worker(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    def run() -> Any:
        return fn(*args, **kwargs)

    return run


def _script_worker(path: str, args: tuple[Any, ...]) -> Callable[[], None]:
    """Run a training script as torchrun would; the environment is already set."""

    def run() -> None:
        code = run_script(path, [str(a) for a in args])
        if code != 0:
            raise ClusterFailedError(f"training script {path} exited with code {code}")

    return run


class TorchDistributor:
    """[Experimental] Drop-in for ``pyspark.ml.torch.distributor.TorchDistributor``.

    ``run(train_object, *args, **kwargs)`` runs ``train_object`` (a function
    or a script path) on ``num_processes`` Ray Train workers, each set up as
    ``torchrun`` would (so code that calls ``init_process_group`` itself
    works), and returns rank 0's return value (None for a script), as Spark's
    does.

    Mapping of arguments to Ray:
        num_processes: the number of Ray Train workers.
        local_mode: Spark runs ``local_mode=True`` on the driver. Here workers
            always run on the cluster's Ray nodes; ``local_mode=True`` is
            accepted and means the same processes count.
        use_gpu: one GPU per worker; an error before training if the cluster
            has too few.

    Besides Spark's arguments:
        cluster: the raydist cluster (a handle or name); without it,
            ``RAY_ADDRESS`` or an embedded cluster for this run only.
        max_failures: how many lost workers a run survives; the workers are
            replaced and the function starts again (Spark fails the run).
        keep_warm_s: the workers stay up this long after a run, and the next
            run with the same settings forks each worker's process for the
            function instead of starting new processes that import torch
            again (see :mod:`raydist.train.resident`). ``0`` starts a new
            Ray Train run every time. GPU runs and runs on an embedded
            cluster always start a new run.
    """

    #: Whether runs may reuse warm workers at all (DeepSpeed's may not).
    _warm_capable = True

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        *,
        cluster: Any = None,
        max_failures: int = 0,
        keep_warm_s: float = DEFAULT_KEEP_ALIVE_S,
    ) -> None:
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise TrainingConfigError("num_processes", num_processes, "expected a whole number of at least 1")
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < -1:
            raise TrainingConfigError("max_failures", max_failures, "expected a whole number (-1: retry forever)")
        if isinstance(keep_warm_s, bool) or not isinstance(keep_warm_s, (int, float)) or not 0 <= keep_warm_s < 1e6:
            raise TrainingConfigError("keep_warm_s", keep_warm_s, "expected seconds, 0 for fresh workers every run")
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.cluster = cluster
        self.max_failures = max_failures
        self.keep_warm_s = float(keep_warm_s)
        self.last_result: Any = None
        """Ray Train's Result of the last run that had a Ray Train run of its
        own (``keep_warm_s=0``); None for a run on warm workers."""

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        if isinstance(train_object, str):
            if not os.path.isfile(train_object):
                raise TrainingConfigError("train_object", train_object, "no such training script")
            if kwargs:
                raise TrainingConfigError(
                    "kwargs", sorted(kwargs), "a script takes positional command-line arguments only, as in pyspark"
                )
            fn: Callable[..., Any] = _script_worker(os.path.abspath(train_object), args)
        elif callable(train_object):
            fn = _function_worker(train_object, args, kwargs)
        else:
            raise TrainingConfigError("train_object", train_object, "expected a function or a script path")
        return self._fit(fn)

    def _fit(self, job: Callable[[], Any]) -> Any:
        """Run ``job()`` on every worker with torchrun's environment set;
        rank 0's return value."""
        from raydist.train._connect import starts_embedded

        if self._warm_capable and self.keep_warm_s > 0 and not self.use_gpu and not starts_embedded(self.cluster):
            return self._fit_warm(job)
        return self._fit_fresh(job)

    def _fit_warm(self, job: Callable[[], Any]) -> Any:
        from raydist.train._connect import connected
        from raydist.train.resident import resident_run

        self.last_result = None
        with connected(self.cluster, workers=self.num_processes, cpus_per_worker=1, use_gpu=self.use_gpu):
            run = resident_run(
                workers=self.num_processes,
                resources_per_worker={"CPU": 1},
                max_failures=self.max_failures,
                keep_alive_s=self.keep_warm_s,
            )
            return run.run(job)

    def _fit_fresh(self, job: Callable[[], Any]) -> Any:
        from ray.train import FailureConfig, RunConfig

        from raydist.train.resident import TORCHRUN_PRIORITY_ENV
        from raydist.train.torch import TorchTrainer

        def worker(_config: Any) -> Any:
            from raydist.train._fork import keep_destroyed_groups

            as_torchrun_worker()
            keep_destroyed_groups()  # this worker ends with the run; see raydist.train._fork
            return job()

        trainer = TorchTrainer(
            worker,
            workers=self.num_processes,
            use_gpu=self.use_gpu,
            failure_config=FailureConfig(max_failures=self.max_failures),
            run_config=RunConfig(worker_runtime_env=TORCHRUN_PRIORITY_ENV),
            cluster=self.cluster,
        )
        try:
            return trainer.run()
        finally:
            self.last_result = trainer.last_result
