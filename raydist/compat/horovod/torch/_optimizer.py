"""Horovod's ``DistributedOptimizer``, ``Compression`` and the broadcasts of
a model's and an optimizer's state.

``DistributedOptimizer`` wraps the user's optimizer in a subclass of its own
class (so ``isinstance`` and its ``param_groups`` / ``state_dict`` are the
same): gradients accumulate locally for ``backward_passes_per_step``
backward passes; on the last, each is averaged over every rank, in buckets
sent while the backward pass goes on (as DDP does; Horovod sends tensor by
tensor, fused in its background thread), and ``step()`` waits for them
before the update. ``synchronize()`` does the waiting early, and
``skip_synchronize()`` keeps ``step()`` from doing it again, for gradient
clipping between the two, as in Horovod.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from raydist.compat.horovod.torch._basics import Adasum, Average, Sum, size, unsupported
from raydist.compat.horovod.torch._ops import _allreduce_into, broadcast_, broadcast_object

__all__ = ["Compression", "DistributedOptimizer", "broadcast_optimizer_state", "broadcast_parameters"]


class _NoneCompressor:
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class _FP16Compressor:
    """Sends floating-point tensors as float16 (half the bytes), back in their own dtype after."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        import torch

        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """How tensors travel in an allreduce: ``Compression.none`` or ``Compression.fp16``."""

    none = _NoneCompressor
    fp16 = _FP16Compressor


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite every rank's parameters with ``root_rank``'s: ``params`` is
    a ``state_dict()`` or ``named_parameters()`` (or a list of pairs)."""
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    for _, value in items:
        if value is not None and hasattr(value, "data"):
            broadcast_(value, root_rank)


def broadcast_optimizer_state(optimizer: Any, root_rank: int) -> None:
    """Give every rank ``root_rank``'s optimizer state (steps, moments,
    learning rates: its whole ``state_dict``)."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    optimizer.load_state_dict(state)


#: A bucket of ready gradients is sent once it holds this many bytes: the
#: first small, so the last layers' gradients travel while the backward pass
#: still runs through the first ones (DDP's way), later ones bigger, so a
#: big model costs few rounds.
_FIRST_BUCKET_BYTES = 1 << 20
_BUCKET_BYTES = 16 << 20


class _Distributed:
    """The methods a wrapped optimizer gains (mixed in before its own class).

    Each parameter's gradient joins a bucket when its last backward pass of
    the step has accumulated it (a post-accumulate hook); a full bucket is
    flattened and its allreduce started at once, while the backward pass
    goes on. :meth:`synchronize` sends what is left, waits for every bucket
    and puts the averages back into the gradients.
    """

    _hvd_compression: Any
    _hvd_op: str
    _hvd_predivide: float
    _hvd_passes: int
    _hvd_synced: bool
    _hvd_skip: bool
    _hvd_counts: dict[int, int]
    _hvd_bucket: list[Any]
    _hvd_bucket_bytes: int  # what the bucket holds, kept as it fills
    _hvd_sent: list[tuple[Any, Any, list[Any]]]
    _hvd_launched: set[int]

    def _hvd_params(self) -> list[Any]:
        return [p for group in self.param_groups for p in group["params"]]  # type: ignore[attr-defined]

    def _hvd_hook_all(self) -> None:
        self._hvd_counts, self._hvd_bucket, self._hvd_sent, self._hvd_launched = {}, [], [], set()
        self._hvd_bucket_bytes = 0
        for p in self._hvd_params():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hvd_ready)

    def _hvd_ready(self, p: Any) -> None:
        passes = self._hvd_counts.get(id(p), 0) + 1
        if passes < self._hvd_passes:
            self._hvd_counts[id(p)] = passes  # accumulates locally for more passes first
            return
        self._hvd_counts[id(p)] = 0
        if id(p) in self._hvd_launched or p.grad is None:
            return
        self._hvd_bucket.append(p)
        self._hvd_bucket_bytes += p.grad.numel() * p.grad.element_size()
        if self._hvd_bucket_bytes >= (_FIRST_BUCKET_BYTES if not self._hvd_sent else _BUCKET_BYTES):
            self._hvd_send()

    def _hvd_send(self) -> None:
        import torch

        by_dtype: dict[Any, list[Any]] = {}
        for p in self._hvd_bucket:
            by_dtype.setdefault(p.grad.dtype, []).append(p)
            self._hvd_launched.add(id(p))
        self._hvd_bucket, self._hvd_bucket_bytes = [], 0
        if self._hvd_op == Average:
            pre, post = 1.0 / self._hvd_predivide, self._hvd_predivide
        else:
            pre = post = 1.0
        for params in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            handle = _allreduce_into([flat], [flat], self._hvd_op, None, pre, post, self._hvd_compression, None)
            self._hvd_sent.append((handle, flat, params))

    def synchronize(self) -> None:
        """Average the accumulated gradients over every rank now."""
        for p in self._hvd_params():  # those no hook sent (fewer passes than asked, or no hook ran)
            if p.grad is not None and id(p) not in self._hvd_launched and all(p is not q for q in self._hvd_bucket):
                self._hvd_bucket.append(p)
        if self._hvd_bucket:
            self._hvd_send()
        for handle, flat, params in self._hvd_sent:
            handle.wait()
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.grad.numel()].view_as(p.grad))
                offset += p.grad.numel()
        self._hvd_sent, self._hvd_launched, self._hvd_counts = [], set(), {}
        self._hvd_synced = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within it, ``step()`` does not average again (after an explicit :meth:`synchronize`)."""
        self._hvd_skip = True
        try:
            yield
        finally:
            self._hvd_skip = False

    def step(self, closure: Any = None) -> Any:
        if not self._hvd_skip and not self._hvd_synced:
            self.synchronize()
        self._hvd_synced = False
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._hvd_sent:  # sent on every rank: finish them, so the ranks' rounds stay in step
            for handle, _, _ in self._hvd_sent:
                handle.wait()
        self._hvd_sent, self._hvd_launched, self._hvd_bucket, self._hvd_bucket_bytes = [], set(), [], 0
        self._hvd_synced = False
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: Any,
    named_parameters: Iterable[tuple[str, Any]] | None = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
) -> Any:
    """``optimizer``, made to average gradients over every rank before each
    update (see the module docstring). ``named_parameters`` is checked for
    duplicate names, as Horovod does; ``op`` is ``hvd.Average`` or ``hvd.Sum``."""
    if op == Adasum:
        raise unsupported("DistributedOptimizer(op=hvd.Adasum)", "use op=hvd.Average (the default)")
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer takes op=hvd.Average or op=hvd.Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is only for op=hvd.Average")
    if isinstance(backward_passes_per_step, bool) or int(backward_passes_per_step) < 1:
        raise ValueError("backward_passes_per_step must be a whole number of at least 1")
    if process_set is not None:
        from raydist.compat.horovod.torch._basics import check_process_set

        check_process_set(process_set)
    if named_parameters is not None:
        names = [name for name, _ in named_parameters]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {dups}")
    size()  # hvd.init() first, as in Horovod
    cls = type(optimizer.__class__.__name__, (_Distributed, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._hvd_compression = compression
    wrapped._hvd_op = op
    wrapped._hvd_predivide = float(gradient_predivide_factor)
    wrapped._hvd_passes = int(backward_passes_per_step)
    wrapped._hvd_synced = False
    wrapped._hvd_skip = False
    wrapped._hvd_hook_all()
    return wrapped
