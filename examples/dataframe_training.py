"""Train on a Spark DataFrame with no files between Spark and Ray.

A DataFrame of noisy points on a line goes into Ray Data with
``raydist.data.from_spark`` (each Spark task streams its partition into its own
host's Ray node), and two Ray Train workers fit the line on their shards.

Run: .venv/bin/python examples/dataframe_training.py
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def train_fn(config: dict) -> dict:
    import ray.train
    import torch

    shard = ray.train.get_dataset_shard("train")
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for epoch in range(config["epochs"]):
        for batch in shard.iter_torch_batches(batch_size=256):
            loss = torch.nn.functional.mse_loss(model(batch["x"].unsqueeze(1)), batch["y"].unsqueeze(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        ray.train.report({"epoch": epoch, "loss": loss.item()})
    return {"slope": model.weight.item(), "intercept": model.bias.item()}


def main() -> None:
    import raydist
    from raydist.data import from_spark
    from raydist.engine.spark.session import embedded_session
    from raydist.train import TorchTrainer

    # Two executors of two cores: one per executor for the Ray worker nodes, one
    # for Spark's own jobs (the handoff is one).
    spark = embedded_session("local-cluster[2,2,2048]")
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(0, 20_000, 1, 4).selectExpr(
        "CAST(rand(1) AS FLOAT) AS x").selectExpr("x", "CAST(2 * x + 0.5 + (rand(2) - 0.5) / 20 AS FLOAT) AS y")
    with raydist.up(spark, name="df-train", workers=2, cpus_per_worker=1):
        ds = from_spark(df)
        print(f"Dataset from the DataFrame: {ds.count()} rows in {ds.num_blocks()} blocks")
        fitted = TorchTrainer(train_fn, workers=2, config={"lr": 0.5, "epochs": 10},
                              datasets={"train": ds}).run()
        print(f"fitted y = {fitted['slope']:.2f} x + {fitted['intercept']:.2f} (the data: y = 2.00 x + 0.50)")
    spark.stop()


if __name__ == "__main__":
    main()
