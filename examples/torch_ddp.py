"""PyTorch DDP through raydist's facade: a tiny regression, 2 workers.

Run: .venv/bin/python examples/torch_ddp.py
"""

from __future__ import annotations

from typing import Any


def train_fn(config: dict[str, Any]) -> dict[str, Any]:
    """One DDP worker: fit y = x.w + b on a fixed synthetic set."""
    import ray.train
    import torch
    from ray.train.torch import prepare_model

    torch.manual_seed(config.get("seed", 0))
    x = torch.randn(512, 8)
    y = x @ torch.arange(1.0, 9.0) + 0.5
    ctx = ray.train.get_context()
    shard = slice(ctx.get_world_rank(), None, ctx.get_world_size())
    model = prepare_model(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.05))
    losses = []
    for _ in range(config.get("epochs", 20)):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[shard]).squeeze(-1), y[shard])
        loss.backward()
        opt.step()
        losses.append(round(float(loss.item()), 4))
    ray.train.report({"loss": losses[-1], "epochs": len(losses)})
    return {"first_loss": losses[0], "last_loss": losses[-1], "world_size": ctx.get_world_size()}


def main(quiet: bool = False) -> None:
    """Up, train, down. ``quiet``: Ray's and Ray Train's INFO lines stay off
    the terminal (Spark's console output goes to raydist's log either way,
    unless RAYDIST_VERBOSE=1)."""
    import logging
    import time

    import ray
    import ray.train

    import raydist
    from raydist.train import TorchTrainer

    run_config = None
    if quiet:
        logging.getLogger("ray").setLevel(logging.WARNING)
        run_config = ray.train.RunConfig(logging_config=ray.train.LoggingConfig(log_level="WARNING"))
    t0 = time.monotonic()
    with raydist.up(workers=2, cpus_per_worker=1) as cluster:
        print(f"cluster {cluster.name} up in {time.monotonic() - t0:.0f} s: {cluster.status().ready_workers} "
              f"workers, {cluster.address} (Ray Client: {cluster.client_address})")
        if raydist.spark_log() is not None:
            print(f"  Spark's console output: {raydist.spark_log()}")
        print("training a linear model with DDP on 2 workers, 30 epochs...")
        result = TorchTrainer(train_fn, config={"epochs": 30}, workers=2, cluster=cluster,
                              run_config=run_config).fit()
        # Ray Train keeps reported metrics in Result.metrics only with a
        # checkpoint; rank 0's return value carries them here.
        out = result.return_value
        print(f"trained on {out['world_size']} workers: loss {out['first_loss']} -> {out['last_loss']}")
    print(f"cluster {cluster.name}: {cluster.status().state.value}")


if __name__ == "__main__":
    main()
