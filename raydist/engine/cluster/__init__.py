"""The cluster: :class:`RayCluster` and what it is made of.

``handle`` is the user's handle; ``lifecycle`` starts, resizes and tears it
down; ``router`` turns node-link events into the cluster's state; ``states``
is the pure state machine they share; ``head``, ``slot`` and ``node_jobs``
are the head, the worker nodes' places and the Spark jobs that run them;
``scaler`` follows Ray's demand; ``outbox`` hands events to a listener.

``from raydist.engine.cluster import RayCluster`` loads the handle on use,
so a Spark task that needs only a slot's helpers never imports the rest."""

from __future__ import annotations

from typing import Any

__all__ = ["RayCluster", "HEAD_PORTS"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from raydist.engine.cluster import handle

        return getattr(handle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
