"""A trained model's predictions as new columns, as Horovod's ``TorchModel``
and ``KerasModel`` add them in ``transform``.

Each output column holds what the model gives for its label: a number typed
as the label's column (rounded for whole-number labels), or a Spark ML
``DenseVector`` where the model gives several values per row (class scores
for a scalar label, say) or the label is a vector. The model runs in a
pandas UDF on the executors (classic and Connect alike), rebuilt once per
batch of rows from its bytes; ``run`` (a module-level function, pickled by
name) turns the model and the rows' feature columns into its outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from raydist.compat.horovod.spark.common import _data

__all__ = ["add_predictions"]

_INTEGRAL = {"tinyint", "smallint", "int", "bigint"}

#: (model, feature columns as pandas Series, input shapes) -> one 2-D numpy array per output.
Runner = Callable[[Any, Sequence[Any], Sequence[Any]], list[Any]]


def add_predictions(df: Any, *, model: Any, run: Runner, feature_cols: list[str], input_shapes: Any,
                    label_cols: list[str], output_cols: list[str], label_types: dict[str, str]) -> Any:
    """``df`` with one prediction column per label, named by ``output_cols``."""
    import pandas as pd
    from pyspark import cloudpickle
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    shapes = list(input_shapes or [None] * len(feature_cols))
    kinds = _data.column_kinds(df, feature_cols, "feature_cols")
    features = _data.as_arrays(kinds)
    # Which outputs are vectors: the model's answer for one row says (Horovod asks it the same way).
    probe = df.select(*[f.alias(f"f{i}") for i, f in enumerate(features)]).limit(1).toPandas()
    widths = [o.shape[1] for o in run(model, [probe[f"f{i}"] for i in range(len(features))], shapes)] \
        if len(probe) else [1] * len(label_cols)
    as_vector = [w > 1 or label_types.get(label) == "vector" for w, label in zip(widths, label_cols, strict=False)]
    fields = ", ".join(f"o{i} array<double>" if vec else f"o{i} double" for i, vec in enumerate(as_vector))
    blob = cloudpickle.dumps(model)

    def predict(*columns):  # type: ignore[no-untyped-def]
        outs = run(cloudpickle.loads(blob), columns, shapes)
        return pd.DataFrame({f"o{i}": list(o) if vec else o[:, 0]
                             for i, (o, vec) in enumerate(zip(outs, as_vector, strict=False))})

    # pandas_udf reads the kind of UDF from real types (this module's annotations are strings).
    predict.__annotations__ = {"columns": pd.Series, "return": pd.DataFrame}
    predict = pandas_udf(predict, f"struct<{fields}>")  # type: ignore[call-overload]

    marker = "__raydist_predictions"
    out = df.withColumn(marker, predict(*features))
    for i, (name, label, vec) in enumerate(zip(output_cols, label_cols, as_vector, strict=False)):
        value = F.col(f"{marker}.o{i}")
        if vec:
            value = array_to_vector(value)
        elif label_types.get(label) in _INTEGRAL:
            value = F.round(value).cast(label_types[label])
        elif label_types.get(label) not in (None, "vector"):
            value = value.cast(label_types[label])
        out = out.withColumn(name, value)
    return out.drop(marker)
