"""TensorFlow/Keras on a raydist cluster through Ray Train's ``TensorflowTrainer``.

Keras 3 (``import keras``, and the default ``tf.keras`` of TensorFlow 2.16+)
crashes in ``model.fit`` under ``MultiWorkerMirroredStrategy`` with
``ValueError: Attempt to convert a value (PerReplica:...) to a Tensor`` — a
Keras bug that happens without Ray too (keras-team/keras#20585,
ray-project/ray#47464). raydist's default is legacy Keras 2 (the
``tf-keras`` package) under both names: ``TF_USE_LEGACY_KERAS=1`` in every
training worker before TensorFlow loads gives it to ``tf.keras``, and
:mod:`raydist.train._keras2` gives it to ``import keras``. Stock
``model.fit`` code then runs under the strategy unchanged. Pass
``legacy_keras=False`` to get Keras 3 anyway (custom training loops work
there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from raydist.train._base import Facade

__all__ = ["TensorflowTrainer", "KERAS_ENV"]

#: Environment of every TensorFlow training worker under the default.
KERAS_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def _with_keras2(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with Keras 2 under both names; takes the config only if ``fn``
    does (Ray Train calls a function without parameters without it)."""
    import inspect

    takes_config = bool(inspect.signature(fn).parameters)

    def run(config: Any) -> Any:
        from raydist.train._keras2 import use_keras2_everywhere

        use_keras2_everywhere()
        return fn(config) if takes_config else fn()

    return run


class TensorflowTrainer(Facade):
    """Run ``train_fn(config)`` on ``workers`` workers with ``TF_CONFIG`` set,
    so ``tf.distribute.MultiWorkerMirroredStrategy()`` spans them.

    Args:
        legacy_keras: run workers with Keras 2 (``tf-keras``); see the module
            docstring for why this is the default.
        tensorflow_config: a Ray Train backend config to use instead of
            raydist's (which sets ``TF_CONFIG`` as Ray's ``TensorflowConfig``
            does, without importing TensorFlow outside the workers).
        Other arguments as :class:`raydist.train.TorchTrainer`.
    """

    def __init__(self, train_fn: Callable[..., Any], *, legacy_keras: bool = True, **kwargs: Any) -> None:
        backend = kwargs.pop("tensorflow_config", None)  # the name Ray's TensorflowTrainer gives it
        if backend is not None:
            kwargs["backend_config"] = backend
        super().__init__(train_fn, **kwargs)
        self.legacy_keras = legacy_keras

    def _ray_trainer_class(self) -> Any:
        # Ray Train's DataParallelTrainer with raydist's TfConfig, which is what
        # ray.train.tensorflow.TensorflowTrainer is, less the TensorFlow import
        # its package does in this process and in every run's TrainController
        # (raydist.train._tf_backend says why that matters).
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        return DataParallelTrainer

    def _extra_kwargs(self) -> dict[str, Any]:
        if "backend_config" in self.trainer_kwargs:
            return {}
        from raydist.train._tf_backend import TfConfig

        return {"backend_config": TfConfig()}

    def _worker_fn(self) -> Callable[..., Any]:
        return _with_keras2(self.train_fn) if self.legacy_keras else self.train_fn

    def build_run_config(self) -> Any:
        run = super().build_run_config()
        if not self.legacy_keras:
            return run
        runtime_env = dict(run.worker_runtime_env or {})
        env_vars = {**KERAS_ENV, **dict(runtime_env.get("env_vars", {}))}
        runtime_env["env_vars"] = env_vars
        return dataclasses.replace(run, worker_runtime_env=runtime_env)
