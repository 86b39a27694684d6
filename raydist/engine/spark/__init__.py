"""The Spark side: what the engine asks of a SparkSession (``side``), its
classic and Connect implementations (``classic``, ``connect``, chosen by
``sides``), and what is the same for both (``session``: an embedded or
Connect session, executor capacity, resource profiles).

``embedded_session``, ``connect_session`` and ``active_session`` are also
reachable here, as they were before the engine had rooms."""

from __future__ import annotations

from typing import Any

__all__ = ["embedded_session", "connect_session", "active_session"]


def __getattr__(name: str) -> Any:
    if name in __all__:  # on use: a node's task imports this package without needing Spark's session helpers
        from raydist.engine.spark import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
