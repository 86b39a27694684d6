"""[Experimental] ``MirroredStrategyRunner`` with spark-tensorflow-distributor's
signature, on Ray Train."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raydist.errors import TrainingConfigError

__all__ = ["MirroredStrategyRunner"]


def _strategy_worker(fn: Callable[..., Any], kwargs: dict[str, Any], custom: bool) -> Callable[[dict[str, Any]], Any]:
    def run(_config: dict[str, Any]) -> Any:
        if custom:
            return fn(**kwargs)
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            return fn(**kwargs)

    return run


class MirroredStrategyRunner:
    """[Experimental] Drop-in for ``spark_tensorflow_distributor.MirroredStrategyRunner``.

    ``run(train_fn, **kwargs)`` runs ``train_fn(**kwargs)`` on ``num_slots``
    workers inside a ``MultiWorkerMirroredStrategy`` scope (or, with
    ``use_custom_strategy=True``, leaves the strategy to ``train_fn``) and
    returns the chief's (rank 0's) return value. Workers use legacy Keras 2
    (see :mod:`raydist.train.tensorflow`).

    Mapping of arguments to Ray:
        num_slots: training workers (one GPU each when ``use_gpu``).
        local_mode: ``True`` in Spark trains in the driver alone; here it is
            refused with an error, since the point of this class is to spread
            work: call ``train_fn`` yourself for a local run.
        use_gpu: one GPU per worker.
        gpu_resource_name: only ``"gpu"`` exists on Ray; another name is an error.
        use_custom_strategy: as in Spark.
    """

    def __init__(
        self,
        num_slots: int,
        local_mode: bool = False,
        use_gpu: bool = True,
        gpu_resource_name: str = "gpu",
        use_custom_strategy: bool = False,
        *,
        cluster: Any = None,
        max_failures: int = 0,
    ) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise TrainingConfigError("num_slots", num_slots, "expected a whole number of at least 1")
        if local_mode:
            raise TrainingConfigError(
                "local_mode",
                local_mode,
                "run train_fn directly for a local run; MirroredStrategyRunner on raydist always trains on the cluster",
            )
        if gpu_resource_name != "gpu":
            raise TrainingConfigError("gpu_resource_name", gpu_resource_name, "Ray schedules GPUs as 'gpu' only")
        self.num_slots = num_slots
        self.use_gpu = bool(use_gpu)
        self.use_custom_strategy = bool(use_custom_strategy)
        self.cluster = cluster
        self.max_failures = max_failures
        self.last_result: Any = None

    def run(self, train_fn: Callable[..., Any], **kwargs: Any) -> Any:
        if not callable(train_fn):
            raise TrainingConfigError("train_fn", train_fn, "expected a function")
        from ray.train import FailureConfig

        from raydist.train.tensorflow import TensorflowTrainer

        trainer = TensorflowTrainer(
            _strategy_worker(train_fn, kwargs, self.use_custom_strategy),
            workers=self.num_slots,
            use_gpu=self.use_gpu,
            failure_config=FailureConfig(max_failures=self.max_failures),
            cluster=self.cluster,
        )
        try:
            return trainer.run()
        finally:
            self.last_result = trainer.last_result
