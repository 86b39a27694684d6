"""Ctrl-C during a run: the run stops, the caller gets KeyboardInterrupt, and
everything the session keeps stays usable for the next run.

Two handlers would otherwise answer SIGINT in the main thread:

- pyspark's SparkContext installs one that cancels *every* Spark job, the
  session cluster's node tasks included (the next run would wait for its
  nodes to come back);
- Ray Train's ``fit`` installs one that aborts its run, and leaves it
  installed after the run: a later Ctrl-C, with no run in progress, would ask
  a controller that no longer exists to abort and then call ``sys.exit``.

While a raydist run is in progress on the main thread, SIGINT raises
KeyboardInterrupt there (a fresh Ray Train run is also told to abort), the
run's own cleanup stops what it started, and afterwards the handler that was
there before (pyspark's, the user's) is back.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["keyboard_interrupts", "abort_on_interrupt"]


@contextlib.contextmanager
def keyboard_interrupts() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt for the block (main thread only), and
    the handler before it is back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        # None: a handler installed outside Python, which cannot be put back from here.
        signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)


def abort_on_interrupt(trainer: Any) -> None:
    """Make a Ray Train V2 trainer's own SIGINT handler (installed by its
    ``fit`` in the main thread) tell its controller to abort and raise
    KeyboardInterrupt at once, instead of waiting for the abort and exiting
    the process when the controller is gone."""

    def register(controller: Any) -> None:
        def on_sigint(signum: int, frame: Any) -> None:
            try:
                controller.abort.remote()
            except Exception:  # noqa: BLE001 - the controller or the connection is gone already
                pass
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)

    trainer._register_sigint_handler = register
