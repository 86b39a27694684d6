"""[Experimental] ``MirroredStrategyRunner`` with spark-tensorflow-distributor's
signature, on Ray Train."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raydist.errors import TrainingConfigError

__all__ = ["MirroredStrategyRunner"]


def _run_program(fn: Callable[..., Any], kwargs: dict[str, Any], custom: bool) -> Any:
    """``fn(**kwargs)``, inside a MultiWorkerMirroredStrategy scope unless
    ``fn`` makes its own strategy (as spark-tensorflow-distributor does)."""
    if custom:
        return fn(**kwargs)
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        return fn(**kwargs)


def _strategy_worker(fn: Callable[..., Any], kwargs: dict[str, Any], custom: bool) -> Callable[[dict[str, Any]], Any]:
    def run(_config: dict[str, Any]) -> Any:
        return _run_program(fn, kwargs, custom)

    return run


class MirroredStrategyRunner:
    """[Experimental] Drop-in for ``spark_tensorflow_distributor.MirroredStrategyRunner``.

    ``run(train_fn, **kwargs)`` runs ``train_fn(**kwargs)`` on ``num_slots``
    workers inside a ``MultiWorkerMirroredStrategy`` scope (or, with
    ``use_custom_strategy=True``, leaves the strategy to ``train_fn``) and
    returns the chief's (rank 0's) return value.

    Unlike Spark's, ``model.fit`` trains here with plain Keras code: workers
    run Keras 2 (``tf-keras``) under both ``import keras`` and ``tf.keras``,
    since Keras 3 crashes under the strategy (see
    :mod:`raydist.train._keras2` for how, and what it costs).

    Mapping of arguments:
        num_slots: training workers (one GPU each when ``use_gpu``).
        local_mode: as in Spark: ``train_fn`` runs in this process (one CPU
            slot, or up to this machine's GPUs).
        use_gpu: one GPU per worker.
        gpu_resource_name: only ``"gpu"`` exists on Ray; another name is an error.
        use_custom_strategy: as in Spark.

    Besides Spark's arguments: ``cluster`` (a raydist cluster handle or
    name; default the session cluster, see :mod:`raydist.train.session`) and
    ``max_failures`` (lost workers a run survives; Spark fails the run).
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
        if gpu_resource_name != "gpu":
            raise TrainingConfigError("gpu_resource_name", gpu_resource_name, "Ray schedules GPUs as 'gpu' only")
        if local_mode and not use_gpu and num_slots > 1:
            raise TrainingConfigError(
                "num_slots", num_slots, "local mode on CPU runs one process, as in Spark: use num_slots=1"
            )
        self.num_slots = num_slots
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.use_custom_strategy = bool(use_custom_strategy)
        self.cluster = cluster
        self.max_failures = max_failures
        self.last_result: Any = None

    def run(self, train_fn: Callable[..., Any], **kwargs: Any) -> Any:
        if not callable(train_fn):
            raise TrainingConfigError("train_fn", train_fn, "expected a function")
        if self.local_mode:
            return self._run_here(train_fn, kwargs)
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

    def _run_here(self, train_fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """Spark's local mode: this process, CPU only unless ``use_gpu``."""
        from raydist.train.runtime import scoped_env

        with scoped_env({} if self.use_gpu else {"CUDA_VISIBLE_DEVICES": ""}):
            return _run_program(train_fn, kwargs, self.use_custom_strategy)
