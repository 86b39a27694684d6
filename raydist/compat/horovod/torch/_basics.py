"""Horovod's process model on ``torch.distributed``: init, ranks, sizes.

A Horovod process learns its place from ``horovodrun``; a raydist worker
learns it from torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``),
which every raydist runner sets (:mod:`raydist.train._layout`). ``init``
makes the global process group from it (gloo; NCCL for CUDA tensors when
the process sees a GPU), or a group of one when there is none: a script run
with plain ``python`` works, as under Horovod without ``horovodrun``.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "ProcessSet", "add_process_set", "cross_rank",
    "cross_size", "global_process_set", "init", "is_initialized", "local_rank", "local_size", "rank",
    "remove_process_set", "shutdown", "size", "unsupported",
]

#: Reduction ops, as Horovod names them.
Average, Sum, Adasum, Min, Max, Product = "Average", "Sum", "Adasum", "Min", "Max", "Product"

_initialized_here = False  # whether init() made the group (shutdown() then ends it)
_held = False  # a runner keeps the group past the function's shutdown() (to gather results)


def unsupported(what: str, instead: str) -> NotImplementedError:
    """The error for a Horovod feature raydist does not map, naming what to use."""
    return NotImplementedError(f"{what} is not supported by raydist.compat.horovod; {instead}")


class ProcessSet:
    """Horovod's process sets: only the global one (every rank) is supported."""

    def __init__(self, ranks: Any = None) -> None:
        if ranks is not None:
            raise unsupported("a process set other than the global one", "use the global set (leave process_set out)")

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet()


def add_process_set(process_set: Any) -> ProcessSet:
    raise unsupported("hvd.add_process_set", "use the global set (leave process_set out)")


def remove_process_set(process_set: Any) -> bool:
    raise unsupported("hvd.remove_process_set", "use the global set (leave process_set out)")


def check_process_set(process_set: Any) -> None:
    if process_set is not None and process_set is not global_process_set:
        raise unsupported("a process set other than the global one", "use hvd.global_process_set")


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job's process group (idempotent)."""
    import torch
    import torch.distributed as dist

    global _initialized_here
    if comm is not None:
        raise unsupported("hvd.init(comm=...)", "call hvd.init() with no arguments")
    if process_sets not in (None, [], ()):
        raise unsupported("hvd.init(process_sets=...)", "call hvd.init() with no arguments")
    if dist.is_initialized():
        return
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        # Run on its own (no runner): a job of one, as Horovod is without horovodrun.
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in env:
            from raydist.engine.ports import free_port

            env["MASTER_PORT"] = str(free_port("127.0.0.1"))  # outside Ray's worker ports, as every port we pick
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, init_method="env://")
    _initialized_here = True


def held_by_runner(held: bool) -> None:
    """While held, :func:`shutdown` leaves the group up (the runner ends it)."""
    global _held
    _held = held


def shutdown() -> None:
    """Leave the process group that :func:`init` made, once every rank has
    come to leave it, as Horovod's shutdown is agreed by all ranks: rank 0
    holds the group's rendezvous store, and a rank 0 gone early would leave
    ranks still joining with nobody to join."""
    import torch.distributed as dist

    global _initialized_here
    if _held:
        return
    if _initialized_here and dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
    _initialized_here = False


def is_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_initialized()


def _need_init() -> None:
    if not is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")


def size() -> int:
    """How many processes the job has."""
    import torch.distributed as dist

    _need_init()
    return dist.get_world_size()


def rank() -> int:
    """This process's rank, 0 to ``size() - 1``."""
    import torch.distributed as dist

    _need_init()
    return dist.get_rank()


def local_size() -> int:
    """How many of the job's processes share this one's node: its Spark
    task, and so its GPUs (``LOCAL_WORLD_SIZE``)."""
    _need_init()
    return int(os.environ.get("LOCAL_WORLD_SIZE", size()))


def local_rank() -> int:
    """This process's rank among those sharing its node (``LOCAL_RANK``):
    it indexes the process's own device in ``CUDA_VISIBLE_DEVICES``, so
    ``torch.cuda.set_device(hvd.local_rank())`` works as under Horovod."""
    _need_init()
    return int(os.environ.get("LOCAL_RANK", rank()))


def cross_size() -> int:
    """How many hosts the job spans (each with ``local_size()`` processes)."""
    return max(1, size() // max(1, local_size()))


def cross_rank() -> int:
    """This host's index among the job's hosts."""
    return int(os.environ.get("NODE_RANK", rank() // max(1, local_size())))
