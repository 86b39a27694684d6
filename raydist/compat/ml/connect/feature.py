"""[Experimental] ``pyspark.ml.connect.feature``: pyspark's own, which needs no
distributor (see :mod:`raydist.compat.ml.connect`)."""

from pyspark.ml.connect.feature import (
    ArrayAssembler,
    MaxAbsScaler,
    MaxAbsScalerModel,
    StandardScaler,
    StandardScalerModel,
)

__all__ = ["MaxAbsScaler", "MaxAbsScalerModel", "StandardScaler", "StandardScalerModel", "ArrayAssembler"]
