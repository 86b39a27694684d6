"""The control plane's SparkSession: started in the background, retried, watched, replaced.

Spark takes seconds to start and may not start at all (a master that is not
there yet); its driver JVM may die under a running server (killed, out of
memory). :class:`SparkHost` is the one owner of the session: it starts it
with backoff, says why while it cannot, answers whether it still lives, and
lets go of a dead one so that the next is new.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from raydist.backoff import Backoff
from raydist.errors import ControlPlaneUnavailableError

__all__ = ["SparkHost"]

log = logging.getLogger(__name__)


class SparkHost:
    """Owns one SparkSession of the server, made by ``factory``: the control
    plane's own, or a tenant's (``label`` names it in errors)."""

    def __init__(self, factory: Callable[[], Any], label: str = "the control plane's Spark") -> None:
        self._factory = factory
        self.label = label
        self._spark: Any = None
        self._lock = threading.Lock()
        self.error = ""  # why Spark does not run now ("" once it does)
        self._info = ("", "")  # (master, UI URL), read once per session off the event loop

    @property
    def session(self) -> Any:
        """The SparkSession; waits while it starts. While it cannot start,
        ControlPlaneUnavailableError with the reason (:meth:`start` keeps
        trying)."""
        with self._lock:
            if self._spark is None:
                if self.error:
                    raise ControlPlaneUnavailableError(
                        f"{self.label} is not running ({self.error}); it is retried, try again shortly")
                self._spark = self._factory()
                self._info = _info_of(self._spark)
            return self._spark

    def start(self, on_state: Callable[[bool, str], None], stop: threading.Event) -> None:
        """Start Spark, retrying with backoff (1 s, doubling, at most 30 s)
        until it runs or ``stop`` is set; ``on_state(running, reason)`` after
        each attempt. Blocks: run it in a thread of its own."""
        delays = Backoff(1.0, 30.0)
        while not stop.is_set():
            wait = 0.0
            with self._lock:
                if self._spark is not None or stop.is_set():
                    return
                try:
                    self._spark = self._factory()
                    self._info = _info_of(self._spark)
                    self.error = ""
                except Exception as exc:  # noqa: BLE001 - reported, then retried
                    self.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                    wait = delays.next()
                    log.warning("%s did not start (%s); retrying in %g s", self.label, self.error, wait)
            on_state(self._spark is not None, self.error)
            if self._spark is not None or stop.wait(wait):
                return

    @property
    def started(self) -> bool:
        """Whether a session runs now (False while none was made, or after :meth:`lose`)."""
        return self._spark is not None

    def alive(self) -> bool:
        """Whether the session still runs (True while it starts: that is not a death)."""
        spark = self._spark
        if spark is None:
            return True
        from raydist.engine.spark.sides import side_of

        return side_of(spark).alive()

    def lose(self, why: str) -> Any:
        """Forget the session (returned: the caller stops or discards it);
        until :meth:`start` makes another, :attr:`session` says ``why``. A
        start in progress finishes first."""
        with self._lock:
            spark, self._spark = self._spark, None
            self._info = ("", "")
            self.error = self.error or why
        return spark

    def info(self) -> tuple[str, str]:
        """(master, UI URL) of the Spark target; empty while Spark starts.
        Read when the session started, never now: a call on the event loop
        must not wait on a py4j call or a Connect round trip (a hung JVM
        would freeze every RPC and health check)."""
        return self._info


def _info_of(spark: Any) -> tuple[str, str]:
    """(master, UI URL) of ``spark``, asked once, as it starts."""
    from raydist.engine.spark.sides import side_of

    try:
        side = side_of(spark)
        return side.master, side.ui_url
    except Exception:  # noqa: BLE001 - the info is a courtesy; Spark's own health is watched elsewhere
        log.warning("could not read the Spark master and UI address", exc_info=True)
        return "", ""
