"""What a run asks of the session cluster, read from its arguments and from
Spark's task settings: the shape of nodes it needs, each Spark task's CPUs
and GPUs, the driver's own GPUs, and a clear error for a request that cannot
be met."""

from __future__ import annotations

import os
from collections.abc import Mapping

from raydist.engine.spark.side import is_connect
from raydist.errors import TrainingConfigError
from raydist.train.session_rules import Shape, gpu_run_shape

__all__ = ["check_resources", "driver_gpus", "run_shape", "spark_task_resources"]


def run_shape(workers: int, resources_per_worker: Mapping[str, float], use_gpu: bool) -> Shape:
    """The session cluster a run of ``workers`` workers, each taking
    ``resources_per_worker``, asks for: for GPU workers of one GPU that fit
    their share of a Spark task, one node per task of
    ``spark.task.resource.gpu.amount`` GPUs (pyspark's GPU layout, see
    :func:`~raydist.train.session_rules.gpu_run_shape`); else one node per
    worker, of the worker's CPUs and GPUs."""
    cpus = float(resources_per_worker.get("CPU", 1) or 0)
    gpus = float(resources_per_worker.get("GPU", 1) or 1) if use_gpu else 0.0
    if gpus == 1:
        shape, per_rank = gpu_run_shape(workers, *spark_task_resources())
        if cpus <= per_rank["CPU"]:
            return shape
    return Shape(workers, int(cpus), int(gpus))


def spark_task_resources() -> tuple[int, int]:
    """(CPUs, GPUs) of one Spark task on the active SparkSession, as
    ``spark.task.cpus`` and ``spark.task.resource.gpu.amount`` say: what
    pyspark's distributors give each task of a run. Unset (or no session
    yet): one CPU, one GPU. A fractional GPU amount counts as one."""
    from raydist.engine.spark import session as spark_side
    from raydist.engine.spark.sides import side_of

    spark = spark_side.active_session()

    def amount(key: str) -> int:
        text = side_of(spark).conf(key) if spark is not None else None
        if not text:
            return 1
        try:
            return max(1, int(float(text)))
        except ValueError:
            raise TrainingConfigError(key, text, "expected a number of CPUs or GPUs per Spark task") from None

    return amount("spark.task.cpus"), amount("spark.task.resource.gpu.amount")


def spark_gives_tasks_gpus() -> bool:
    """Whether the active SparkSession hands its tasks GPUs
    (``spark.task.resource.gpu.amount`` set above 0): a GPU run in Spark's
    own tasks needs it, as pyspark's does; executors with GPUs and no task
    amount are served on Ray, whose nodes take the executors' GPUs."""
    from raydist.engine.spark import session as spark_side
    from raydist.engine.spark.sides import side_of

    spark = spark_side.active_session()
    text = side_of(spark).conf("spark.task.resource.gpu.amount") if spark is not None else None
    try:
        return float(text or 0) > 0
    except ValueError:
        return False


def driver_gpus() -> list[str] | None:
    """The GPUs Spark gave the driver of the active classic SparkSession
    (``spark.driver.resource.gpu.*``), as CUDA device ids of this process
    (mapped through its own ``CUDA_VISIBLE_DEVICES``, as pyspark's
    ``_get_gpus_owned`` does); None where there is no such session or it
    has no GPU resource (a Spark Connect client sees only its own devices)."""
    from raydist.engine.sizing import visible_gpus
    from raydist.engine.spark import session as spark_side

    spark = spark_side.active_session()
    if spark is None or is_connect(spark):
        return None
    gpu = spark.sparkContext.resources.get("gpu")
    if gpu is None:
        return None
    return visible_gpus(list(gpu.addresses), os.environ.get("CUDA_VISIBLE_DEVICES"))


def check_resources(workers: int, cpus_per_worker: float, use_gpu: bool) -> None:
    """Fail before any training when the cluster can never host the workers."""
    import ray

    total = ray.cluster_resources()
    if use_gpu and total.get("GPU", 0) < workers:
        raise TrainingConfigError(
            "use_gpu",
            True,
            f"the cluster has {total.get('GPU', 0):g} GPUs for {workers} workers; "
            "start it with gpus_per_worker=1 or train with use_gpu=False",
        )
    if total.get("CPU", 0) < workers * cpus_per_worker:
        raise TrainingConfigError(
            "workers",
            workers,
            f"the cluster has {total.get('CPU', 0):g} CPUs, fewer than {workers} workers x "
            f"{cpus_per_worker:g} CPU; use fewer workers or a bigger cluster",
        )
