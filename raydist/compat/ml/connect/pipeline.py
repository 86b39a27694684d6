"""[Experimental] ``pyspark.ml.connect.pipeline``: pyspark's own, which needs no
distributor (see :mod:`raydist.compat.ml.connect`)."""

from pyspark.ml.connect.pipeline import Pipeline, PipelineModel

__all__ = ["Pipeline", "PipelineModel"]
