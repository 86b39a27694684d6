"""[Experimental] Drop-in classes shaped like Spark's own distributors.

Each keeps the exact constructor and ``run`` signature of the Spark class it
replaces, and runs the same training function on a raydist cluster through
Ray Train instead of through Spark barrier tasks: it gains retries on worker
loss and worker logs streamed to the caller. Where an argument cannot mean
the same thing on Ray, the class says so in its docstring or raises.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TorchDistributor", "DeepspeedTorchDistributor", "MirroredStrategyRunner", "HorovodRunner",
           "deepspeed_config"]

_WHERE = {
    "TorchDistributor": "raydist.compat.torch_distributor",
    "DeepspeedTorchDistributor": "raydist.compat.deepspeed_distributor",
    "deepspeed_config": "raydist.compat.deepspeed_distributor",
    "MirroredStrategyRunner": "raydist.compat.mirrored_strategy",
    "HorovodRunner": "raydist.compat.horovod_runner",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'raydist.compat' has no attribute {name!r}")
