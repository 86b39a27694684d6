"""What each rank of a ``KerasEstimator`` fit runs, with Horovod's semantics.

Each rank reads its own rows (the partition raydist's ``TorchDistributor``
hands it), joins the job's process group, and trains as Horovod's Keras
remote trainer does: the model and optimizer rebuilt from the driver's, the
learning rate scaled by the number of ranks (and scaled back in the model
returned), the weights broadcast from rank 0, gradients averaged across
ranks before each update, every rank taking the same number of steps an
epoch (its rows repeated), each epoch's logs averaged over the ranks
(Horovod's ``MetricAverageCallback``); rank 0 checkpoints each epoch under
the Store and returns the history and the trained model.

The model trains under its own Keras: Keras 3 where the driver built it with
Keras 3 (the default with TensorFlow 2.16 and later), Keras 2 (``tf_keras``)
where it was built with that. Keras 2 is what TensorFlow's multi-worker
strategies need (raydist's ``MirroredStrategyRunner``); Horovod's estimator
uses none: its ranks average gradients inside the optimizer, which either
Keras allows, so the model never has to cross from one Keras to the other.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import time
from dataclasses import dataclass
from typing import Any

from raydist.compat.horovod.spark.common._fit import RankData, rank_rows

__all__ = ["KerasRankSpec", "predict_rows", "train_rank"]


@dataclass
class KerasRankSpec(RankData):
    """Everything a rank needs, built by the estimator on the driver."""

    model: bytes  # the driver's model, pickled (both Kerases pickle a model whole: config and weights)
    legacy: bool  # built with Keras 2 (tf_keras)
    optimizer: dict[str, Any]  # the optimizer, serialized by its Keras
    loss: Any
    loss_weights: Any
    metrics: Any
    custom_objects: dict[str, Any]
    callbacks: list[Any]
    label_shapes: list[list[int] | None]
    backward_passes_per_step: int
    transformation_fn: Any
    checkpoint_file: str | None
    logs_dir: str | None
    store: Any = None
    resume: bytes | None = None  # the Store's checkpoint of this run (a pickled model), to start from


def _keras(legacy: bool) -> Any:
    if legacy:
        import tf_keras

        return tf_keras
    import keras

    return keras


def _array(values: Any, shape: list[int] | None) -> Any:
    """A column's values as one float32 array: rows of arrays stacked, in ``shape`` when given."""
    import numpy as np

    first = values.iloc[0] if len(values) else 0.0
    if isinstance(first, (list, tuple, np.ndarray)):
        out = np.stack([np.asarray(v, dtype=np.float32) for v in values]) if len(values) else np.zeros((0, 1))
    else:
        out = values.to_numpy(dtype=np.float32)
    return out.reshape([-1, *shape[1:]] if shape and shape[0] in (-1, None) else shape) if shape else out


def _one_or_many(arrays: list[Any]) -> Any:
    return arrays[0] if len(arrays) == 1 else arrays


def predict_rows(model: Any, columns: Any, shapes: Any) -> list[Any]:
    """The model's outputs for these rows (pandas Series of features), as
    2-D numpy arrays: what ``KerasModel.transform`` adds."""
    import numpy as np

    inputs = [_array(c, s) for c, s in zip(columns, shapes, strict=True)]
    outputs = model.predict_on_batch(_one_or_many(inputs))
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [np.asarray(o).reshape(len(columns[0]), -1) for o in outputs]


def _averaged(values: list[Any]) -> list[Any]:
    """``values`` (numpy arrays) averaged over the job's ranks, through its process group."""
    import numpy as np
    import torch
    import torch.distributed as dist

    if not values:
        return values
    flat = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in values])
    buf = torch.from_numpy(flat)
    dist.all_reduce(buf)
    buf /= dist.get_world_size()
    out, at = [], 0
    for v in values:
        n = int(np.prod(np.shape(v)))
        out.append(buf[at:at + n].numpy().reshape(np.shape(v)).astype(np.asarray(v).dtype))
        at += n
    return out


def _average_gradients(tf: Any, grads: list[Any]) -> list[Any]:
    """Inside a train step: each gradient averaged over the ranks (host memory, the job's gloo group)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    dense = [tf.convert_to_tensor(grads[i]) for i in present]
    if not dense:
        return grads
    done = tf.py_function(lambda *gs: _averaged([g.numpy() for g in gs]), dense, Tout=[g.dtype for g in dense])
    out = list(grads)
    for i, g, shaped in zip(present, done, dense, strict=True):
        g.set_shape(shaped.shape)
        out[i] = g
    return out


def _distributed(legacy: bool, optimizer: Any, passes: int) -> Any:
    """``optimizer`` whose every update first averages the gradients over the ranks."""
    import tensorflow as tf

    if legacy:
        import raydist.compat.horovod.tensorflow.keras as hvd

        return hvd.DistributedOptimizer(optimizer)  # passes > 1 is refused on the driver for Keras 2
    base = type(optimizer)

    class Averaged(base):  # type: ignore[valid-type,misc]
        def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
            return super().apply(_average_gradients(tf, list(grads)), trainable_variables)

    Averaged.__name__ = base.__name__
    config = optimizer.get_config()
    if passes > 1:
        config["gradient_accumulation_steps"] = passes  # averaged over the passes, as Horovod's estimator does
    return Averaged.from_config(config)


def _metric_average(keras: Any) -> Any:
    class MetricAverage(keras.callbacks.Callback):
        """Each epoch's logs averaged over the ranks, as Horovod's ``MetricAverageCallback``."""

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if logs:
                keys = sorted(logs)
                for key, value in zip(keys, _averaged([float(logs[k]) for k in keys]), strict=True):
                    logs[key] = float(value)

    return MetricAverage()


def _checkpointer(keras: Any, spec: KerasRankSpec, rank: int) -> Any:
    class Checkpoint(keras.callbacks.Callback):
        """Rank 0, after each epoch: the model under the Store and the epoch's line in its logs."""

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if rank != 0:
                return
            if spec.checkpoint_file:
                spec.store.write(spec.checkpoint_file, _plain(self.model))
            if spec.logs_dir:
                os.makedirs(spec.logs_dir, exist_ok=True)
                with open(os.path.join(spec.logs_dir, "history.jsonl"), "a", encoding="utf-8") as f:
                    f.write(json.dumps({"epoch": epoch, **{k: float(v) for k, v in (logs or {}).items()},
                                        "time": time.time()}) + "\n")

    return Checkpoint()


def _dataset(tf: Any, spec: KerasRankSpec, rows: Any, batch: int, shuffle: bool, seed: int) -> Any:
    features = _one_or_many([_array(rows[c], s) for c, s in zip(spec.feature_cols, spec.input_shapes, strict=True)])
    labels = _one_or_many([_array(rows[c], s) for c, s in zip(spec.label_cols, spec.label_shapes, strict=True)])
    parts: tuple[Any, ...] = (features, labels)
    if spec.sample_weight_col:
        parts += (_array(rows[spec.sample_weight_col], None),)
    data = tf.data.Dataset.from_tensor_slices(tuple(tuple(p) if isinstance(p, list) else p for p in parts))
    if shuffle:
        data = data.shuffle(max(1, len(rows)), seed=seed, reshuffle_each_iteration=True)
    return data.repeat().batch(batch)


def train_rank(spec: KerasRankSpec) -> tuple[dict[str, list[float]], bytes] | None:
    """Train this rank's share; rank 0 returns (the history, the trained model pickled)."""
    import raydist.compat.horovod.torch as hvd

    train_rows, val_rows, _marked = rank_rows(spec.transformation_fn)

    hvd.init()  # the job's gloo group, which the gradients and logs are averaged through
    try:
        return _train(spec, train_rows, val_rows)
    finally:
        hvd.shutdown()


def _train(spec: KerasRankSpec, train_rows: Any, val_rows: Any) -> tuple[dict[str, list[float]], bytes] | None:
    import numpy as np
    import tensorflow as tf
    import torch
    import torch.distributed as dist

    keras = _keras(spec.legacy)
    rank, size = dist.get_rank(), dist.get_world_size()
    if spec.random_seed is not None:
        keras.utils.set_random_seed(spec.random_seed)
    with keras.utils.custom_object_scope(spec.custom_objects or {}):
        model = pickle.loads(spec.resume or spec.model)
        optimizer = keras.optimizers.deserialize(spec.optimizer)
    optimizer.learning_rate = float(np.asarray(optimizer.learning_rate)) * size  # Horovod's scaling
    # No XLA: a step holds the host-memory average, which XLA cannot compile.
    model.compile(optimizer=_distributed(spec.legacy, optimizer, spec.backward_passes_per_step),
                  loss=spec.loss, loss_weights=spec.loss_weights, metrics=spec.metrics,
                  **({} if spec.legacy else {"jit_compile": False}))
    weights = model.get_weights()
    shared = [weights if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    model.set_weights(shared[0])

    counts = torch.tensor([len(train_rows), len(val_rows)], dtype=torch.int64)
    dist.all_reduce(counts)
    total_train, total_val = int(counts[0]), int(counts[1])
    steps = spec.train_steps_per_epoch or max(1, math.ceil(total_train / spec.batch_size / size))
    val_steps = spec.validation_steps_per_epoch or max(1, math.ceil(total_val / spec.val_batch_size / size))
    seed = (spec.random_seed or 0) * 1009 + rank
    train = _dataset(tf, spec, train_rows, spec.batch_size, spec.shuffle, seed)
    validation = _dataset(tf, spec, val_rows, spec.val_batch_size, False, seed) if total_val and len(val_rows) else None
    if total_val and validation is None:
        raise RuntimeError(f"rank {rank} has no validation rows while others have: give more rows or fewer ranks")
    callbacks = [_metric_average(keras), *spec.callbacks, _checkpointer(keras, spec, rank)]
    history = model.fit(train, epochs=spec.epochs, steps_per_epoch=steps, validation_data=validation,
                        validation_steps=val_steps if validation is not None else None, callbacks=callbacks,
                        shuffle=False,  # the dataset shuffles itself (spec.shuffle)
                        verbose=spec.verbose if rank == 0 else 0)
    if rank != 0:
        return None
    model.optimizer.learning_rate = float(np.asarray(model.optimizer.learning_rate)) / size
    return {k: [float(v) for v in vs] for k, vs in history.history.items()}, _plain(model)


def _plain(model: Any) -> bytes:
    """The model pickled with its optimizer as the user's class (the
    averaging subclass exists in this rank alone; it adds no state)."""
    optimizer = model.optimizer
    averaging = type(optimizer)
    plain = next(c for c in averaging.__mro__ if not c.__module__.startswith("raydist."))
    optimizer.__class__ = plain
    try:
        buffer = io.BytesIO()
        pickle.dump(model, buffer)
        return buffer.getvalue()
    finally:
        optimizer.__class__ = averaging
