"""[Experimental] Horovod's TensorFlow collectives on raydist: ``allreduce``,
``broadcast``, ``allgather`` of TensorFlow tensors and variables, eagerly or
inside a ``tf.function`` (as ``model.fit`` runs its steps).

The mechanism: the job's gloo process group (the same one
:mod:`raydist.compat.horovod.torch` uses), through host memory: a tensor
goes to NumPy, into one flat buffer per call, through ``torch.distributed``
and back (``tf.py_function`` inside a graph). What it costs: a copy each way
per call, and XLA cannot compile a step that holds one (Keras 2's ``fit``
does not ask it to). Horovod's Keras was Keras 2: importing this module
first gives Keras 2 under ``tf.keras`` and ``keras`` (``tf-keras``), as
raydist's TensorFlow workers run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

if "tensorflow" not in sys.modules:  # Keras 2 under both names, as Horovod's Keras code expects
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    from raydist.train.runtime import use_keras2_everywhere

    use_keras2_everywhere()

from raydist.compat.horovod.torch._basics import (  # noqa: E402 - after the Keras choice
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
    unsupported,
)

__all__ = [
    "Adasum", "Average", "Compression", "Max", "Min", "Product", "Sum", "allgather", "allreduce", "broadcast",
    "broadcast_variables", "cross_rank", "cross_size", "grouped_allreduce", "init", "is_initialized", "local_rank",
    "local_size", "rank", "shutdown", "size",
]


class Compression:
    """Only ``Compression.none`` (tensors travel as they are) is mapped here."""

    none = None

    class fp16:  # noqa: N801 - Horovod's name
        """Not mapped for TensorFlow: refused when used."""


def _check_compression(compression: Any) -> None:
    if compression is not None and compression is not Compression.none:
        raise unsupported("compression for TensorFlow tensors", "leave compression out (Compression.none)")


def _np_allreduce(arrays: Sequence[Any], op: str, prescale: float, postscale: float) -> list[Any]:
    import numpy as np
    import torch
    import torch.distributed as dist

    from raydist.compat.horovod.torch._ops import _dist_op

    out = []
    for a in arrays:
        flat = np.array(a, copy=True).reshape(-1)
        buf = torch.from_numpy(flat * prescale if prescale != 1.0 else flat)
        dist.all_reduce(buf, op=_dist_op(op))
        if op == Average:
            buf = buf / size() if buf.is_floating_point() else torch.div(buf, size(), rounding_mode="floor")
        if postscale != 1.0:
            buf = buf * postscale
        out.append(buf.numpy().astype(np.asarray(a).dtype, copy=False).reshape(np.shape(a)))
    return out


def _on_host(fn: Any, tensors: Sequence[Any]) -> list[Any]:
    """``fn`` over the tensors' NumPy values: directly when eager, through
    ``tf.py_function`` in a graph; the results keep each tensor's dtype and shape."""
    import tensorflow as tf

    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(r) for r in fn([t.numpy() for t in tensors])]
    results = tf.py_function(lambda *ts: fn([t.numpy() for t in ts]), tensors, [t.dtype for t in tensors])
    for r, t in zip(results, tensors, strict=True):
        r.set_shape(t.shape)
    return list(results)


def _op(op: Any, average: bool | None) -> str:
    from raydist.compat.horovod.torch._ops import _reduce_op

    return _reduce_op(op, average)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, compression: Any = None, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> list:
    """Each tensor reduced over every rank (by default averaged), in one host round trip."""
    from raydist.compat.horovod.torch._basics import check_process_set

    check_process_set(process_set)
    _check_compression(compression)
    kind = _op(op, average)
    return _on_host(lambda arrays: _np_allreduce(arrays, kind, prescale_factor, postscale_factor), tensors)


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = None, op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: str | None = None, process_set: Any = None) -> Any:
    """``tensor`` reduced over every rank (by default averaged)."""
    return grouped_allreduce([tensor], average, compression, op, prescale_factor, postscale_factor, process_set)[0]


def broadcast(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> Any:
    """``root_rank``'s value of ``tensor``, on every rank."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from raydist.compat.horovod.torch._basics import check_process_set

    check_process_set(process_set)

    def go(arrays: Sequence[Any]) -> list[Any]:
        out = []
        for a in arrays:
            buf = torch.from_numpy(np.array(a, copy=True))
            dist.broadcast(buf, src=root_rank)
            out.append(buf.numpy())
        return out

    return _on_host(go, [tensor])[0]


def broadcast_variables(variables: Sequence[Any], root_rank: int, process_set: Any = None) -> None:
    """Assign every variable ``root_rank``'s value."""
    for var in variables:
        var.assign(broadcast(var, root_rank, process_set=process_set))


def allgather(tensor: Any, name: str | None = None, process_set: Any = None) -> Any:
    """Every rank's ``tensor`` concatenated along the first dimension (which
    may differ between ranks); eagerly only."""
    import numpy as np
    import tensorflow as tf
    import torch

    from raydist.compat.horovod.torch._ops import allgather as torch_allgather

    if not tf.executing_eagerly():
        raise unsupported("allgather inside a tf.function", "call it eagerly")
    local = torch.from_numpy(np.array(tf.convert_to_tensor(tensor).numpy(), copy=True))
    return tf.convert_to_tensor(torch_allgather(local, process_set=process_set).numpy())
