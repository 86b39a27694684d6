"""How long to wait before trying again: ``first`` seconds, doubling to ``most``.

One rule for every retry loop raydist keeps (a control-plane call that met a
restarting server, a Spark that would not start, a worker node's job
submitted again, a listener out of file descriptors), so each says only its
bounds.
"""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Waits of ``first`` seconds, then twice as long each time, at most ``most``."""

    def __init__(self, first: float, most: float) -> None:
        if not 0 < first <= most:
            raise ValueError(f"a backoff from first={first!r} to most={most!r} seconds: 0 < first <= most")
        self.first = first
        self.most = most
        self._tries = 0

    def after(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (1 or more; pure)."""
        return min(self.most, self.first * 2 ** min(max(failures, 1) - 1, 62))

    def next(self) -> float:
        """The wait after one more failure."""
        self._tries += 1
        return self.after(self._tries)

    def reset(self) -> None:
        """It worked: the next failure waits ``first`` again."""
        self._tries = 0
