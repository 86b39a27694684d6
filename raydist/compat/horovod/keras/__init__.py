"""``horovod.keras``: the same API as ``horovod.tensorflow.keras``."""

from __future__ import annotations

from raydist.compat.horovod.tensorflow.keras import *  # noqa: F403
from raydist.compat.horovod.tensorflow.keras import (
    __all__,  # noqa: F401
    callbacks,  # noqa: F401
)
