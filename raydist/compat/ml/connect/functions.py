"""[Experimental] ``pyspark.ml.connect.functions``: pyspark's own, which needs no
distributor (see :mod:`raydist.compat.ml.connect`)."""

from pyspark.ml.connect.functions import array_to_vector, predict_batch_udf, vector_to_array

__all__ = ["vector_to_array", "array_to_vector", "predict_batch_udf"]
