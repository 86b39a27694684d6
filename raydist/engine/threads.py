"""Background threads raydist starts, marked as raydist's own.

Some work happens on threads the user never sees: a session cluster retired
when it idles, a cluster torn down because its head died. Such a thread must
not change what the user's threads see of the process (``os.environ``):
another thread may read it at that instant, and C code reading the
environment while it changes can crash the process. Work started through
:func:`spawn` runs marked, and :func:`on_raydist_thread` tells the code that
owns the process environment (:mod:`raydist.engine.connection`) to leave
that change for the next call on a user's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["spawn", "on_raydist_thread"]

_marks = threading.local()


def spawn(target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
    """Start ``target(*args)`` on a daemon thread named ``name``, marked as raydist's own."""

    def run() -> None:
        _marks.raydist = True
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def on_raydist_thread() -> bool:
    """Whether the calling thread was started by :func:`spawn`."""
    return bool(getattr(_marks, "raydist", False))
