"""[Experimental] ``HorovodRunner`` with sparkdl's signature, on raydist."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raydist.errors import TrainingConfigError
from raydist.train.runtime import DEFAULT_KEEP_WARM_S

__all__ = ["HorovodRunner"]


class HorovodRunner:
    """[Experimental] Drop-in for ``sparkdl.HorovodRunner``.

    ``HorovodRunner(np=N).run(main, **kwargs)`` runs ``main(**kwargs)`` in
    ``N`` processes and returns rank 0's return value, as sparkdl's does:
    ``np > 0`` on the cluster (Ray Train workers of the session cluster, or
    ``cluster``, kept warm between runs), ``np < 0`` in ``-np`` processes on
    this machine (forked from one warm process, no Ray). In each process
    ``import horovod.torch as hvd`` resolves to
    :mod:`raydist.compat.horovod.torch`. An error in any rank is raised here
    with its message.

    Besides sparkdl's arguments: ``cluster``, ``use_gpu`` (sparkdl takes the
    GPUs a GPU cluster has; say ``use_gpu=True`` here), ``max_failures`` and
    ``keep_warm_s``, as :class:`~raydist.compat.TorchDistributor` takes them.
    ``driver_log_verbosity`` is accepted: every rank's output streams to the
    caller as Ray Train's does.
    """

    def __init__(self, np: int, driver_log_verbosity: str = "all", *, cluster: Any = None, use_gpu: bool = False,
                 max_failures: int = 0, keep_warm_s: float = DEFAULT_KEEP_WARM_S) -> None:
        if isinstance(np, bool) or not isinstance(np, int) or np == 0:
            raise TrainingConfigError("np", np, "expected a whole number: N > 0 processes on the cluster, "
                                                "-N to run N processes on this machine")
        if driver_log_verbosity not in ("all", "log_callback_only"):
            raise TrainingConfigError("driver_log_verbosity", driver_log_verbosity,
                                      "expected 'all' or 'log_callback_only'")
        self.num_processor = np
        self.driver_log_verbosity = driver_log_verbosity
        self._options = {"cluster": cluster, "use_gpu": use_gpu, "max_failures": max_failures,
                         "keep_warm_s": keep_warm_s}

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """``main(**kwargs)`` in every process; rank 0's return value."""
        from raydist.compat.horovod._job import horovod_job
        from raydist.compat.torch_distributor import TorchDistributor

        if not callable(main):
            raise TrainingConfigError("main", main, "expected a function")
        runner = TorchDistributor(num_processes=abs(self.num_processor), local_mode=self.num_processor < 0,
                                  **self._options)
        return runner._fit(horovod_job(main, (), kwargs), kind=type(self).__name__)
