"""The training programs benchmarks/training.py runs, written as Spark's docs
write them (each process sets up its own process group, as under torchrun).

The module is shipped to Spark's and Ray's workers by value, so nothing here
may import from ``benchmarks``.
"""

from __future__ import annotations

import os
import time

#: A training script for ``TorchDistributor.run(path, *args)``: argparse, as
#: a script written for torchrun does; it trains :func:`tiny_job`.
SCRIPT = """
import argparse
import sys

sys.path.insert(0, {here!r})
from training_jobs import tiny_job

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--epochs", type=int, default=20)
args = parser.parse_args()
loss = tiny_job(args.lr, args.epochs)
print(f"script done, lr={{args.lr}}, loss={{loss}}")
"""


def tiny_job(lr: float = 0.05, epochs: int = 20) -> float:
    """A short DDP job; returns the final loss (the same on both sides)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 16, generator=g)
    y = x @ torch.linspace(-1, 1, 16) + 0.3
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rank::world]).squeeze(-1), y[rank::world])
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x).squeeze(-1), y).item()
    dist.destroy_process_group()
    return round(final, 6)


def compute_job(seconds: float) -> float:
    """Train an MLP for about ``seconds``; returns samples/s over all ranks."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = 256
    x = torch.randn(batch, 256)
    y = torch.randint(0, 10, (batch,))
    steps = torch.zeros(1)
    start = time.perf_counter()
    while True:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        done = torch.tensor([1.0 if time.perf_counter() - start > seconds else 0.0])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if done.item() > 0:
            break
    elapsed = time.perf_counter() - start
    total = steps.clone()
    dist.all_reduce(total)
    dist.destroy_process_group()
    return float(total.item()) * batch / elapsed


def deepspeed_job(epochs: int = 5) -> float:
    """DeepSpeed as Spark hands it its config: through the command line."""
    import argparse

    import deepspeed
    import torch

    parser = argparse.ArgumentParser()
    parser = deepspeed.add_config_arguments(parser)
    args, _ = parser.parse_known_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    y = x @ torch.linspace(-1, 1, 16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
    )
    rank = torch.distributed.get_rank()
    for _ in range(epochs):
        loss = torch.nn.functional.mse_loss(engine(x[rank::2]).squeeze(-1), y[rank::2])
        engine.backward(loss)
        engine.step()
    return round(float(loss.item()), 6)


def mirrored_custom_loop(steps: int = 20) -> float:
    """A custom training loop that makes its own MultiWorkerMirroredStrategy."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(tf.zeros([8, 1]))
        opt = tf.keras.optimizers.SGD(0.1)
    x = tf.random.stateless_normal([64, 8], seed=[1, 2])
    y = tf.reduce_sum(x, axis=1, keepdims=True)

    @tf.function
    def step() -> tf.Tensor:
        def replica() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((x @ w - y) ** 2)
            opt.apply_gradients([(tape.gradient(loss, w), w)])
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(replica), axis=None)

    loss = 0.0
    for _ in range(steps):
        loss = float(step())
    return round(loss, 4)


DEEPSPEED_CONFIG = {
    "train_micro_batch_size_per_gpu": 128,
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,  # torch SGD under ZeRO
}
