"""What each rank of a ``TorchEstimator`` fit runs, with Horovod's semantics.

Each rank reads its own rows (the partition raydist's ``TorchDistributor``
hands it, an Arrow stream), joins the job with ``hvd.init()``, and trains as
Horovod's remote trainer does: the optimizer rebuilt from its class and
state, its learning rate scaled by the number of ranks (and scaled back in
the optimizer returned), parameters and optimizer state broadcast from rank
0, gradients averaged by ``hvd.DistributedOptimizer``; every rank takes the
same number of steps an epoch (its rows cycled), losses and metrics averaged
over ranks and steps; rank 0 checkpoints each epoch under the Store and
returns the history, the weights and the optimizer state.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from raydist.compat.horovod.spark.common._fit import RankData, rank_rows

__all__ = ["RankSpec", "train_rank", "column_tensor", "feature_tensors", "predict_rows"]


@dataclass
class RankSpec(RankData):
    """Everything a rank needs, built by the estimator on the driver."""

    model: Any
    optimizer_cls: type
    optimizer_state: dict[str, Any]
    loss_fns: list[Callable[..., Any]]
    loss_weights: list[float]
    metric_groups: list[list[Callable[..., Any]]]
    backward_passes_per_step: int
    compression: Any
    train_minibatch_fn: Callable[..., Any] | None
    transformation_fn: Callable[..., Any] | None
    checkpoint_file: str | None
    logs_dir: str | None
    #: The Store the checkpoint is written through (set with ``checkpoint_file``).
    store: Any = None
    resume_state: dict[str, Any] | None = None


def column_tensor(values: Any) -> Any:
    """A column's values as one float tensor: rows of arrays stacked, scalars as they are."""
    import numpy as np
    import torch

    first = values.iloc[0] if len(values) else 0.0
    if isinstance(first, (list, tuple, np.ndarray)):
        return torch.as_tensor(np.stack([np.asarray(v, dtype=np.float32) for v in values]))
    return torch.as_tensor(values.to_numpy(dtype=np.float32))


def feature_tensors(columns: list[Any], shapes: list[Any]) -> list[Any]:
    """The model's inputs: each feature column as a tensor, in its input shape (None: as it stacks)."""
    return [column_tensor(values) if shape is None else column_tensor(values).reshape(shape)
            for values, shape in zip(columns, shapes, strict=True)]


def predict_rows(model: Any, columns: Any, shapes: Any) -> list[Any]:
    """The model's outputs for these rows (pandas Series of features), as
    2-D numpy arrays: what ``TorchModel.transform`` adds."""
    import torch

    model.eval()
    inputs = feature_tensors(list(columns), list(shapes))
    with torch.no_grad():
        outputs = model(*inputs)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [o.detach().cpu().numpy().reshape(len(columns[0]), -1) for o in outputs]


def _default_minibatch(model: Any, optimizer: Any, transform_outputs: Callable[..., Any],
                       loss_fn: Callable[..., Any], inputs: list[Any], labels: list[Any],
                       sample_weights: Any) -> tuple[Any, Any]:
    optimizer.zero_grad()
    outputs = model(*inputs)
    outputs, labels = transform_outputs(outputs, labels)
    loss = loss_fn(outputs, labels, sample_weights)
    loss.backward()
    optimizer.step()
    return outputs, loss


def _transform_outputs(outputs: Any, labels: list[Any]) -> tuple[list[Any], list[Any]]:
    """Outputs as a list; each label shaped as its output where they hold as many values."""
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    if hasattr(outputs[0], "shape"):
        labels = [label.reshape(output.shape) if output.shape.numel() == label.shape.numel() else label
                  for label, output in zip(labels, outputs, strict=False)]
    return list(outputs), labels


class _Mean:
    """A value averaged over this epoch's steps here, then over the ranks."""

    def __init__(self) -> None:
        self.total, self.n = 0.0, 0

    def add(self, value: Any) -> None:
        self.total += float(value.detach().cpu()) if hasattr(value, "detach") else float(value)
        self.n += 1

    def reduced(self) -> float:
        import torch
        import torch.distributed as dist

        both = torch.tensor([self.total, float(self.n)], dtype=torch.float64)
        dist.all_reduce(both)
        return float(both[0] / both[1]) if both[1] else float("nan")


def train_rank(spec: RankSpec) -> tuple[list[dict[str, Any]], bytes, bytes] | None:
    """Train this rank's share; rank 0 returns (history, model state, optimizer state)."""
    import torch

    import raydist.compat.horovod.torch as hvd

    if spec.random_seed is not None:
        torch.manual_seed(spec.random_seed)
    train_rows, val_rows, marked = rank_rows(spec.transformation_fn)
    hvd.init()
    try:
        return _train(spec, train_rows, val_rows, marked)
    finally:
        hvd.shutdown()


def _tensors(spec: RankSpec, part: Any) -> tuple[list[Any], list[Any], Any]:
    inputs = feature_tensors([part[c] for c in spec.feature_cols], spec.input_shapes)
    labels = [column_tensor(part[c]) for c in spec.label_cols]
    weights = column_tensor(part[spec.sample_weight_col]) if spec.sample_weight_col else None
    return inputs, labels, weights


def _batches(count: int, size: int, shuffle: bool, seed: int) -> Iterator[Any]:
    """Row indices, ``size`` at a time, for ever: every row once a pass, each pass in a new order."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(count, generator=generator) if shuffle else torch.arange(count)
        for start in range(0, count, size):
            yield order[start:start + size]


def _train(spec: RankSpec, train_rows: Any, val_rows: Any,
           should_validate: bool) -> tuple[list[dict[str, Any]], bytes, bytes] | None:
    import torch
    import torch.distributed as dist

    import raydist.compat.horovod.torch as hvd

    model = spec.model
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(hvd.local_rank())
        model.cuda()
    optimizer = spec.optimizer_cls(model.parameters(), lr=1)
    if spec.resume_state is not None:
        model.load_state_dict(spec.resume_state["model"])
        optimizer.load_state_dict(spec.resume_state["optimizer"])
    else:
        state = spec.optimizer_state
        for group in state["param_groups"]:
            group["lr"] = group["lr"] * hvd.size()
        optimizer.load_state_dict(state)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    wrapped = {"backward_passes_per_step": spec.backward_passes_per_step}
    if spec.compression is not None:
        wrapped["compression"] = spec.compression
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **wrapped)

    counts = torch.tensor([len(train_rows), len(val_rows)], dtype=torch.int64)
    dist.all_reduce(counts)
    total_train, total_val = int(counts[0]), int(counts[1])
    steps = spec.train_steps_per_epoch or max(1, math.ceil(total_train / spec.batch_size / hvd.size()))
    val_steps = spec.validation_steps_per_epoch or max(1, math.ceil(total_val / spec.val_batch_size / hvd.size()))
    should_validate = should_validate and total_val > 0
    seed = (spec.random_seed or 0) * 1009 + hvd.rank()
    train_data = _tensors(spec, train_rows)
    val_data = _tensors(spec, val_rows) if should_validate else None
    minibatch = spec.train_minibatch_fn or _default_minibatch

    def pick(data: tuple[list[Any], list[Any], Any], index: Any) -> tuple[list[Any], list[Any], Any]:
        inputs, labels, weights = data
        moved = (lambda t: t.cuda()) if cuda else (lambda t: t)
        return ([moved(t[index]) for t in inputs], [moved(t[index]) for t in labels],
                moved(weights[index]) if weights is not None else None)

    def loss_fn(outputs: list[Any], labels: list[Any], weights: Any) -> Any:
        fns = spec.loss_fns if len(spec.loss_fns) > 1 else spec.loss_fns * len(outputs)
        if weights is None:
            parts = [fn(o, lab) * w for o, lab, fn, w in zip(outputs, labels, fns, spec.loss_weights, strict=False)]
        else:
            parts = [(fn(o, lab, reduction="none").flatten() * weights).mean() * w
                     for o, lab, fn, w in zip(outputs, labels, fns, spec.loss_weights, strict=False)]
        return sum(parts)

    def metric_holders() -> list[list[tuple[str, _Mean]]]:
        return [[(f"group_{g}_{label}", _Mean()) for label in spec.label_cols]
                for g in range(len(spec.metric_groups))]

    def update(holders: list[list[tuple[str, _Mean]]], outputs: list[Any], labels: list[Any]) -> None:
        for fns, group in zip(spec.metric_groups, holders, strict=True):
            fns = fns * len(outputs) if len(fns) == 1 else fns
            for (_, mean), fn, output, label in zip(group, fns, outputs, labels, strict=False):
                mean.add(fn(output, label))

    def summary(loss: _Mean, holders: list[list[tuple[str, _Mean]]]) -> dict[str, Any]:
        return {"loss": loss.reduced(),
                "all_metrics": [{name: mean.reduced() for name, mean in group} for group in holders]}

    train_order = _batches(len(train_rows), spec.batch_size, spec.shuffle, seed)
    val_order = _batches(len(val_rows), spec.val_batch_size, False, seed) if should_validate else None
    history: list[dict[str, Any]] = []
    for epoch in range(spec.epochs):
        model.train()
        loss_mean, holders = _Mean(), metric_holders()
        for _ in range(steps):
            inputs, labels, weights = pick(train_data, next(train_order))
            outputs, loss = minibatch(model, optimizer, _transform_outputs, loss_fn, inputs, labels, weights)
            outputs, labels = _transform_outputs(outputs, labels)
            update(holders, outputs, labels)
            loss_mean.add(loss)
        record: dict[str, Any] = {"epoch": epoch, "train": summary(loss_mean, holders)}
        if should_validate:
            model.eval()
            loss_mean, holders = _Mean(), metric_holders()
            with torch.no_grad():
                for _ in range(val_steps):
                    inputs, labels, weights = pick(val_data, next(val_order))  # type: ignore[arg-type]
                    outputs, labels = _transform_outputs(model(*inputs), labels)
                    loss_mean.add(loss_fn(outputs, labels, weights))
                    update(holders, outputs, labels)
            record["validation"] = summary(loss_mean, holders)
        if spec.verbose > 0 and hvd.rank() == 0:
            print(record, flush=True)
        history.append(record)
        if hvd.rank() == 0:
            _checkpoint(spec, model, optimizer, record, cuda)
    if hvd.rank() != 0:
        return None
    model.cpu()
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        group["lr"] = group["lr"] / hvd.size()
    return history, _saved(torch, model.state_dict()), _saved(torch, state)


def _saved(torch: Any, obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _checkpoint(spec: RankSpec, model: Any, optimizer: Any, record: dict[str, Any], cuda: bool) -> None:
    """Rank 0, after each epoch: the model and optimizer under the Store
    (written whole, by the Store), and the epoch's line in its logs."""
    import torch

    if spec.checkpoint_file:
        model.cpu()
        spec.store.write(spec.checkpoint_file, _saved(torch, {"model": model.state_dict(),
                                                             "optimizer": optimizer.state_dict()}))
        if cuda:
            model.cuda()
    if spec.logs_dir:
        os.makedirs(spec.logs_dir, exist_ok=True)
        with open(os.path.join(spec.logs_dir, "history.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps({**record, "time": time.time()}) + "\n")
