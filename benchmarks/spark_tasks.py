"""A run's ranks in Spark barrier tasks: raydist's launcher against pyspark's own.

pyspark's ``TorchDistributor(local_mode=False)`` starts ``torchrun`` in each
barrier task, which starts a new Python per rank that imports torch.
:mod:`raydist.train.spark_tasks` forks each rank from the task's Python
worker, which imports torch once and is reused by Spark for the next run.
Both run the same function (its own gloo process group, a few SGD steps with
an all-reduce of the gradients) twice in one fresh process with its own
SparkSession on ``local-cluster[2,1,2048]``; the two sides alternate, round
by round, and the medians count. Timed from the SparkSession's first job
(its executors registered) to the run's result.

Last line:

  spark_tasks_first_ratio=<raydist/pyspark> spark_tasks_next_ratio=<raydist/pyspark> same_result=<true|false>

Run: make bench-spark-tasks (``--rounds N``)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
MASTER = "local-cluster[2,1,2048]"


def train() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
    loss = torch.nn.functional.mse_loss(model(x), y).item()
    dist.destroy_process_group()
    return round(loss, 5)


def child(side: str) -> None:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(MASTER).config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(2, numPartitions=2).count()  # the executors are up
    if side == "pyspark":
        from pyspark.ml.torch.distributor import TorchDistributor

        def run() -> float:
            return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train)
    else:
        from raydist.train.spark_tasks import run_in_spark_tasks

        def run() -> float:
            return run_in_spark_tasks(train, spark=spark, ranks=2)

    times, results = [], []
    for _ in range(2):
        t0 = time.monotonic()
        results.append(run())
        times.append(time.monotonic() - t0)
    spark.stop()
    print("RESULT " + json.dumps({"first_s": times[0], "next_s": times[1], "results": results}), flush=True)


def measure(side: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", side], capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{side} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child)
        return
    got: dict[str, list[dict]] = {"pyspark": [], "raydist": []}
    for round_ in range(opts.rounds):
        for side in ("pyspark", "raydist") if round_ % 2 == 0 else ("raydist", "pyspark"):
            got[side].append(measure(side))
            print(f"{side}: {got[side][-1]}", flush=True)
    med = {side: {k: statistics.median(r[k] for r in runs) for k in ("first_s", "next_s")}
           for side, runs in got.items()}
    same = all(r["results"] == got["pyspark"][0]["results"] for runs in got.values() for r in runs)
    print(f"pyspark first_s={med['pyspark']['first_s']:.2f} next_s={med['pyspark']['next_s']:.2f}; "
          f"raydist first_s={med['raydist']['first_s']:.2f} next_s={med['raydist']['next_s']:.2f}")
    print(f"spark_tasks_first_ratio={med['raydist']['first_s'] / med['pyspark']['first_s']:.2f} "
          f"spark_tasks_next_ratio={med['raydist']['next_s'] / med['pyspark']['next_s']:.2f} "
          f"same_result={'true' if same else 'false'}")


if __name__ == "__main__":
    main()
