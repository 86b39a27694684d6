"""What a Horovod runner runs in each process: the alias on, the job's
process group made first (so every rank's result can be gathered at the
end, whatever the function did with ``hvd.shutdown``), the function, and
the results."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["horovod_job"]


def horovod_job(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
                env: Mapping[str, str] | None = None, every_rank: bool = False) -> Callable[[], Any]:
    """``fn(*args, **kwargs)`` as a Horovod process runs it; rank 0 returns
    its own result, or with ``every_rank`` the list of every rank's, in rank order."""

    def run() -> Any:
        from raydist.compat.horovod._alias import use_horovod_alias
        from raydist.compat.horovod.torch import _basics, _ops
        from raydist.train.runtime import scoped_env

        with scoped_env({str(k): str(v) for k, v in (env or {}).items()}):
            use_horovod_alias()
            _basics.init()
            _basics.held_by_runner(True)  # the function's hvd.shutdown() leaves it for the results
            try:
                result = fn(*args, **kwargs)
                return _ops.allgather_object(result) if every_rank else result
            finally:
                _basics.held_by_runner(False)
                _basics.shutdown()

    return run
