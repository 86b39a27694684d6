"""[Experimental] Horovod's Keras API on raydist (``import
horovod.tensorflow.keras as hvd`` or ``import horovod.keras as hvd`` through
the runners' alias): ``init``, the ranks and sizes, ``DistributedOptimizer``
around a Keras optimizer, ``callbacks``, and ``allreduce`` / ``broadcast``
on tensors, for ``model.fit`` code written as Horovod's Keras examples write it.

Keras 2 (``tf-keras``), as Horovod's Keras was; see
:mod:`raydist.compat.horovod.tensorflow` for the mechanism and its cost.
"""

from __future__ import annotations

from typing import Any

from raydist.compat.horovod.tensorflow import (
    Adasum,
    Average,
    Compression,
    Sum,
    allgather,
    allreduce,
    broadcast,
    broadcast_variables,
    cross_rank,
    cross_size,
    grouped_allreduce,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
    unsupported,
)
from raydist.compat.horovod.tensorflow.keras import callbacks

__all__ = [
    "Average", "Compression", "DistributedOptimizer", "Sum", "allgather", "allreduce", "broadcast",
    "broadcast_global_variables", "broadcast_variables", "callbacks", "cross_rank", "cross_size", "init",
    "is_initialized", "load_model", "local_rank", "local_size", "rank", "shutdown", "size",
]


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """A copy of the Keras ``optimizer`` (of a subclass of its own class,
    from its config) whose ``apply_gradients`` first reduces the gradients
    over every rank (averages them, by default), in one host round trip per step."""
    if op == Adasum:
        raise unsupported("DistributedOptimizer(op=hvd.Adasum)", "use op=hvd.Average (the default)")
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer takes op=hvd.Average or op=hvd.Sum")
    if backward_passes_per_step != 1:
        raise unsupported("backward_passes_per_step for Keras", "leave it at 1 (raydist.compat.horovod.torch "
                                                                "supports it for PyTorch)")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is only for op=hvd.Average")
    size()  # hvd.init() first, as in Horovod
    base = optimizer.__class__
    pre, post = (1.0 / gradient_predivide_factor, gradient_predivide_factor) if op == Average else (1.0, 1.0)

    def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = [(g, v) for g, v in grads_and_vars]
        present = [i for i, (g, _) in enumerate(pairs) if g is not None]
        if present:
            reduced = grouped_allreduce([pairs[i][0] for i in present], op=op, compression=compression,
                                        prescale_factor=pre, postscale_factor=post, process_set=process_set)
            for i, g in zip(present, reduced, strict=True):
                pairs[i] = (g, pairs[i][1])
        return base.apply_gradients(self, pairs, *args, **kwargs)

    cls = type(base.__name__, (base,), {"apply_gradients": apply_gradients, "_HAS_AGGREGATE_GRAD": True})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def broadcast_global_variables(root_rank: int) -> None:
    """Not in eager Keras 2: broadcast a model's variables with
    ``callbacks.BroadcastGlobalVariablesCallback`` or ``broadcast_variables``."""
    raise unsupported("hvd.broadcast_global_variables", "use hvd.callbacks.BroadcastGlobalVariablesCallback(0)")


def load_model(filepath: str, custom_optimizers: Any = None, custom_objects: Any = None,
               compression: Any = Compression.none) -> Any:
    """Load a Keras model saved by a Horovod program, its optimizer made distributed again."""
    import tensorflow as tf

    model = tf.keras.models.load_model(filepath, custom_objects=custom_objects)
    if getattr(model, "optimizer", None) is not None:
        model.optimizer = DistributedOptimizer(model.optimizer, compression=compression)
    return model

