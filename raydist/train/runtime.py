"""What the drop-in classes (:mod:`raydist.compat`) build on: the public seam
between them and the training runtime's private modules.

``raydist.compat`` imports from here only, so the runtime's modules can be
split, renamed or rewritten without touching the compat layer, and this list
says exactly what the compat layer relies on.
"""

from __future__ import annotations

from raydist.train._env import scoped_env
from raydist.train._fork import keep_destroyed_groups
from raydist.train._keras2 import use_keras2_everywhere
from raydist.train._signals import keyboard_interrupts
from raydist.train.resident import TORCHRUN_PRIORITY_ENV
from raydist.train.session import DEFAULT_KEEP_WARM_S, TrainingSession, training_session

__all__ = [
    "DEFAULT_KEEP_WARM_S",
    "TORCHRUN_PRIORITY_ENV",
    "TrainingSession",
    "keep_destroyed_groups",
    "keyboard_interrupts",
    "scoped_env",
    "training_session",
    "use_keras2_everywhere",
]
