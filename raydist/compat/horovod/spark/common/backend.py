"""[Experimental] ``horovod.spark.common.backend.SparkBackend``: how many
processes an estimator trains with.

Horovod's examples build one as ``SparkBackend(num_proc=..., stdout=sys.stdout,
stderr=sys.stderr, prefix_output_with_timestamp=True)`` and hand it to an
estimator. Here the processes are ranks on raydist's session cluster (warm
between fits), whose output reaches the driver as any run's does, so the
stream and formatting arguments are taken and have nothing to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raydist.errors import TrainingConfigError

__all__ = ["Backend", "SparkBackend"]


class Backend:
    """What an estimator asks of a backend (Horovod's base class)."""

    def num_processes(self) -> int:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """Environment every training process gets beside torchrun's."""
        return {}


class SparkBackend(Backend):
    """Horovod's ``SparkBackend``: ``num_proc`` training processes (default:
    Spark's default parallelism, as Horovod's), each with ``env`` set.

    ``stdout``, ``stderr``, ``verbose``, ``prefix_output_with_timestamp``,
    ``nics``, ``start_timeout`` and ``use_mpi``/``use_gloo`` are Horovod's
    launcher settings: accepted (``use_mpi=True`` is refused: there is no MPI
    here, the ranks talk over torch.distributed)."""

    def __init__(self, num_proc: int | None = None, env: Mapping[str, str] | None = None, *,
                 stdout: Any = None, stderr: Any = None, verbose: int = 1, nics: Any = None,
                 prefix_output_with_timestamp: bool = False, start_timeout: float | None = None,
                 use_mpi: bool | None = None, use_gloo: bool | None = None, **_launcher: Any) -> None:
        if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
            raise TrainingConfigError("num_proc", num_proc, "expected a whole number of at least 1")
        if use_mpi:
            raise TrainingConfigError("use_mpi", use_mpi, "raydist runs Horovod code over torch.distributed "
                                                          "(gloo/NCCL), not MPI: leave use_mpi out")
        self._num_proc = num_proc
        self._env = dict(env or {})
        self.stdout, self.stderr, self.verbose = stdout, stderr, verbose
        self.prefix_output_with_timestamp = prefix_output_with_timestamp

    def num_processes(self) -> int:
        if self._num_proc is None:
            from raydist.compat.horovod.spark import _default_parallelism

            self._num_proc = _default_parallelism()
        return self._num_proc

    def env(self) -> dict[str, str]:
        return dict(self._env)
