"""PyTorch DDP on a raydist cluster through Ray Train's ``TorchTrainer``."""

from __future__ import annotations

from typing import Any

from raydist.train._base import Facade

__all__ = ["TorchTrainer"]


class TorchTrainer(Facade):
    """Run ``train_fn(config)`` on ``workers`` Ray workers with
    ``torch.distributed`` set up (gloo on CPU, NCCL on GPUs).

    Args:
        train_fn: the per-worker function; it may call ``ray.train.report``.
        config: passed to ``train_fn``.
        workers: number of training workers.
        use_gpu: one GPU per worker.
        resources_per_worker: Ray resources per worker (default one CPU).
        run_config / failure_config / checkpoint_config: Ray Train's own.
        cluster: a raydist cluster handle or name; default: the Ray cluster
            this process is connected to, ``RAY_ADDRESS``, else the session
            cluster on the active SparkSession, kept warm between fits
            (:mod:`raydist.train.session`).
        keep_warm_s: how long a session cluster stays up after this fit
            (default 120 s; 0 tears it down at once).
        **trainer_kwargs: passed to ``ray.train.torch.TorchTrainer``
            (``datasets``, ``torch_config``...).

    Example:
        >>> result = TorchTrainer(train_fn, workers=2, cluster=c).fit()  # doctest: +SKIP
        >>> result.return_value  # doctest: +SKIP
    """

    def _ray_trainer_class(self) -> Any:
        from ray.train.torch import TorchTrainer as RayTorchTrainer

        return RayTorchTrainer
