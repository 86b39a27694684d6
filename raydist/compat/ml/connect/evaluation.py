"""[Experimental] ``pyspark.ml.connect.evaluation``: pyspark's own, which needs no
distributor (see :mod:`raydist.compat.ml.connect`)."""

from pyspark.ml.connect.evaluation import (
    BinaryClassificationEvaluator,
    MulticlassClassificationEvaluator,
    RegressionEvaluator,
)

__all__ = ["RegressionEvaluator", "BinaryClassificationEvaluator", "MulticlassClassificationEvaluator"]
