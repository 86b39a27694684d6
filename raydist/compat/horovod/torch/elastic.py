"""``horovod.torch.elastic`` is not supported: Ray Train replaces lost
workers itself. Every name here raises NotImplementedError saying so."""

from __future__ import annotations

from typing import Any

from raydist.compat.horovod.torch._basics import unsupported


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise unsupported(f"horovod.torch.elastic.{name}",
                      "run the function with HorovodRunner(np=N, max_failures=K): lost workers are replaced "
                      "and the function starts again")
