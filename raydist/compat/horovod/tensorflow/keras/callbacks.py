"""Horovod's Keras callbacks: the same start everywhere, averaged metrics,
and a learning-rate warmup."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from raydist.compat.horovod.tensorflow import broadcast_variables, grouped_allreduce, size

__all__ = ["BroadcastGlobalVariablesCallback", "LearningRateWarmupCallback", "MetricAverageCallback"]


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Every rank starts from ``root_rank``'s weights (when training begins)
    and optimizer state (once the first step has made it)."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self._optimizer_done = False

    def on_train_begin(self, logs: Any = None) -> None:
        broadcast_variables(self.model.variables, self.root_rank)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._optimizer_done:
            return
        optimizer = self.model.optimizer
        variables = optimizer.variables() if callable(getattr(optimizer, "variables", None)) else optimizer.variables
        broadcast_variables(list(variables), self.root_rank)
        self._optimizer_done = True


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """Each epoch's metrics averaged over every rank (put it before callbacks
    that read them, as in Horovod)."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if isinstance(v, (int, float)) or hasattr(v, "numpy"))
        values = [tf.constant([float(logs[k])], dtype=tf.float64) for k in names]
        for name, value in zip(names, grouped_allreduce(values), strict=True):
            logs[name] = float(value.numpy()[0])


class LearningRateWarmupCallback(tf.keras.callbacks.Callback):
    """The learning rate grows from ``initial_lr / size()`` to ``initial_lr``
    over the first ``warmup_epochs`` epochs, step by step, as Horovod's does
    (large effective batches train badly from a full rate at once)."""

    def __init__(self, initial_lr: float, warmup_epochs: float = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self._epoch = 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        steps = self.steps_per_epoch or (self.params or {}).get("steps") or 1
        progress = self._epoch + batch / steps
        if progress > self.warmup_epochs:
            return
        world = size()
        lr = self.initial_lr / world * (progress * (world - 1) / self.warmup_epochs + 1)
        rate = self.model.optimizer.learning_rate
        if hasattr(rate, "assign"):
            rate.assign(lr)
        else:
            self.model.optimizer.learning_rate = lr

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.verbose and epoch + 1 == int(self.warmup_epochs):
            print(f"Epoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")
