"""Who gets a place when strangers may connect: caps in all and per address.

Every listener a stranger can reach (the driver's node channel, a head's
relay, the data agent) holds each new connection in a place until it proves
itself, and has a bounded number of places: :class:`Places` caps them in all
and per address, so one host cannot take every place. When ``accept`` itself
fails (out of file descriptors), each waits a :class:`~raydist.backoff.Backoff`
before trying again, so a listener that stays readable is not spun on.
"""

from __future__ import annotations

import threading

__all__ = ["Places"]


class Places:
    """At most ``total`` connections held at once, and ``per_source`` from one
    address (a connection with no known address counts toward the total
    only). Thread-safe."""

    def __init__(self, total: int, per_source: int) -> None:
        self.total = total
        self.per_source = per_source
        self._held: dict[str | None, int] = {}
        self._lock = threading.Lock()

    def take(self, source: str | None) -> bool:
        """A place for a connection from ``source``; False when full (refuse it)."""
        with self._lock:
            if sum(self._held.values()) >= self.total:
                return False
            mine = self._held.get(source, 0)
            if source is not None and mine >= self.per_source:
                return False
            self._held[source] = mine + 1
            return True

    def give_back(self, source: str | None) -> None:
        """The connection from ``source`` left its place."""
        with self._lock:
            left = self._held.get(source, 0) - 1
            if left > 0:
                self._held[source] = left
            else:
                self._held.pop(source, None)

    def held(self, source: str | None = None) -> int:
        """Places held by ``source``, or by everyone."""
        with self._lock:
            return self._held.get(source, 0) if source is not None else sum(self._held.values())
