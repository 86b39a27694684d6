"""What each rank of a Lightning ``TorchEstimator`` fit runs.

Each rank reads its own rows (the partition raydist's ``TorchDistributor``
hands it) and runs a PyTorch Lightning ``Trainer`` over them, one process a
Lightning node (the ranks are the job's processes already: Lightning is told
who each is, it starts nothing), DDP over the job's ``MASTER_ADDR`` (gloo on
CPU, NCCL on GPU). Batches are what Horovod's data module gives
``training_step``: a dict of tensors keyed by column name, features in their
``input_shapes``. Every rank takes the same number of steps an epoch (its
rows repeated), as DDP needs. Rank 0 checkpoints to the Store at the end
(``runs/<run_id>/checkpoint.ckpt``, Lightning's own format: a later fit with
that ``run_id`` resumes from it) and returns the weights and the metrics
logged last (Horovod's ``getHistory()`` for Lightning).
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from raydist.compat.horovod.spark.common._fit import RankData, rank_rows
from raydist.compat.horovod.spark.torch._remote import column_tensor

__all__ = ["LightningRankSpec", "train_rank"]


@dataclass
class LightningRankSpec(RankData):
    """Everything a rank needs, built by the estimator on the driver."""

    model: Any
    callbacks: list[Any]
    logger: Any
    log_every_n_steps: int
    profiler: Any
    trainer_args: dict[str, Any]
    transformation_fn: Any
    checkpoint_file: str | None
    store: Any = None
    resume: bytes | None = None


def _environment() -> Any:
    """Lightning's view of this process: a node of one process among
    WORLD_SIZE, started by the job (Lightning starts nothing)."""
    from pytorch_lightning.plugins.environments import ClusterEnvironment

    class JobRanks(ClusterEnvironment):
        @property
        def creates_processes_externally(self) -> bool:
            return True

        @property
        def main_address(self) -> str:
            return os.environ["MASTER_ADDR"]

        @property
        def main_port(self) -> int:
            return int(os.environ["MASTER_PORT"])

        @staticmethod
        def detect() -> bool:
            return True

        def world_size(self) -> int:
            return int(os.environ["WORLD_SIZE"])

        def set_world_size(self, size: int) -> None:
            pass  # the job's

        def global_rank(self) -> int:
            return int(os.environ["RANK"])

        def set_global_rank(self, rank: int) -> None:
            pass  # the job's

        def local_rank(self) -> int:
            return 0  # one process a Lightning node: its one device is its index 0

        def node_rank(self) -> int:
            return int(os.environ["RANK"])

    return JobRanks()


def _loader(spec: LightningRankSpec, rows: Any, batch: int, steps: int, shuffle: bool, seed: int) -> Any:
    """``steps`` batches of dicts {column: tensor}, the rows repeated (and reshuffled each pass) to fill them."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    columns = {c: column_tensor(rows[c]) for c in [*spec.feature_cols, *spec.label_cols]}
    if spec.sample_weight_col:
        columns[spec.sample_weight_col] = column_tensor(rows[spec.sample_weight_col])
    for c, shape in zip(spec.feature_cols, spec.input_shapes, strict=True):
        if shape is not None:
            columns[c] = columns[c].reshape(shape)
    count = len(rows)
    generator = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(count, generator=generator) if shuffle else torch.arange(count)
                       for _ in range(math.ceil(steps * batch / max(1, count)))])[:steps * batch]

    class Rows(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(order)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {c: t[order[i]] for c, t in columns.items()}

    return DataLoader(Rows(), batch_size=batch, shuffle=False)


def train_rank(spec: LightningRankSpec) -> tuple[dict[str, float], bytes] | None:
    """Train this rank's share; rank 0 returns (the metrics logged last, the weights)."""
    import pytorch_lightning as pl
    import torch
    import torch.distributed as dist
    from pytorch_lightning.strategies import DDPStrategy

    train_rows, val_rows, _marked = rank_rows(spec.transformation_fn)
    if spec.random_seed is not None:
        pl.seed_everything(spec.random_seed, verbose=False)

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpu = torch.cuda.is_available()

    class RankRows(pl.LightningDataModule):
        """This rank's rows, as many batches an epoch as every other rank's:
        sized in ``setup``, once Lightning has made the job's process group."""

        def setup(self, stage: str) -> None:
            counts = torch.tensor([len(train_rows), len(val_rows)], dtype=torch.int64)
            dist.all_reduce(counts)
            total_train, total_val = int(counts[0]), int(counts[1])
            if total_val and not len(val_rows):
                raise RuntimeError(f"rank {rank} has no validation rows while others have: "
                                   "give more rows or fewer ranks")
            steps = spec.train_steps_per_epoch or max(1, math.ceil(total_train / spec.batch_size / size))
            val_steps = spec.validation_steps_per_epoch or max(1, math.ceil(total_val / spec.val_batch_size / size))
            seed = (spec.random_seed or 0) * 1009 + rank
            self.train = _loader(spec, train_rows, spec.batch_size, steps, spec.shuffle, seed)
            self.val = _loader(spec, val_rows, spec.val_batch_size, val_steps, False, seed) if total_val else []

        def train_dataloader(self) -> Any:
            return self.train

        def val_dataloader(self) -> Any:
            return self.val

    with tempfile.TemporaryDirectory(prefix="raydist-lightning-") as work:
        resume = None
        if spec.resume is not None:
            resume = os.path.join(work, "resume.ckpt")
            with open(resume, "wb") as f:
                f.write(spec.resume)
        args: dict[str, Any] = {
            "accelerator": "gpu" if gpu else "cpu", "devices": [int(os.environ.get("LOCAL_RANK", 0))] if gpu else 1,
            "num_nodes": size, "max_epochs": spec.epochs, "callbacks": list(spec.callbacks),
            "logger": spec.logger if spec.logger is not None else False, "default_root_dir": work,
            "enable_progress_bar": bool(spec.verbose) and rank == 0, "enable_model_summary": False,
            "log_every_n_steps": spec.log_every_n_steps, "profiler": spec.profiler,
            "strategy": DDPStrategy(cluster_environment=_environment(),
                                    process_group_backend="nccl" if gpu else "gloo"),
            "enable_checkpointing": any(isinstance(c, pl.callbacks.ModelCheckpoint) for c in spec.callbacks),
        }
        trainer = pl.Trainer(**{**args, **spec.trainer_args})
        trainer.fit(spec.model, datamodule=RankRows(), ckpt_path=resume)
        path = os.path.join(work, "last.ckpt")
        if spec.checkpoint_file:
            trainer.save_checkpoint(path)  # every rank: a collective, which only rank 0 writes
        if rank != 0:
            return None
        if spec.checkpoint_file:
            with open(path, "rb") as f:
                spec.store.write(spec.checkpoint_file, f.read())
    model = spec.model.cpu()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    metrics = {k: float(v) for k, v in trainer.logged_metrics.items()}
    return metrics, buffer.getvalue()
