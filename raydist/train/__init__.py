"""Thin facades over Ray Train V2 for PyTorch, DeepSpeed and TensorFlow.

Each builds the Ray Train trainer from a few arguments, connects to the right
raydist cluster, and returns Ray's ``Result``. Frameworks import on use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TorchTrainer", "DeepSpeedTrainer", "TensorflowTrainer", "configure_mlflow", "MlflowSettings"]

_WHERE = {
    "TorchTrainer": "raydist.train.torch",
    "DeepSpeedTrainer": "raydist.train.deepspeed",
    "TensorflowTrainer": "raydist.train.tensorflow",
    # MLflow from every rank (see raydist.train._mlflow).
    "configure_mlflow": "raydist.train._mlflow",
    "MlflowSettings": "raydist.train._mlflow",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'raydist.train' has no attribute {name!r}")
