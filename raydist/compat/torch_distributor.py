"""[Experimental] ``TorchDistributor`` with pyspark's signature, on Ray Train."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from raydist.compat._torchrun import as_torchrun_worker, run_script
from raydist.errors import ClusterFailedError, TrainingConfigError

__all__ = ["TorchDistributor"]


def _function_worker(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    def run() -> Any:
        as_torchrun_worker()
        return fn(*args, **kwargs)

    return run


def _script_worker(path: str, args: tuple[Any, ...]) -> Callable[[], None]:
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

    Besides Spark's arguments, ``cluster=`` picks the raydist cluster (a
    handle or name); without it, ``RAY_ADDRESS`` or an embedded cluster.
    """

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True, *, cluster: Any = None,
                 max_failures: int = 0) -> None:
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise TrainingConfigError("num_processes", num_processes, "expected a whole number of at least 1")
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.cluster = cluster
        self.max_failures = max_failures
        self.last_result: Any = None
        """Ray Train's Result of the last run (metrics, checkpoint, error)."""

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

    def _fit(self, fn: Callable[[], Any]) -> Any:
        from ray.train import FailureConfig

        from raydist.train.torch import TorchTrainer

        trainer = TorchTrainer(
            lambda _config: fn(),
            workers=self.num_processes,
            use_gpu=self.use_gpu,
            failure_config=FailureConfig(max_failures=self.max_failures),
            cluster=self.cluster,
        )
        try:
            return trainer.run()
        finally:
            self.last_result = trainer.last_result
