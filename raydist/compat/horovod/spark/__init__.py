"""[Experimental] ``horovod.spark.run``, on raydist's default path."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raydist.errors import TrainingConfigError
from raydist.train.runtime import DEFAULT_KEEP_WARM_S

__all__ = ["run"]


def run(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    start_timeout: float | None = None,
    use_mpi: bool | None = None,
    use_gloo: bool | None = None,
    extra_mpi_args: str | None = None,
    env: Mapping[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Any = None,
    prefix_output_with_timestamp: bool = False,
    executable: str | None = None,
    *,
    cluster: Any = None,
    use_gpu: bool = False,
    max_failures: int = 0,
    keep_warm_s: float = DEFAULT_KEEP_WARM_S,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` in ``num_proc`` processes and return every
    rank's result, in rank order, as ``horovod.spark.run`` does.

    The processes are Ray Train workers of the session cluster (or
    ``cluster``), kept warm between runs as :class:`raydist.compat.TorchDistributor`'s
    are, with torchrun's environment plus ``env``; ``import horovod.torch``
    resolves to :mod:`raydist.compat.horovod.torch` in them. ``num_proc``
    defaults to Spark's default parallelism, as in Horovod. MPI, NIC and
    output-stream arguments have no meaning here and are ignored
    (``use_mpi=True`` is refused: there is no MPI). An error in any rank is
    raised here with its message.

    Besides Horovod's arguments: ``cluster``, ``use_gpu``, ``max_failures``
    and ``keep_warm_s``, as :class:`~raydist.compat.TorchDistributor` takes them.
    """
    from raydist.compat.horovod._job import horovod_job
    from raydist.compat.torch_distributor import TorchDistributor

    if use_mpi:
        raise TrainingConfigError("use_mpi", use_mpi, "raydist runs Horovod code over torch.distributed (gloo/NCCL), "
                                                      "not MPI: leave use_mpi out")
    if num_proc is None:
        num_proc = _default_parallelism()
    runner = TorchDistributor(num_processes=num_proc, local_mode=False, use_gpu=use_gpu, cluster=cluster,
                              max_failures=max_failures, keep_warm_s=keep_warm_s)
    return runner._fit(horovod_job(fn, tuple(args), dict(kwargs or {}), env=env, every_rank=True),
                       kind="horovod.spark.run")


def _default_parallelism() -> int:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    try:
        return int(spark.sparkContext.defaultParallelism) if spark is not None else 0
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
        pass
    raise TrainingConfigError("num_proc", None, "give num_proc: there is no classic SparkSession to take "
                                                "Spark's default parallelism from")
