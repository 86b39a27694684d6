"""DeepSpeed on a raydist cluster, inside Ray Train's ``TorchTrainer``.

Ray recommends running DeepSpeed in ``TorchTrainer``: Ray Train sets up
``torch.distributed``; DeepSpeed reuses that process group. This facade picks
the accelerator and backend (CPU with gloo, CUDA with NCCL), hands the
worker a ready config, and makes checkpoints go through Ray Train so that a
run resumes after a lost worker.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from raydist.errors import TrainingConfigError
from raydist.train._base import Facade

__all__ = ["DeepSpeedTrainer", "DeepSpeedContext", "load_deepspeed_config"]


def load_deepspeed_config(config: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """A DeepSpeed config as a dict, from a dict or a JSON file path."""
    if isinstance(config, Mapping):
        out = dict(config)
    else:
        path = Path(config)
        if not path.is_file():
            raise TrainingConfigError("deepspeed_config", str(config), "no such file; give a dict or a JSON file")
        try:
            out = json.loads(path.read_text())
        except ValueError as exc:
            raise TrainingConfigError("deepspeed_config", str(config), f"not valid JSON: {exc}") from exc
    stage = out.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise TrainingConfigError("deepspeed_config.zero_optimization.stage", stage, "expected 0, 1, 2 or 3")
    return out


class DeepSpeedContext:
    """What a DeepSpeed worker function receives besides its config.

    Attributes:
        config: the DeepSpeed config (a dict), ready for ``deepspeed.initialize``.
        use_gpu: whether this run trains on GPUs.
    """

    def __init__(self, config: dict[str, Any], use_gpu: bool) -> None:
        self.config = config
        self.use_gpu = use_gpu

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpu else "gloo"

    def initialize(self, model: Any, optimizer: Any = None, **kwargs: Any) -> tuple[Any, ...]:
        """``deepspeed.initialize`` with this run's config, accelerator and
        process group; returns what DeepSpeed returns (engine, optimizer, ...)."""
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if self.use_gpu else "cpu")
        import deepspeed

        deepspeed.init_distributed(dist_backend=self.backend)
        if optimizer is None and "optimizer" not in self.config and "model_parameters" not in kwargs:
            kwargs["model_parameters"] = model.parameters()
        return deepspeed.initialize(model=model, optimizer=optimizer, config=self.config, **kwargs)

    def save_checkpoint(
        self, engine: Any, metrics: Mapping[str, Any], client_state: Mapping[str, Any] | None = None
    ) -> None:
        """Save a DeepSpeed checkpoint (every rank's shard, with
        ``client_state`` such as the epoch) and report it to Ray Train.
        Every rank must call it: saving a ZeRO checkpoint is collective."""
        import ray.train

        with tempfile.TemporaryDirectory(prefix="raydist-ds-ckpt-") as tmp:
            engine.save_checkpoint(tmp, client_state=dict(client_state or {}))
            ray.train.report(dict(metrics), checkpoint=ray.train.Checkpoint.from_directory(tmp))

    def load_checkpoint(self, engine: Any) -> dict[str, Any] | None:
        """Restore the latest reported checkpoint into ``engine``; returns its
        client state, or None when the run starts fresh."""
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as directory:
            _, client_state = engine.load_checkpoint(directory)
        return client_state or {}


def _deepspeed_worker(
    user_fn: Callable[..., Any], ds_config: dict[str, Any], use_gpu: bool
) -> Callable[[dict[str, Any]], Any]:
    def run(config: dict[str, Any]) -> Any:
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if use_gpu else "cpu")
        return user_fn(config, DeepSpeedContext(ds_config, use_gpu))

    return run


class DeepSpeedTrainer(Facade):
    """Run ``train_fn(config, ds)`` with DeepSpeed on ``workers`` workers.

    ``ds`` is a :class:`DeepSpeedContext`: ``ds.config`` is the DeepSpeed
    config, ``ds.initialize(model, optimizer)`` calls ``deepspeed.initialize``
    with the right accelerator and backend, ``ds.save_checkpoint(engine,
    metrics)`` / ``ds.load_checkpoint(engine)`` go through Ray Train.

    Args:
        train_fn: the per-worker function, taking ``(config, ds)``.
        deepspeed_config: a dict or the path of a JSON file (ZeRO stages 0-3).
        Other arguments as :class:`raydist.train.TorchTrainer`.
    """

    def __init__(
        self, train_fn: Callable[..., Any], *, deepspeed_config: Mapping[str, Any] | str, **kwargs: Any
    ) -> None:
        super().__init__(train_fn, **kwargs)
        self.deepspeed_config = load_deepspeed_config(deepspeed_config)

    def _ray_trainer_class(self) -> Any:
        from ray.train.torch import TorchTrainer as RayTorchTrainer

        return RayTorchTrainer

    def _worker_fn(self) -> Callable[..., Any]:
        return _deepspeed_worker(self.train_fn, self.deepspeed_config, self.use_gpu)
