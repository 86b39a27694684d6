"""[Experimental] ``MirroredStrategyRunner`` with spark-tensorflow-distributor's
signature: in Spark's own tasks while the session cluster is not warm, as
spark-tensorflow-distributor runs it, else on Ray Train."""

from __future__ import annotations

import json
import random
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


def _strategy_rank(fn: Callable[..., Any], kwargs: dict[str, Any], custom: bool) -> Callable[[], Any]:
    """One rank of a run in Spark's tasks: Keras 2 under both names, as a Ray
    Train worker of :class:`~raydist.train.tensorflow.TensorflowTrainer` has."""
    def run() -> Any:
        from raydist.train.runtime import use_keras2_everywhere

        use_keras2_everywhere()
        return _run_program(fn, kwargs, custom)

    return run


def _tf_config(peers: list[str], rank: int) -> dict[str, str]:
    """``TF_CONFIG`` of ``rank`` among ``peers``: what
    ``MultiWorkerMirroredStrategy()`` reads to span them."""
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": list(peers)}, "task": {"type": "worker", "index": rank}})}


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
        num_slots: GPUs in all when ``use_gpu`` (one worker per Spark task,
            each with its task's ``spark.task.resource.gpu.amount`` GPUs, as
            Spark's runs them), else CPU workers.
        local_mode: as in Spark: ``train_fn`` runs in this process (one CPU
            slot, or up to this machine's GPUs).
        use_gpu: train on GPUs.
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
        from raydist.train.runtime import tracked_run

        if not callable(train_fn):
            raise TrainingConfigError("train_fn", train_fn, "expected a function")
        # The driver's MLflow context reaches every worker (raydist.train.mlflow);
        # in local mode train_fn runs here, in the driver's own.
        with tracked_run(type(self).__name__, self.num_slots, self.use_gpu) as mlflow:
            if self.local_mode:
                return self._run_here(train_fn, kwargs)
            self.last_result = None
            spark = self._spark_for_run()
            if spark is not None:
                return self._run_in_spark_tasks(spark, train_fn, kwargs, mlflow)
            return self._run_on_ray(train_fn, kwargs)

    def _needs_ray(self) -> bool:
        """Whether only Ray serves this run: a cluster named, lost workers to
        survive, or GPUs (spark-tensorflow-distributor gives each worker its
        whole task's GPUs; a rank in Spark's tasks here sees one)."""
        return self.cluster is not None or self.max_failures != 0 or self.use_gpu

    def _spark_for_run(self) -> Any:
        """The SparkSession whose tasks run this run, or None: Ray runs it
        (:meth:`_needs_ray`, or a warm session cluster:
        :func:`~raydist.train.session_rules.where_to_run`)."""
        from raydist.train.runtime import training_session

        return training_session().spark_for_run(ranks=self.num_slots, needs_ray=self._needs_ray())

    def _run_in_spark_tasks(self, spark: Any, train_fn: Callable[..., Any], kwargs: dict[str, Any],
                            mlflow: Any) -> Any:
        """One barrier stage of ``spark``'s tasks, a rank each, with
        ``TF_CONFIG`` naming every rank. Nothing warms up after it: a
        TensorFlow run has no warm workers to reuse, so the next one is
        quicker in Spark's tasks too."""
        from raydist.train.runtime import keyboard_interrupts, run_in_spark_tasks, run_shape, training_session
        from raydist.train.tensorflow import KERAS_ENV

        job = _strategy_rank(train_fn, kwargs, self.use_custom_strategy)
        resources = {"CPU": 1.0}
        session = training_session()
        with keyboard_interrupts(), session.spark_tasks_run(run_shape(self.num_slots, resources, False), resources,
                                                            warm_workers=False, keep_warm_s=0.0, spark=spark):
            return run_in_spark_tasks(mlflow.wrap(job) if mlflow is not None else job, spark=spark,
                                      ranks=self.num_slots, env=KERAS_ENV, peers_env=_tf_config,
                                      preload=(),  # its ranks import TensorFlow, not torch
                                      description=f"raydist: {type(self).__name__}'s ranks")

    def _run_on_ray(self, train_fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        from ray.train import FailureConfig

        from raydist.train.runtime import gpu_run_shape, spark_task_resources
        from raydist.train.tensorflow import TensorflowTrainer

        workers, resources = self.num_slots, {"CPU": 1.0}
        if self.use_gpu:
            # As Spark's: one worker per Spark task, with that task's GPUs
            # (spark.task.resource.gpu.amount), num_slots GPUs in all.
            task_cpus, task_gpus = spark_task_resources()
            shape, _ = gpu_run_shape(self.num_slots, task_cpus, task_gpus)
            workers, resources = shape.workers, {"CPU": float(shape.cpus), "GPU": float(shape.gpus)}
        trainer = TensorflowTrainer(
            _strategy_worker(train_fn, kwargs, self.use_custom_strategy),
            workers=workers,
            use_gpu=self.use_gpu,
            resources_per_worker=resources,
            failure_config=FailureConfig(max_failures=self.max_failures),
            cluster=self.cluster,
        )
        try:
            return trainer.run()
        finally:
            self.last_result = trainer.last_result

    def _run_here(self, train_fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """Spark's local mode: this process, CPU only unless ``use_gpu``; with
        ``use_gpu``, ``num_slots`` of the driver's GPUs picked at random, as
        Spark's picks them (this process's own where Spark gave the driver none)."""
        from raydist.train.runtime import driver_gpus, scoped_env

        env = {"CUDA_VISIBLE_DEVICES": ""}
        if self.use_gpu:
            owned = driver_gpus()
            env = {}
            if owned is not None:
                if self.num_slots > len(owned):
                    raise TrainingConfigError("num_slots", self.num_slots,
                                              f"local mode has the driver's {len(owned)} GPUs: use at most that many")
                env = {"CUDA_VISIBLE_DEVICES": ",".join(random.sample(owned, self.num_slots))}
        with scoped_env(env):
            return _run_program(train_fn, kwargs, self.use_custom_strategy)
