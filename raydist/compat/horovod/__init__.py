"""[Experimental] Horovod programs on raydist, with nothing to compile.

* :mod:`raydist.compat.horovod.torch`: Horovod's PyTorch API on
  ``torch.distributed`` (``import raydist.compat.horovod.torch as hvd``);
* :func:`raydist.compat.horovod.spark.run`: ``horovod.spark.run``'s
  signature and result (every rank's return value, in rank order);
* :class:`raydist.compat.HorovodRunner`: sparkdl's ``HorovodRunner``;
* :mod:`raydist.compat.horovod.spark.torch`: Horovod's Spark ``TorchEstimator``
  (with :mod:`~raydist.compat.horovod.spark.common.store` and ``.backend``);
* :func:`use_horovod_alias`: ``import horovod.torch as hvd`` resolves to
  raydist's in this process (both runners turn it on in their workers).
"""

from __future__ import annotations

from raydist.compat.horovod._alias import use_horovod_alias

__all__ = ["use_horovod_alias"]
