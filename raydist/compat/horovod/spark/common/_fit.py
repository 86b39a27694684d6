"""What every Horovod estimator's fit does around its ranks, whatever the
framework inside them: the checkpoint a run_id left in the Store, the
DataFrame made ready and handed to one rank a partition through raydist's
``TorchDistributor`` (on the warm session cluster, with the Backend's
environment), each rank's rows read back, and the label types a model's
``transform`` casts its predictions to."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raydist.compat.horovod.spark.common import _data

__all__ = ["kept_checkpoint", "label_types", "rank_rows", "spark_has_gpus", "train_ranks"]


@dataclass
class RankData:
    """What every framework's rank reads the same way: the DataFrame's
    columns, the inputs' shapes, and the loop's sizes. Each estimator's rank
    spec extends it with what its framework needs."""

    feature_cols: list[str]
    label_cols: list[str]
    input_shapes: list[list[int] | None]
    sample_weight_col: str | None
    batch_size: int
    val_batch_size: int
    epochs: int
    train_steps_per_epoch: int | None
    validation_steps_per_epoch: int | None
    shuffle: bool
    random_seed: int | None
    verbose: int


def rank_data(estimator: Any, input_shapes: list[Any] | None = None) -> dict[str, Any]:
    """:class:`RankData`'s fields from an estimator's parameters (Horovod's
    defaults: the validation batch is the training batch; no shapes given,
    each feature as its column stacks)."""
    feature_cols = list(estimator.getFeatureCols())
    shapes = input_shapes if input_shapes is not None else (estimator.getInputShapes() or [None] * len(feature_cols))
    return {
        "feature_cols": feature_cols, "label_cols": list(estimator.getLabelCols()),
        "input_shapes": [None if s is None else list(s) for s in shapes],
        "sample_weight_col": estimator.getSampleWeightCol(), "batch_size": estimator.getBatchSize(),
        "val_batch_size": estimator.getValBatchSize() or estimator.getBatchSize(), "epochs": estimator.getEpochs(),
        "train_steps_per_epoch": estimator.getTrainStepsPerEpoch(),
        "validation_steps_per_epoch": estimator.getValidationStepsPerEpoch(),
        "shuffle": bool(estimator.getShuffle()), "random_seed": estimator.getRandomSeed(),
        "verbose": int(estimator.getVerbose() or 0),
    }


def kept_checkpoint(store: Any, run_id: str, filename: str, verbose: Any) -> tuple[str | None, bytes | None]:
    """Where rank 0 checkpoints run ``run_id`` in ``store`` (None without a
    Store), and what a fit of that run_id before left there, to resume from."""
    if store is None:
        return None, None
    path = os.path.join(store.get_checkpoint_path(run_id), filename)
    if not store.exists(path):
        return path, None
    if verbose:
        print(f"Resuming training from last checkpoint: {path}")
    return path, store.read(path)


def train_ranks(estimator: Any, df: Any, train_rank: Callable[[Any], Any], spec: Any, num_proc: int) -> Any:
    """``train_rank(spec)`` on ``num_proc`` ranks, each with its partition of
    ``df`` made ready for ``spec``'s columns (``estimator``'s validation,
    seed, Backend and ``use_gpu``); rank 0's answer."""
    from raydist.compat.torch_distributor import TorchDistributor
    from raydist.train.runtime import scoped_env

    prepared = _data.prepare(df, feature_cols=spec.feature_cols, label_cols=spec.label_cols,
                             sample_weight_col=spec.sample_weight_col, validation=estimator.getValidation(),
                             seed=estimator.getRandomSeed(), partitions=num_proc)
    distributor = TorchDistributor(num_processes=num_proc, local_mode=False,
                                   use_gpu=bool(estimator.getUseGpu()) and spark_has_gpus(df))
    backend = estimator.getBackend()
    with scoped_env(backend.env() if backend is not None else {}):
        return distributor._train_on_dataframe(train_rank, prepared, spec)


def rank_rows(transformation_fn: Callable[[Any], Any] | None) -> tuple[Any, Any, bool]:
    """In a rank: its rows (the Arrow stream pyspark's task would write) as
    pandas, after ``transformation_fn``, split into (training rows,
    validation rows, whether the DataFrame marked any row for validation)."""
    import pyarrow as pa

    with open(os.environ["SPARK_PARTITION_ARROW_DATA_FILE"], "rb") as f:
        rows = pa.ipc.open_stream(f).read_all().to_pandas()
    if transformation_fn is not None:
        rows = transformation_fn(rows)
    if _data.VALIDATION_COLUMN not in rows:
        return rows, rows.iloc[0:0], False
    validating = rows.pop(_data.VALIDATION_COLUMN).astype(bool)
    return rows[~validating], rows[validating], True


def spark_has_gpus(df: Any) -> bool:
    """Whether Spark gives its tasks GPUs: Horovod's ``use_gpu=True`` (its
    default) uses a GPU where a rank has one and runs on CPU where none does."""
    try:
        amount = df.sparkSession.conf.get("spark.task.resource.gpu.amount", None)
    except Exception:  # noqa: BLE001 - a session that cannot say has none to give
        return False
    try:
        return bool(amount) and float(amount) > 0
    except ValueError:
        return False


def label_types(df: Any, label_cols: list[str]) -> dict[str, str]:
    """Each label column's type as ``transform`` casts its prediction: "vector" or Spark's simple string."""
    types = {f.name: f.dataType for f in df.schema.fields}
    return {c: "vector" if _data.is_vector(types[c]) else types[c].simpleString() for c in label_cols}
