"""[Experimental] Horovod's PyTorch API on ``torch.distributed``: ``import
raydist.compat.horovod.torch as hvd``, with nothing to compile.

The surface Horovod's own PyTorch examples and docs use, with Horovod's
semantics: ``init`` and the ranks and sizes; ``allreduce`` (``Average`` by
default), ``allgather`` (first dimensions may differ), ``broadcast``,
``alltoall``, ``reducescatter``, ``barrier``, ``join``, in place (``_``) and
async (``_async``, with ``synchronize`` / ``poll``); ``broadcast_parameters``,
``broadcast_optimizer_state``, ``broadcast_object``, ``allgather_object``;
``DistributedOptimizer``, ``Compression``, ``SyncBatchNorm``. Adasum,
process sets other than the global one and ``horovod.torch.elastic`` raise
NotImplementedError naming what to use instead.

Run it with :class:`raydist.compat.HorovodRunner` or
:func:`raydist.compat.horovod.spark.run` (which also let ``import
horovod.torch as hvd`` resolve here), or under any runner that sets
torchrun's environment; alone, it is a job of one.
"""

from __future__ import annotations

from typing import Any

from raydist.compat.horovod.torch import elastic
from raydist.compat.horovod.torch._basics import (
    Adasum,
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    cross_rank,
    cross_size,
    global_process_set,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
)
from raydist.compat.horovod.torch._ops import (
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    join,
    poll,
    reducescatter,
    synchronize,
)
from raydist.compat.horovod.torch._optimizer import (
    Compression,
    DistributedOptimizer,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "Max", "Min", "ProcessSet", "Product", "Sum",
    "SyncBatchNorm", "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "cross_rank", "cross_size", "elastic", "global_process_set", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "init", "is_initialized", "join",
    "local_rank", "local_size", "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "remove_process_set", "shutdown", "size", "synchronize",
]


def nccl_built() -> bool:
    """Whether CUDA collectives are available (torch's NCCL)."""
    import torch.distributed as dist

    return dist.is_nccl_available()


def mpi_threads_supported() -> bool:
    """No MPI here: False."""
    return False


def __getattr__(name: str) -> Any:
    if name == "SyncBatchNorm":
        from raydist.compat.horovod.torch import _sync_bn

        return _sync_bn.SyncBatchNorm
    raise AttributeError(f"module 'horovod.torch' has no attribute {name!r} in raydist.compat.horovod")
