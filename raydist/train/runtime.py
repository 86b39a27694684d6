"""What the drop-in classes (:mod:`raydist.compat`) build on: the public seam
between them and the training runtime's private modules.

``raydist.compat`` imports from here only, so the runtime's modules can be
split, renamed or rewritten without touching the compat layer, and this list
says exactly what the compat layer relies on.
"""

from __future__ import annotations

from raydist.train._env import scoped_env
from raydist.train._inputs import FrameInputs, RankInputs
from raydist.train._keras2 import use_keras2_everywhere
from raydist.train._mlflow import tracked_run
from raydist.train._resources import driver_gpus, run_shape, spark_gives_tasks_gpus, spark_task_resources
from raydist.train._signals import keyboard_interrupts
from raydist.train._torchrun import TorchrunTrainer
from raydist.train.session import DEFAULT_KEEP_WARM_S, TrainingSession, training_session
from raydist.train.session_rules import gpu_run_shape
from raydist.train.spark_tasks import run_in_spark_tasks

__all__ = [
    "DEFAULT_KEEP_WARM_S",
    "FrameInputs",
    "RankInputs",
    "TorchrunTrainer",
    "TrainingSession",
    "driver_gpus",
    "gpu_run_shape",
    "keyboard_interrupts",
    "run_in_spark_tasks",
    "run_shape",
    "scoped_env",
    "spark_gives_tasks_gpus",
    "spark_task_resources",
    "tracked_run",
    "training_session",
    "use_keras2_everywhere",
]
