"""Which :class:`~raydist.engine.spark.side.SparkSide` a SparkSession gets.

The base interface (:mod:`raydist.engine.spark.side`) knows no implementation;
this module knows them all (classic, Connect) and picks by the session's
type, one side per session. A session object may also bring its own side (a
``raydist_side()`` method): how the scale benchmark runs the real engine on
simulated Spark, and how a deployment could plug in another kind.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from raydist.engine.spark.classic import ClassicSide
from raydist.engine.spark.connect import ConnectSide
from raydist.engine.spark.side import SparkSide, is_connect

__all__ = ["side_of"]

_sides: weakref.WeakKeyDictionary[Any, SparkSide] = weakref.WeakKeyDictionary()
_sides_lock = threading.Lock()


def side_of(spark: Any) -> SparkSide:
    """The engine's view of ``spark``, one per session."""
    with _sides_lock:
        side = _sides.get(spark)
        if side is None:
            own = getattr(spark, "raydist_side", None)
            if callable(own):
                side = own()
            elif is_connect(spark):
                side = ConnectSide(spark)
            else:
                side = ClassicSide(spark)
            _sides[spark] = side
        return side
