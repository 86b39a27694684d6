"""Environment variables set for the length of a block, then put back."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def scoped_env(values: Mapping[str, str], *, keep_existing: bool = False) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block; afterwards each
    variable is back to what it was (or unset). With ``keep_existing`` a
    variable the user already set keeps the user's value.

    Ray Train reads some settings (``RAY_TRAIN_*``) from the driver's
    environment when a run's controller starts; this scopes raydist's
    choices to the runs it starts."""
    saved = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if not (keep_existing and saved[key] is not None):
            os.environ[key] = value
    try:
        yield
    finally:
        for key, before in saved.items():
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before
