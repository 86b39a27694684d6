"""A DataFrame made ready for an estimator's ranks, and predictions added back.

On the driver, in Spark (classic or Connect): the columns the model reads
(features, labels, sample weights) selected, Spark ML vectors turned into
arrays (what Arrow carries), the validation rows marked (a column of the
DataFrame, or a random fraction), and the rows dealt into one partition per
rank. Each rank then gets its partition through raydist's
``TorchDistributor._train_on_dataframe``: read in its own Spark task where
the run is in Spark's tasks, as Arrow through Ray's object store where it is
on the session cluster; no files either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raydist.errors import DataFormatError, TrainingConfigError

__all__ = ["prepare", "column_kinds", "as_arrays", "is_vector", "VALIDATION_COLUMN"]

#: The column that marks a prepared row as a validation row.
VALIDATION_COLUMN = "__raydist_validation"


def is_vector(data_type: Any) -> bool:
    """A Spark ML vector column (``VectorUDT``), on a classic or a Connect session."""
    return type(data_type).__name__ == "VectorUDT"


def column_kinds(df: Any, columns: Sequence[str], field: str) -> dict[str, str]:
    """Each column's kind ("vector", "array" or "scalar"); a missing column or
    one no tensor can hold is refused naming ``field``, the column and its type."""
    from pyspark.sql.types import ArrayType, BooleanType, NumericType

    types = {f.name: f.dataType for f in df.schema.fields}
    kinds = {}
    for name in columns:
        if name not in types:
            raise TrainingConfigError(field, name, f"no such column; the DataFrame has {sorted(types)}")
        kind = types[name]
        if is_vector(kind):
            kinds[name] = "vector"
        elif isinstance(kind, ArrayType) and isinstance(kind.elementType, (NumericType, BooleanType)):
            kinds[name] = "array"
        elif isinstance(kind, (NumericType, BooleanType)):
            kinds[name] = "scalar"
        else:
            raise DataFormatError(f"column {name!r} ({field}) is {kind.simpleString()}: a model reads numbers, "
                                  f"arrays of numbers or Spark ML vectors; convert it first")
    return kinds


def as_arrays(kinds: dict[str, str]) -> list[Any]:
    """The columns of ``kinds`` as Spark expressions, vectors turned into arrays (what Arrow carries)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    return [vector_to_array(F.col(c)).alias(c) if kind == "vector" else F.col(c) for c, kind in kinds.items()]


def prepare(df: Any, *, feature_cols: Sequence[str], label_cols: Sequence[str], sample_weight_col: str | None,
            validation: Any, seed: int | None, partitions: int) -> Any:
    """``df`` as the ranks read it: the model's columns (vectors as arrays),
    the validation mark, ``partitions`` partitions."""
    from pyspark.sql import functions as F

    kinds = column_kinds(df, feature_cols, "feature_cols") | column_kinds(df, label_cols, "label_cols")
    if sample_weight_col:
        kinds |= column_kinds(df, [sample_weight_col], "sample_weight_col")
    selected = as_arrays(kinds)
    if isinstance(validation, str) and validation:
        column_kinds(df, [validation], "validation")
        selected.append(F.col(validation).cast("boolean").alias(VALIDATION_COLUMN))
    elif isinstance(validation, float) and not isinstance(validation, bool) and 0 < validation < 1:
        selected.append((F.rand(seed) < F.lit(validation)).alias(VALIDATION_COLUMN))
    elif validation not in (None, 0, 0.0):
        raise TrainingConfigError("validation", validation, "expected a column name (true marks a validation row) "
                                                            "or a fraction between 0 and 1")
    return df.select(*selected).repartition(partitions)
