"""Settings for the runs raydist starts, and environment for code run here.

Ray Train V2 hands a run's controller, and through it the workers, the
``RAY_TRAIN_*`` variables the driver's environment holds when the run starts.
raydist's own choices for its runs (a faster health-check poll, no
preemption watcher) take that same road, but from the context of the thread
that starts the run (:func:`run_settings`), never from ``os.environ``: two
threads starting runs at once, and a user's own Ray Train run beside them,
each get exactly their own settings. A variable the user set in the
environment wins over raydist's choice.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import types
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["RUN_ENV", "run_settings", "scoped_env"]

#: Ray Train settings for the runs raydist starts, unless the user set them.
#: ``report()`` waits on the controller's health-check poll, 2 s by default:
#: raydist polls at 0.2 s. The preemption watcher (one more actor process per
#: run) reads the drain notices a cloud provider gives Ray's nodes; raydist's
#: nodes are Spark tasks, which get none.
RUN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}

_NONE: Mapping[str, str] = types.MappingProxyType({})
_settings: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar("raydist_run_settings", default=_NONE)
_installed = threading.Lock()
_done = False


@contextlib.contextmanager
def run_settings(values: Mapping[str, str]) -> Iterator[None]:
    """Give the Ray Train runs this thread starts in the block ``values``
    (``RAY_TRAIN_*`` variables), on top of the settings already in force.
    A thread the block starts gets them when it runs in a copy of this
    context (``contextvars.copy_context().run``)."""
    _install()
    token = _settings.set({**_settings.get(), **values})
    try:
        yield
    finally:
        _settings.reset(token)


def _install() -> None:
    """Have Ray Train add this context's settings to what it propagates to a
    run's controller (once per process; with no settings in force, Ray
    Train's behaviour is unchanged)."""
    global _done
    with _installed:
        if _done:
            return
        from ray.train.v2.api import data_parallel_trainer as dpt

        original = dpt.get_env_vars_to_propagate

        def get_env_vars_to_propagate() -> dict[str, Any]:
            env = original()  # the variables the user set
            for key, value in _settings.get().items():
                env.setdefault(key, value)
            return env

        dpt.get_env_vars_to_propagate = get_env_vars_to_propagate
        _done = True


@contextlib.contextmanager
def scoped_env(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then put back what was
    there. Only for code that runs in this process, on the caller's thread,
    where the original sets the environment the same way
    (``MirroredStrategyRunner``'s local mode hides GPUs so)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, before in saved.items():
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before
