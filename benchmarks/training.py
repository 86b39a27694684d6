"""The same DDP job through pyspark's TorchDistributor and raydist's.

On one SparkSession, alternate at least 3 times the same tiny DDP job (same
model, data, epochs, seed) through pyspark's
``TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)`` and
through ``raydist.compat.TorchDistributor`` on a raydist cluster that is
already up; then a compute-bound job (about --compute-s seconds of training)
on both, for samples per second (split into --compute-rounds alternating
runs; the median counts). Last line:

  job_ratio=<raydist/pyspark median job wall time> throughput_ratio=<raydist/pyspark samples/s> same_result=<true|false>

Spark master: local-cluster[2,2,2048], not [2,1,2048]: while up, the raydist
cluster holds one task slot per executor, and pyspark's barrier job needs two
more slots; the machine's cores are the same two either way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def tiny_job(epochs: int = 20) -> float:
    """A DDP job as written for pyspark: it makes its own process group."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 16, generator=g)
    y = x @ torch.linspace(-1, 1, 16) + 0.3
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compute-s", type=float, default=30.0, help="seconds of compute-bound training on each")
    parser.add_argument("--compute-rounds", type=int, default=3, help="alternating runs the compute-s are split into")
    parser.add_argument("--master", default="local-cluster[2,2,2048]")
    args = parser.parse_args()

    from pyspark.ml.torch.distributor import TorchDistributor as SparkTorchDistributor

    import raydist
    from raydist.compat import TorchDistributor
    from raydist.engine.spark import embedded_session

    spark = embedded_session(args.master, {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.parallelize(range(2), 2).count()
    cluster = raydist.up(spark, name="bench-train", workers=2, cpus_per_worker=1)
    try:
        spark_times, ours_times, same = [], [], True
        for i in range(args.rounds):
            t0 = time.perf_counter()
            theirs = SparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(tiny_job)
            spark_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ours = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster).run(tiny_job)
            ours_times.append(time.perf_counter() - t0)
            same = same and theirs == ours
            print(f"round {i}: pyspark {spark_times[-1]:6.2f} s -> {theirs}   "
                  f"raydist {ours_times[-1]:6.2f} s -> {ours}", flush=True)
        # The compute-bound job: about --compute-s seconds of training on
        # each, split into alternating runs so that a noisy moment on this
        # shared machine does not decide the ratio; the median run counts.
        spark_runs, ours_runs = [], []
        each = args.compute_s / args.compute_rounds
        for _ in range(args.compute_rounds):
            spark_runs.append(
                SparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(compute_job, each)
            )
            ours_runs.append(
                TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster).run(
                    compute_job, each
                )
            )
        print(
            "compute-bound runs (samples/s): pyspark "
            + ", ".join(f"{v:,.0f}" for v in spark_runs)
            + "; raydist "
            + ", ".join(f"{v:,.0f}" for v in ours_runs)
        )
        spark_sps, ours_sps = statistics.median(spark_runs), statistics.median(ours_runs)
        print(f"compute-bound: pyspark {spark_sps:,.0f} samples/s, raydist {ours_sps:,.0f} samples/s")
    finally:
        cluster.down()
        spark.stop()
    s_med, o_med = statistics.median(spark_times), statistics.median(ours_times)
    print(f"median job wall time: pyspark {s_med:.2f} s, raydist {o_med:.2f} s")
    print(f"job_ratio={o_med / s_med:.3f} throughput_ratio={ours_sps / spark_sps:.3f} same_result={str(same).lower()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
