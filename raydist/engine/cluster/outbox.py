"""Handing a cluster's events to its listener, off the cluster's lock.

A cluster records events while holding its own lock (a node came up, the
state changed). Its listener (the control plane's manager) takes a lock of
its own and reads the cluster's status, which takes the cluster's lock:
called in place, the two locks would be taken in both orders and two
threads could deadlock. The :class:`Outbox` is the one owner of delivery:
events go in under any lock, and one thread of its own calls the listener,
in order, holding none.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["Outbox"]

log = logging.getLogger(__name__)

Listener = Callable[[str, str], None]


class Outbox:
    """Events (state, message) for ``listener``, delivered in order by one
    thread, started with the first event and ended by :meth:`close`."""

    def __init__(self, listener: Listener, name: str) -> None:
        self._listener = listener
        self._name = name
        self._queue: queue.SimpleQueue[tuple[str, str] | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()

    def put(self, state: str, message: str) -> None:
        """Queue an event (safe under any lock: it never blocks)."""
        with self._lock:
            if self._closed:
                log.debug("%s: event after close dropped: %s", self._name, message)
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._deliver, name=f"{self._name}-events", daemon=True)
                self._thread.start()
            self._queue.put((state, message))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event put so far was delivered; False on timeout."""
        with self._lock:
            if self._thread is None or self._closed or self._thread is threading.current_thread():
                return True  # nothing to wait for (or called by a listener: it would wait for itself)
            done = threading.Event()
            self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued, then end the thread; later events are dropped."""
        self.flush(timeout)
        with self._lock:
            self._closed = True
            if self._thread is not None:
                self._queue.put(None)

    def _deliver(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._listener(*item)
            except Exception:  # noqa: BLE001 - a listener must not break the cluster
                log.exception("%s: event listener failed", self._name)
