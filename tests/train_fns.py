"""Training functions used by the training tests, importable by Ray workers
(the tests directory is shipped with the job's working directory)."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def _data(seed: int = 0) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) + 0.1
    return x, y


def torch_fn(config: dict[str, Any]) -> dict[str, Any]:
    """DDP regression that checkpoints each epoch and resumes from one."""
    import ray.train
    import torch
    from ray.train.torch import prepare_model

    torch.manual_seed(0)
    x, y = _data()
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        (model.module if hasattr(model, "module") else model).load_state_dict(state["model"])
        start = state["epoch"] + 1
    rank = ray.train.get_context().get_world_rank()
    losses = []
    for epoch in range(start, config["epochs"]):
        if config.get("crash_at") == epoch and checkpoint is None and rank == 1:
            os.kill(os.getpid(), 9)  # a training worker dies mid-run
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if rank == 0:
                inner = model.module if hasattr(model, "module") else model
                torch.save({"model": inner.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
                ckpt = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"epoch": epoch, "loss": losses[-1]}, checkpoint=ckpt)
    return {"start": start, "losses": losses}


def deepspeed_fn(config: dict[str, Any], ds: Any) -> dict[str, Any]:
    import ray.train
    import torch

    torch.manual_seed(0)
    x, y = _data()
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    engine, *_ = ds.initialize(model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
    restored = ds.load_checkpoint(engine)
    start = int(restored["epoch"]) + 1 if restored else 0
    losses = []
    for _ in range(start, start + config["epochs"]):
        loss = torch.nn.functional.mse_loss(engine(x).squeeze(-1), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.item()))
    if config.get("checkpoint"):
        ds.save_checkpoint(engine, {"loss": losses[-1]}, client_state={"epoch": start + len(losses) - 1})
    return {"start": start, "losses": losses, "zero": ds.config["zero_optimization"]["stage"],
            "rank": ray.train.get_context().get_world_rank()}


def keras_fn(config: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    return _fit_keras(model, config.get("epochs", 5))


def _fit_keras(model: Any, epochs: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 3.0, 0.5], dtype="float32") + 0.1).reshape(-1, 1)
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0)
    import tensorflow as tf

    return {"losses": [float(v) for v in history.history["loss"]], "keras": tf.keras.__name__}


def keras_runner_fn(epochs: int = 5) -> dict[str, Any]:
    """Written for spark_tensorflow_distributor: the runner opens the strategy scope."""
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    return _fit_keras(model, epochs)


def spark_style_torch_fn(lr: float, epochs: int = 10) -> float:
    """Written for pyspark's TorchDistributor: it sets up its own process group."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x, y = _data()
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rank::world]).squeeze(-1), y[rank::world])
        loss.backward()
        opt.step()
    full = torch.nn.functional.mse_loss(model(x).squeeze(-1), y).item()
    dist.destroy_process_group()
    return round(full, 5)


def deepspeed_config_fn() -> dict[str, Any] | None:
    from raydist.compat import deepspeed_config

    return deepspeed_config()


def warm_probe_fn(tag: str) -> dict[str, Any]:
    """What a Spark-style function sees of its process: who forked it, what an
    earlier run left in its environment, and a working process group."""
    import torch
    import torch.distributed as dist

    seen = os.environ.get("RAYDIST_TEST_LEFT_BY")
    os.environ["RAYDIST_TEST_LEFT_BY"] = tag
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {
        "worker": os.getppid(),
        "process": os.getpid(),
        "left_by_earlier_run": seen,
        "rank": os.environ["RANK"],
        "world": os.environ["WORLD_SIZE"],
        "sum_of_ranks_plus_one": total.item(),
    }


def fails_on_rank_1() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("bad batch on rank 1")


def dies_once_on_rank_1(marker_dir: str, lr: float) -> float:
    """Rank 1's process is SIGKILLed the first time, as a lost executor would be."""
    import signal

    marker = os.path.join(marker_dir, "died-once")
    if os.environ["RANK"] == "1" and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return spark_style_torch_fn(lr, epochs=4)


def gpu_seen(out_dir: str) -> None:
    """A torchrun-shaped function that writes what its rank sees (its
    layout, its devices, the address it reaches rank 0 from) to
    out_dir/<RANK>.json."""
    import json
    import socket

    record = {key: os.environ.get(key) for key in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ["MASTER_ADDR"], 9))
        record["ip"] = s.getsockname()[0]
    with open(os.path.join(out_dir, f"{os.environ['RANK']}.json"), "w") as f:
        json.dump(record, f)


def partition_probe_fn(num_samples: int) -> dict[str, Any]:
    """Written as pyspark's docs write a ``_train_on_dataframe`` function:
    read this rank's partition with pyspark's own data loader, then tell
    rank 0 what every rank saw (rows, where its files were, argv)."""
    import sys

    import torch.distributed as dist
    from pyspark.ml.torch.distributor import _get_spark_partition_data_loader

    rows = []
    for labels, features in _get_spark_partition_data_loader(num_samples, 2, num_workers=0, prefetch_factor=None):
        pairs = zip(labels.tolist(), features.tolist(), strict=True)
        rows += [[float(label), [float(v) for v in feature]] for label, feature in pairs]
    dist.init_process_group("gloo")
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, {
        "rank": dist.get_rank(), "rows": rows, "argv0": os.path.basename(sys.argv[0]),
        "files": [os.path.basename(os.environ[k]) for k in
                  ("SPARK_PARTITION_ARROW_DATA_FILE", "SPARK_DATAFRAME_SCHEMA_FILE")],
        "files_exist": all(os.path.exists(os.environ[k]) for k in
                           ("SPARK_PARTITION_ARROW_DATA_FILE", "SPARK_DATAFRAME_SCHEMA_FILE")),
    })
    dist.destroy_process_group()
    return {"ranks": seen}


def mlflow_rank_fn(key: str, steps: int = 3) -> dict:
    """Rank 0 logs ``key`` once a step into whatever MLflow run it is given;
    every rank says what it saw of MLflow's context."""
    import os

    import mlflow

    from raydist.train._mlflow import _rank

    rank = _rank()
    if rank == 0:
        for step in range(steps):
            mlflow.log_metric(key, float(step), step=step)
    return {"rank": rank, "token": os.environ.get("MLFLOW_TRACKING_TOKEN", ""),
            "uri": os.environ.get("MLFLOW_TRACKING_URI", "")}


def mlflow_every_rank_fn(key: str) -> dict:
    """Every rank logs ``key`` (its own rank) into the run it is given."""
    import mlflow

    from raydist.train._mlflow import _rank

    mlflow.log_metric(key, float(_rank()))
    return {"rank": _rank(), "run_id": mlflow.active_run().info.run_id}


def mlflow_facade_fn(config: dict) -> dict:
    """A Ray Train function (it takes the config): rank 0 logs."""
    return mlflow_rank_fn(config["key"])


def report_fn(config: dict) -> int:
    """Reports an epoch and a loss ``config["epochs"]`` times, every rank."""
    import ray.train

    for epoch in range(config["epochs"]):
        ray.train.report({"epoch": epoch, "loss": 1.0 / (epoch + 1), "rank": ray.train.get_context().get_world_rank()})
    return config["epochs"]
