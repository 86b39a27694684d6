"""Horovod's collectives on ``torch.distributed``, with Horovod's semantics.

Each op comes as Horovod has it: out of place (``allreduce``), in place
(``allreduce_``), and asynchronous (``allreduce_async``, a handle for
:func:`synchronize` and :func:`poll`). ``name`` is accepted and unused:
``torch.distributed`` orders collectives by call order, as every rank
calls them in the same order in Horovod programs too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from raydist.compat.horovod.torch._basics import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    check_process_set,
    size,
    unsupported,
)

__all__ = [
    "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "join", "poll", "reducescatter", "synchronize",
]


class _Handle:
    """An op in flight: its ``torch.distributed`` works and what turns their
    buffers into the op's result once they are done."""

    def __init__(self, works: Sequence[Any], finish: Callable[[], Any]) -> None:
        self._works = list(works)
        self._finish = finish
        self._result: Any = None
        self._done = False

    def poll(self) -> bool:
        return all(w is None or w.is_completed() for w in self._works)

    def wait(self) -> Any:
        if not self._done:
            for work in self._works:
                if work is not None:
                    work.wait()
            self._result = self._finish()
            self._done = True
        return self._result


def synchronize(handle: _Handle) -> Any:
    """Wait for an async op; its result (the output tensor)."""
    return handle.wait()


def poll(handle: _Handle) -> bool:
    """Whether an async op is done (:func:`synchronize` then returns at once)."""
    return handle.poll()


def _reduce_op(op: Any, average: bool | None) -> str:
    if average is not None:
        if op is not None:
            raise ValueError("The op parameter supersedes average; give only one of them.")
        return Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise unsupported("op=hvd.Adasum", "use op=hvd.Average (the default) or hvd.Sum")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"op must be one of hvd.Average, Sum, Min, Max, Product (got {op!r})")
    return op


def _dist_op(op: str) -> Any:
    import torch.distributed as dist

    return {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX,
            Product: dist.ReduceOp.PRODUCT}[op]


def _scale(tensor: Any, factor: float) -> None:
    if factor != 1.0:
        if tensor.is_floating_point() or tensor.is_complex():
            tensor.mul_(factor)
        else:
            tensor.copy_((tensor * factor).to(tensor.dtype))


def _allreduce_into(buffers: list[Any], outputs: list[Any], op: Any, average: bool | None,
                    prescale_factor: float, postscale_factor: float, compression: Any,
                    process_set: Any, *, now: bool = False) -> _Handle:
    """Allreduce ``buffers`` and finish into ``outputs``; ``now``: before
    returning (a blocking call costs less than an async one and its wait:
    about 0.7 ms less a call here, measured on gloo)."""
    import torch
    import torch.distributed as dist

    check_process_set(process_set)
    kind = _reduce_op(op, average)
    if kind != Average and kind != Sum and (prescale_factor != 1.0 or postscale_factor != 1.0):
        raise ValueError("prescale_factor and postscale_factor are only for op=Average or op=Sum")
    sent, ctxs = [], []
    for buf in buffers:
        _scale(buf, prescale_factor)
        wire, ctx = compression.compress(buf) if compression is not None else (buf, None)
        sent.append(wire)
        ctxs.append(ctx)
    works = [dist.all_reduce(wire, op=_dist_op(kind), async_op=not now) for wire in sent]
    world = size()

    def finish() -> Any:
        for out, wire, ctx in zip(outputs, sent, ctxs, strict=True):
            got = compression.decompress(wire, ctx) if compression is not None else wire
            if kind == Average:
                if got.is_floating_point() or got.is_complex():
                    got.div_(world)  # our own buffer (or the decompressed copy of it)
                else:
                    got = torch.div(got, world, rounding_mode="floor")
            _scale(got, postscale_factor)
            if got is not out:
                out.copy_(got)
        return outputs[0] if len(outputs) == 1 else outputs

    return _Handle(works, finish)


#: Outputs at least this big come from :class:`_Recycled` (smaller ones are cheap to allocate).
_RECYCLE_MIN_BYTES = 1 << 20


class _Recycled:
    """Output buffers of out-of-place ops, used again once nothing else holds them.

    A new tensor of many megabytes is fresh memory from the kernel (glibc
    maps allocations past 32 MiB anew each time): every page of it faults
    on first write, which costs as much as the allreduce itself here. A
    buffer whose storage nothing but this pool holds any more (no tensor,
    no view) is handed out again instead. At most ``per_size`` buffers of a
    size and ``max_bytes`` in all are kept; the oldest go first.
    """

    def __init__(self, per_size: int = 2, max_bytes: int = 1 << 30) -> None:
        self._per_size, self._max_bytes = per_size, max_bytes
        self._kept: list[tuple[tuple[Any, ...], Any]] = []  # (key, storage), oldest first
        self._lock = threading.Lock()

    def empty_like(self, tensor: Any) -> Any:
        import torch

        nbytes = tensor.numel() * tensor.element_size()
        use_count = getattr(torch._C, "_storage_Use_Count", None)
        if nbytes < _RECYCLE_MIN_BYTES or use_count is None or tensor.device.type != "cpu":
            return torch.empty_like(tensor, memory_format=torch.contiguous_format)
        key = (nbytes, tensor.device)
        with self._lock:
            for i, (k, storage) in enumerate(self._kept):
                if k == key and use_count(storage._cdata) == 1:  # only this pool holds it
                    self._kept.append(self._kept.pop(i))
                    out = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
                    return out.set_(storage, 0, tensor.shape)
            out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            self._kept.append((key, out.untyped_storage()))
            same = [j for j, (k, _) in enumerate(self._kept) if k == key]
            if len(same) > self._per_size:
                del self._kept[same[0]]
            while sum(k[0] for k, _ in self._kept) > self._max_bytes:
                del self._kept[0]
            return out


_recycled = _Recycled()


def _copy_for(tensor: Any, op: Any, average: bool | None, prescale_factor: float,
              compression: Any = None) -> tuple[Any, Any, bool | None, float]:
    """The new tensor an out-of-place allreduce sends, and the op and
    prescale left to apply: a float average is a sum of copies already
    divided by the world size (one pass over the memory instead of two)."""
    import torch

    kind = _reduce_op(op, average)
    out = _recycled.empty_like(tensor)
    if kind == Average and compression is None and (tensor.is_floating_point() or tensor.is_complex()):
        torch.mul(tensor.detach(), prescale_factor / size(), out=out)
        return out, Sum, None, 1.0
    out.copy_(tensor.detach())
    return out, op, average, prescale_factor


def allreduce_async(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = None) -> _Handle:
    """Start an allreduce of ``tensor`` into a new tensor; see :func:`allreduce`."""
    out, op, average, prescale_factor = _copy_for(tensor, op, average, prescale_factor)
    return _allreduce_into([out], [out], op, average, prescale_factor, postscale_factor, None, process_set)


def allreduce_async_(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = None) -> _Handle:
    """Start an allreduce of ``tensor`` in place."""
    return _allreduce_into([tensor.data], [tensor.data], op, average, prescale_factor, postscale_factor, None,
                           process_set)


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, compression: Any = None,
              op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = None) -> Any:
    """``tensor`` reduced over every rank (by default averaged), as a new
    tensor; ``compression`` (``hvd.Compression.fp16``) shrinks what travels.
    Gradients flow back through it, as in Horovod (an allreduce of the same op)."""
    import torch

    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllreduceGrad.apply(tensor, _reduce_op(op, average), prescale_factor, postscale_factor)
    out, op, average, prescale_factor = _copy_for(tensor, op, average, prescale_factor, compression)
    return _allreduce_into([out], [out], op, average, prescale_factor, postscale_factor, compression,
                           process_set, now=True).wait()


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> Any:
    """Allreduce ``tensor`` in place; returns it."""
    _allreduce_into([tensor.data], [tensor.data], op, average, prescale_factor, postscale_factor, None,
                    process_set, now=True).wait()
    return tensor


def grouped_allreduce_async(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = None) -> _Handle:
    outs = [t.detach().clone() for t in tensors]
    handle = _allreduce_into(outs, outs, op, average, prescale_factor, postscale_factor, None, process_set)
    return _Handle(handle._works, lambda: (handle.wait(), outs)[1])


def grouped_allreduce_async_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = None) -> _Handle:
    datas = [t.data for t in tensors]
    handle = _allreduce_into(datas, datas, op, average, prescale_factor, postscale_factor, None, process_set)
    return _Handle(handle._works, lambda: (handle.wait(), list(tensors))[1])


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      compression: Any = None, op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None) -> list[Any]:
    """Each of ``tensors`` allreduced, as new tensors (one round for the group)."""
    outs = [t.detach().clone() for t in tensors]
    _allreduce_into(outs, outs, op, average, prescale_factor, postscale_factor, compression, process_set,
                    now=True).wait()
    return outs


def grouped_allreduce_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = None) -> list[Any]:
    datas = [t.data for t in tensors]
    _allreduce_into(datas, datas, op, average, prescale_factor, postscale_factor, None, process_set,
                    now=True).wait()
    return list(tensors)


class _AllreduceGrad:
    """Allreduce with a gradient: the gradient of an average is the average
    of the gradients (a sum's, the sum), as Horovod's autograd function has it."""

    @staticmethod
    def apply(tensor: Any, op: str, prescale: float, postscale: float) -> Any:
        import torch

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, t: Any) -> Any:
                out = t.detach().clone()
                return _allreduce_into([out], [out], op, None, prescale, postscale, None, None, now=True).wait()

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                out = grad.detach().clone()
                return _allreduce_into([out], [out], op, None, prescale, postscale, None, None, now=True).wait()

        return Fn.apply(tensor)


def allgather_async(tensor: Any, name: str | None = None, process_set: Any = None) -> _Handle:
    """Start an allgather; see :func:`allgather`."""
    import torch
    import torch.distributed as dist

    check_process_set(process_set)
    world = size()
    rows = torch.tensor([tensor.shape[0] if tensor.dim() else 1], dtype=torch.int64, device=tensor.device)
    counts = [torch.zeros_like(rows) for _ in range(world)]
    dist.all_gather(counts, rows)
    lengths = [int(c.item()) for c in counts]
    data = tensor.detach().reshape(-1 if tensor.dim() == 0 else tensor.shape[0], *tensor.shape[1:])
    longest = max(lengths)
    if data.shape[0] < longest:
        pad = torch.zeros((longest - data.shape[0], *data.shape[1:]), dtype=data.dtype, device=data.device)
        data = torch.cat([data, pad])
    parts = [torch.empty_like(data) for _ in range(world)]
    work = dist.all_gather(parts, data.contiguous(), async_op=True)
    return _Handle([work], lambda: torch.cat([p[:n] for p, n in zip(parts, lengths, strict=True)]))


def allgather(tensor: Any, name: str | None = None, process_set: Any = None) -> Any:
    """Every rank's ``tensor`` concatenated along the first dimension, in
    rank order; the first dimensions may differ between ranks (the rest may not)."""
    return allgather_async(tensor, name, process_set).wait()


def broadcast_async_(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None,
                     *, now: bool = False) -> _Handle:
    import torch.distributed as dist

    check_process_set(process_set)
    return _Handle([dist.broadcast(tensor.data, src=root_rank, async_op=not now)], lambda: tensor)


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> _Handle:
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> Any:
    """Overwrite ``tensor`` with ``root_rank``'s, in place; returns it."""
    return broadcast_async_(tensor, root_rank, name, process_set, now=True).wait()


def broadcast(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> Any:
    """``root_rank``'s ``tensor``, as a new tensor on every rank."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set, now=True).wait()


def alltoall_async(tensor: Any, splits: Any = None, name: str | None = None, process_set: Any = None) -> _Handle:
    """Start an alltoall; see :func:`alltoall`."""
    import torch
    import torch.distributed as dist

    check_process_set(process_set)
    world = size()
    if splits is None:
        if tensor.shape[0] % world:
            raise ValueError(f"alltoall without splits needs a first dimension divisible by {world} ranks")
        send = [tensor.shape[0] // world] * world
    else:
        send = [int(s) for s in (splits.tolist() if hasattr(splits, "tolist") else splits)]
        if len(send) != world or sum(send) != tensor.shape[0]:
            raise ValueError(f"splits must have one entry per rank ({world}) summing to the first dimension")
    mine = torch.tensor(send, dtype=torch.int64)
    got = torch.empty_like(mine)
    dist.all_to_all_single(got, mine)
    recv = got.tolist()
    out = torch.empty((sum(recv), *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    work = dist.all_to_all_single(out, tensor.detach().contiguous(), output_split_sizes=recv,
                                  input_split_sizes=send, async_op=True)
    if splits is None:
        return _Handle([work], lambda: out)
    return _Handle([work], lambda: (out, torch.tensor(recv, dtype=torch.int32)))


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, process_set: Any = None) -> Any:
    """Scatter slices of ``tensor``'s first dimension to every rank (``splits``
    rows to each, else equal shares) and gather what each sends here. With
    ``splits``: ``(output, received_splits)``, as Horovod returns."""
    return alltoall_async(tensor, splits, name, process_set).wait()


def reducescatter(tensor: Any, name: str | None = None, compression: Any = None, op: Any = Average,
                  process_set: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """``tensor`` reduced over every rank, and this rank's share of its first
    dimension (shares as even as can be, the first ranks taking one more)."""
    from raydist.compat.horovod.torch._basics import rank

    if op not in (Average, Sum):
        raise ValueError("reducescatter takes op=hvd.Average or hvd.Sum")
    whole = allreduce(tensor.detach(), op=op, compression=compression, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor, process_set=process_set)
    world, me = size(), rank()
    base, extra = divmod(tensor.shape[0], world)
    start = me * base + min(me, extra)
    return whole[start:start + base + (1 if me < extra else 0)].clone()


def barrier(process_set: Any = None) -> None:
    """Wait until every rank gets here."""
    import torch.distributed as dist

    check_process_set(process_set)
    dist.barrier()


def join(device: int = -1) -> int:
    """Wait until every rank has joined; the rank that joined last."""
    import torch

    stamps = allgather_object(time.time())
    return int(torch.tensor(stamps).argmax().item())


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """``root_rank``'s ``obj`` (any picklable object), on every rank."""
    import torch.distributed as dist

    check_process_set(process_set)
    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    import torch.distributed as dist

    check_process_set(process_set)
    out: list[Any] = [None] * size()
    dist.all_gather_object(out, obj)
    return out
