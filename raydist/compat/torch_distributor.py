"""[Experimental] ``TorchDistributor`` with pyspark's signature, on Ray Train."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from typing import Any

from raydist.compat._jobs import ArgvJob, function_job, plain, script_job
from raydist.errors import TrainingConfigError
from raydist.train.runtime import DEFAULT_KEEP_WARM_S, FrameInputs, RankInputs

__all__ = ["TorchDistributor"]

log = logging.getLogger(__name__)


#: The most of the ranks' data (bytes, all ranks) that travels with a run in
#: Spark's tasks (every task gets the stage's closure); more goes to Ray.
SPARK_TASKS_INPUT_LIMIT = 32 << 20


def _small(inputs: RankInputs) -> bool:
    """Whether ``inputs`` are bytes small enough to travel with a Spark stage."""
    sizes = [len(v) if isinstance(v, (bytes, bytearray)) else None for v in inputs.values]
    return None not in sizes and sum(s for s in sizes if s is not None) <= SPARK_TASKS_INPUT_LIMIT


class TorchDistributor:
    """[Experimental] Drop-in for ``pyspark.ml.torch.distributor.TorchDistributor``.

    ``run(train_object, *args, **kwargs)`` runs ``train_object`` (a function
    or a script path) in ``num_processes`` processes, each set up as
    ``torchrun`` would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... so code
    that calls ``init_process_group`` itself works, and ``sys.argv`` as Spark
    sets it), and returns rank 0's return value (None for a script), as
    Spark's does. A failed script raises a RuntimeError, as Spark's does; a
    function's error is raised as itself, with the rank and the worker's
    traceback as a note.

    Where the processes run:
        local_mode=True (Spark's default): on this machine, as Spark runs
            them on the driver, but forked from one warm process that has
            imported torch (:mod:`raydist.train.local`) instead of started
            by torchrun: no Ray cluster at all, and a later run starts in a
            fraction of a second.
        local_mode=False: on Ray Train workers of a raydist cluster:
            ``cluster`` if given, else the Ray cluster this process is
            connected to, ``RAY_ADDRESS``, else the session cluster on the
            active SparkSession, started on first use and kept warm
            (:mod:`raydist.train.session`). Runs keep their Ray Train
            workers warm too (:mod:`raydist.train.warm_run`): the next run
            forks each worker instead of starting new processes (a GPU
            worker never touches CUDA itself, so each forked job starts
            CUDA afresh).

    GPUs (``use_gpu=True``), as pyspark gives them: each process sees the
    GPUs Spark gave its task in ``CUDA_VISIBLE_DEVICES`` (mapped through an
    executor's own ``CUDA_VISIBLE_DEVICES``), one process per GPU of a task
    (``spark.task.resource.gpu.amount``, default 1), ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE`` count the processes of that task, so
    ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` picks the
    process's own device; no process group exists before the function makes
    one. In local mode the processes share ``num_processes`` of the driver's
    GPUs picked at random, as in pyspark (at most one process per GPU).

    Besides Spark's arguments:
        cluster: the raydist cluster (a handle or name) for local_mode=False.
        max_failures: how many lost workers a run on Ray survives; the
            workers are replaced and the function starts again (Spark fails
            the run).
        keep_warm_s: how long the warm processes (and the session cluster
            under them) stay up after a run. ``0`` starts new processes for
            every run.
    """

    #: Whether runs on Ray may reuse warm workers at all (DeepSpeed's may not).
    _warm_capable = True

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        *,
        cluster: Any = None,
        max_failures: int = 0,
        keep_warm_s: float = DEFAULT_KEEP_WARM_S,
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
        own; None for a local run or a run on warm workers."""
        self._train_object: Any = None

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        return self._fit(plain(self._job(train_object, args, kwargs)))

    def _train_on_dataframe(self, train_function: Callable[..., Any], spark_dataframe: Any, *args: Any,
                            **kwargs: Any) -> Any:
        """pyspark's ``TorchDistributor._train_on_dataframe`` (what
        ``pyspark.ml.connect``'s estimators train through): rank ``i`` runs
        ``train_function(*args, **kwargs)`` with partition ``i`` of
        ``spark_dataframe`` in the files pyspark names in
        ``SPARK_PARTITION_ARROW_DATA_FILE`` and ``SPARK_DATAFRAME_SCHEMA_FILE``
        (read them with pyspark's ``_get_spark_partition_data_loader``);
        rank 0's return value. As in pyspark, the DataFrame must have
        ``num_processes`` partitions, none empty, and ``local_mode`` must be
        False (each a ValueError with pyspark's message).

        A run in Spark's tasks runs over the DataFrame itself, as pyspark's
        does: each task writes the partition Spark computed there, and no row
        passes through this process. A run on the warm session cluster reads
        the partitions in one Spark job before it takes its slots, and each
        reaches its rank through Ray's object store
        (:mod:`raydist.compat._dataframe`)."""
        from raydist.compat._dataframe import frame_inputs

        if self.local_mode:
            raise ValueError(
                "TorchDistributor.train_on_dataframe requires setting TorchDistributor.local_mode to False."
            )
        if not callable(train_function):
            raise TrainingConfigError("train_function", train_function, "expected a function, as in pyspark")
        inputs = frame_inputs(spark_dataframe, self.num_processes)
        return self._fit(plain(self._job(train_function, args, kwargs)), inputs)

    def _job(self, train_object: Callable[..., Any] | str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ArgvJob:
        """Check ``run``'s input; the job each process runs."""
        self._train_object = train_object
        if isinstance(train_object, str):
            if not os.path.isfile(train_object):
                raise TrainingConfigError("train_object", train_object, "no such training script")
            if kwargs:
                raise TrainingConfigError(
                    "kwargs", sorted(kwargs), "a script takes positional command-line arguments only, as in pyspark"
                )
            return script_job(os.path.abspath(train_object), args)
        if callable(train_object):
            return function_job(train_object, args, kwargs)
        raise TrainingConfigError("train_object", train_object, "expected a function or a script path")

    def _fit(self, job: Callable[[], Any], inputs: RankInputs | FrameInputs | None = None, kind: str = "") -> Any:
        """Run ``job()`` in every process with torchrun's environment set
        (and its own of ``inputs``, on Ray); rank 0's return value. Every
        process gets the driver's MLflow context (:mod:`raydist.train._mlflow`);
        ``kind`` names the run in it (default: this class's name)."""
        from raydist.train.runtime import keyboard_interrupts, tracked_run

        with keyboard_interrupts(), tracked_run(kind or type(self).__name__, self.num_processes,
                                                self.use_gpu) as mlflow:
            return self._fit_where(mlflow.wrap(job) if mlflow is not None else job, inputs)

    def _fit_where(self, job: Callable[[], Any], inputs: RankInputs | FrameInputs | None = None) -> Any:
        from raydist.train.runtime import training_session

        session = training_session()
        self.last_result = None
        if self.local_mode:
            local = session.local_run(self.keep_warm_s)
            try:
                return local.run(job, *self._local_layout())
            finally:
                if self.keep_warm_s == 0:
                    local.close()
        resources = self._rank_resources()
        from raydist.train.runtime import spark_gives_tasks_gpus

        per_task = self._ranks_per_task()
        if isinstance(inputs, FrameInputs) and per_task != 1:
            inputs = inputs.collect()  # a Spark task's one partition cannot feed its several ranks
        # GPUs Spark hands no task (no spark.task.resource.gpu.amount, where
        # pyspark's run fails): Ray's nodes take the executors' GPUs.
        needs_ray = self._needs_ray(inputs) or (self.use_gpu and not spark_gives_tasks_gpus())
        spark = session.spark_for_run(ranks=self.num_processes, needs_ray=needs_ray, per_task=per_task,
                                      use_gpu=self.use_gpu)
        if spark is not None:
            return self._fit_in_spark_tasks(session, spark, job, resources, inputs, per_task)
        if isinstance(inputs, FrameInputs):
            inputs = inputs.collect()  # on Ray: through the object store
        if self._warm_capable and self.keep_warm_s > 0:
            return self._fit_warm(session, job, resources, inputs)
        return self._fit_fresh(job, resources, inputs)

    def _needs_ray(self, inputs: RankInputs | FrameInputs | None) -> bool:
        """Whether only Ray serves this run: a cluster named, lost workers to
        survive, or ranks' data too big to travel with a Spark stage (it goes
        through Ray's object store; a DataFrame's stays in Spark's tasks)."""
        big = isinstance(inputs, RankInputs) and not _small(inputs)
        return self.cluster is not None or self.max_failures != 0 or big

    def _ranks_per_task(self) -> int:
        """A run's ranks to one Spark task, as pyspark lays them out: one a
        task on CPU; on GPU one a task's GPU (``spark.task.resource.gpu.amount``),
        each rank's ``LOCAL_RANK`` indexing its task's ``CUDA_VISIBLE_DEVICES``."""
        from raydist.train.runtime import spark_task_resources

        return spark_task_resources()[1] if self.use_gpu else 1

    def _fit_in_spark_tasks(self, session: Any, spark: Any, job: Callable[[], Any],
                            resources: dict[str, float], inputs: RankInputs | FrameInputs | None,
                            per_task: int) -> Any:
        """The run in one barrier stage of ``spark``'s tasks, as pyspark's
        own runs it; the session cluster warms up for the next run when runs
        pause (:mod:`raydist.train.session_spark_runs`)."""
        from raydist.train.runtime import run_in_spark_tasks, run_shape

        want = run_shape(self.num_processes, resources, self.use_gpu)
        with session.spark_tasks_run(want, resources, warm_workers=self._warm_capable,
                                     keep_warm_s=self.keep_warm_s, spark=spark):
            return run_in_spark_tasks(job, spark=spark, ranks=self.num_processes, per_task=per_task,
                                      use_gpu=self.use_gpu, inputs=inputs,
                                      description=f"raydist: {type(self).__name__}'s ranks")

    def _rank_resources(self) -> dict[str, float]:
        """What each process of a run on Ray takes of its node: one CPU, or
        for a GPU run, as pyspark lays one out, one GPU and its share of its
        Spark task's CPUs, ``spark.task.resource.gpu.amount`` processes a
        task (the session cluster then has one node per task)."""
        from raydist.train.runtime import gpu_run_shape, spark_task_resources

        if not self.use_gpu:
            return {"CPU": 1.0}
        task_cpus, task_gpus = spark_task_resources()
        if self.num_processes % task_gpus:
            raise TrainingConfigError(
                "num_processes", self.num_processes,
                f"must be a multiple of spark.task.resource.gpu.amount ({task_gpus}), as in pyspark",
            )
        return gpu_run_shape(self.num_processes, task_cpus, task_gpus)[1]

    def _local_layout(self) -> tuple[int, dict[str, str] | None]:
        """How many local processes, and their ``CUDA_VISIBLE_DEVICES``
        (None: this process's own, where Spark gave the driver no GPUs or
        the run is on CPU). As pyspark's local mode: at most one process per
        driver GPU (with pyspark's warning), ``num_processes`` of the
        driver's GPUs picked at random (seeded by the training object), so
        ``LOCAL_RANK`` indexes them."""
        from raydist.train.runtime import driver_gpus

        gpus = driver_gpus() if self.use_gpu else None
        if gpus is None:
            return self.num_processes, None
        processes = self.num_processes
        if processes > len(gpus):
            log.warning(
                "'num_processes' cannot be set to a value greater than the number of available GPUs on the "
                "driver, which is %d. 'num_processes' was reset to be equal to the number of available GPUs.",
                len(gpus),
            )
            processes = len(gpus)
        rng = random.Random(hash(self._train_object))
        return processes, {"CUDA_VISIBLE_DEVICES": ",".join(rng.sample(gpus, processes))}

    def _fit_warm(self, session: Any, job: Callable[[], Any], resources: dict[str, float],
                  inputs: RankInputs | None) -> Any:
        with session.connected(
            self.cluster, workers=self.num_processes, resources_per_worker=resources, use_gpu=self.use_gpu,
            keep_warm_s=self.keep_warm_s,
        ) as handle:
            return session.warm_runs.run(
                job,
                workers=self.num_processes,
                resources_per_worker=resources,
                use_gpu=self.use_gpu,
                max_failures=self.max_failures,
                keep_warm_s=self.keep_warm_s,
                raydist_cluster=handle is not None,
                inputs=inputs,
            )

    def _fit_fresh(self, job: Callable[[], Any], resources: dict[str, float], inputs: RankInputs | None) -> Any:
        from raydist.train.runtime import TorchrunTrainer

        trainer = TorchrunTrainer(
            job,
            workers=self.num_processes,
            use_gpu=self.use_gpu,
            resources_per_worker=resources,
            max_failures=self.max_failures,
            cluster=self.cluster,
            keep_warm_s=self.keep_warm_s,
            inputs=inputs,
        )
        try:
            return trainer.run()
        finally:
            self.last_result = trainer.last_result
