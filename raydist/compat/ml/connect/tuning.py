"""[Experimental] ``pyspark.ml.connect.tuning``: pyspark's own, which needs no
distributor (see :mod:`raydist.compat.ml.connect`)."""

from pyspark.ml.connect.tuning import CrossValidator, CrossValidatorModel

__all__ = ["CrossValidator", "CrossValidatorModel"]
