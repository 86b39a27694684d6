"""raydist against pyspark's TorchDistributor from a Spark Connect client.

One Spark Connect server (pip's pyspark) over ``local-cluster[2,1,2048]``;
every measurement is a fresh client process (``SparkSession.builder.remote``),
pyspark and raydist alternating, exactly a Connect user's program with one
import changed:

1. the first ``TorchDistributor(num_processes=2, local_mode=False)`` run in a
   fresh client session (raydist's includes starting its session cluster);
2. a learning-rate sweep in a fresh client session: one distributor, ``run()``
   four times, in total;
3. the user's own Spark work right after a run, in a fresh client session:
   a run, a Spark job needing every task slot (timed), and the next run
   (timed), what a notebook that alternates data work and training pays;
4. the time to a ready cluster with two Ray nodes that run work, from a
   Connect client against the same from a classic session on the same kind of
   master. On Connect the head runs in a Spark task and carries one worker's
   share (``up(workers=1, head_cpus=1)``: two slots, as the session cluster
   takes them); a classic head runs on the driver (``up(workers=2)``).

Before the first measurement a warm-up client runs a Python job on every
slot, so that neither side pays for the executors' first Python start alone.

The floor: the same first run on bare Ray, with no Spark at all (a head and a
worker node of one CPU each started by ``ray.cluster_utils.Cluster``, then one
``ray.train.torch.TorchTrainer.fit`` of the same function), measured in the
same run. A first-run target below it is this machine's floor, not raydist's.

Last line (one line)::

  connect_first_run_ratio=<raydist/pyspark> connect_sweep_ratio=<raydist/pyspark>
  connect_startup_vs_classic=<raydist on Connect / raydist classic> same_result=<true|false>
  connect_after_spark_run_ratio=<the run right after the Spark job, raydist/pyspark>
  connect_spark_after_s=<that Spark job's seconds, raydist minus pyspark>

Run: make bench-connect
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _clients import run_client

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

HERE = Path(__file__).resolve().parent
MASTER = "local-cluster[2,1,2048]"
SWEEP_LRS = (0.01, 0.02, 0.05, 0.1)
#: The task slots of MASTER's executors: a Spark job of this many tasks needs every one.
SLOTS = 2


# ------------------------------------------------------------------ child side


def train(lr: float) -> float:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    y = x.sum(1, keepdim=True)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    loss = torch.nn.functional.mse_loss(model(x), y).item()
    dist.destroy_process_group()
    return round(loss, 6)


def _distributor(impl: str):  # type: ignore[no-untyped-def]
    if impl == "pyspark":
        from pyspark.ml.torch.distributor import TorchDistributor
    else:
        from raydist.compat import TorchDistributor
    return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)


def child(mode: str, impl: str, url: str) -> dict:
    if mode == "startup-classic":
        return _startup_classic()
    if mode == "bare":
        return _bare_ray()
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        if mode == "warmup":
            spark.range(8, numPartitions=8).mapInArrow(lambda it: it, "id long").count()
            return {}
        if mode == "startup-connect":
            import raydist

            t = time.monotonic()
            cluster = raydist.up(spark, workers=1, head_cpus=1, cpus_per_worker=1)
            ready = time.monotonic() - t
            nodes = sum(1 for n in cluster.status().nodes if n.up)
            cluster.down()
            return {"ready_s": ready, "nodes": nodes}
        d = _distributor(impl)
        if mode == "after":
            losses = [d.run(train, SWEEP_LRS[-1])]
            t = time.monotonic()
            spark.range(SLOTS, numPartitions=SLOTS).mapInArrow(lambda it: it, "id long").count()
            spark_s = time.monotonic() - t
            t = time.monotonic()
            losses.append(d.run(train, SWEEP_LRS[-1]))
            return {"spark_s": spark_s, "after_s": time.monotonic() - t, "losses": losses}
        lrs = SWEEP_LRS if mode == "sweep" else SWEEP_LRS[-1:]
        times, losses = [], []
        for lr in lrs:
            t = time.monotonic()
            losses.append(d.run(train, lr))
            times.append(time.monotonic() - t)
        return {"times": times, "losses": losses}
    finally:
        spark.stop()


def _startup_classic() -> dict:
    from pyspark.sql import SparkSession

    import raydist

    spark = (SparkSession.builder.master(MASTER).appName("bench-connect-classic")
             .config("spark.ui.enabled", "false").config("spark.pyspark.python", sys.executable)
             .config("spark.executorEnv.RAY_USAGE_STATS_ENABLED", "0").getOrCreate())
    try:
        t = time.monotonic()
        cluster = raydist.up(spark, workers=2, cpus_per_worker=1)
        ready = time.monotonic() - t
        nodes = sum(1 for n in cluster.status().nodes if n.up)
        cluster.down()
        return {"ready_s": ready, "nodes": nodes}
    finally:
        spark.stop()


def _bare_ray() -> dict:
    """The floor: a fresh two-node Ray cluster and one Ray Train run of ``train``."""
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_AUTH_MODE"] = "disabled"
    t = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(cluster.address)
        from ray.train import ScalingConfig
        from ray.train.torch import TorchTrainer

        def loop(_config: dict) -> float:
            import torch.distributed as dist

            # Ray Train made the process group already; the function makes its own under torchrun.
            dist.init_process_group = lambda *a, **k: None
            dist.destroy_process_group = lambda *a, **k: None
            return train(SWEEP_LRS[-1])

        result = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2)).fit()
        took = time.monotonic() - t
        ray.shutdown()
    finally:
        started = psutil.Process().children(recursive=True)
        cluster.shutdown()
        for proc in started:  # what the nodes started and their shutdown left (only this process's own)
            try:
                proc.kill()
            except psutil.Error:
                pass
    return {"times": [took], "error": str(result.error) if result.error else ""}


# ----------------------------------------------------------------- parent side


def _run_child(mode: str, impl: str, url: str) -> dict:
    return run_client(__file__, mode, impl, url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default="")
    parser.add_argument("--impl", default="raydist")
    parser.add_argument("--url", default="")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each kind, per side")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.impl, args.url)), flush=True)
        return 0

    from raydist.testing.connect import ConnectServer

    first: dict[str, list[float]] = {"pyspark": [], "raydist": []}
    sweep: dict[str, list[float]] = {"pyspark": [], "raydist": []}
    losses: dict[str, list[list[float]]] = {"pyspark": [], "raydist": []}
    startup: dict[str, list[float]] = {"connect": [], "classic": []}
    spark_after: dict[str, list[float]] = {"pyspark": [], "raydist": []}
    after_run: dict[str, list[float]] = {"pyspark": [], "raydist": []}
    bare: list[float] = []
    with ConnectServer(master=MASTER) as server:
        url = server.url
        _run_child("warmup", "", url)
        for r in range(args.rounds):
            order = ("pyspark", "raydist") if r % 2 == 0 else ("raydist", "pyspark")
            for impl in order:
                out = _run_child("first", impl, url)
                first[impl].append(out["times"][0])
                print(f"first run  {impl:8s} {out['times'][0]:6.1f} s  loss {out['losses'][0]}", flush=True)
            for impl in order:
                out = _run_child("sweep", impl, url)
                sweep[impl].append(sum(out["times"]))
                losses[impl].append(out["losses"])
                print(f"sweep      {impl:8s} {sum(out['times']):6.1f} s  "
                      f"({' / '.join(f'{t:.1f}' for t in out['times'])})  losses {out['losses']}", flush=True)
            for impl in order:
                out = _run_child("after", impl, url)
                spark_after[impl].append(out["spark_s"])
                after_run[impl].append(out["after_s"])
                losses[impl].append(out["losses"])
                print(f"after      {impl:8s} Spark job {out['spark_s']:5.1f} s, the run after it "
                      f"{out['after_s']:6.1f} s  losses {out['losses']}", flush=True)
            out = _run_child("startup-connect", "raydist", url)
            startup["connect"].append(out["ready_s"])
            print(f"startup    connect  {out['ready_s']:6.1f} s  ({out['nodes']} nodes up)", flush=True)
    for _ in range(args.rounds):
        out = _run_child("bare", "", "")
        bare.append(out["times"][0])
        print(f"bare Ray   first run {out['times'][0]:6.1f} s  {out['error']}", flush=True)
        out = _run_child("startup-classic", "raydist", "")
        startup["classic"].append(out["ready_s"])
        print(f"startup    classic  {out['ready_s']:6.1f} s  ({out['nodes']} nodes up)", flush=True)

    med = statistics.median
    first_ratio = med(first["raydist"]) / med(first["pyspark"])
    sweep_ratio = med(sweep["raydist"]) / med(sweep["pyspark"])
    startup_ratio = med(startup["connect"]) / med(startup["classic"])
    after_ratio = med(after_run["raydist"]) / med(after_run["pyspark"])
    spark_after_s = med(spark_after["raydist"]) - med(spark_after["pyspark"])
    same = all(abs(a - b) <= 1e-4 for ra, rp in zip(losses["raydist"], losses["pyspark"], strict=True)
               for a, b in zip(ra, rp, strict=True))
    print(f"first run median: raydist {med(first['raydist']):.1f} s, pyspark {med(first['pyspark']):.1f} s; "
          f"sweep median: raydist {med(sweep['raydist']):.1f} s, pyspark {med(sweep['pyspark']):.1f} s; "
          f"ready cluster median: Connect {med(startup['connect']):.1f} s, classic {med(startup['classic']):.1f} s; "
          f"bare Ray first run (the floor) {med(bare):.1f} s = {med(bare) / med(first['pyspark']):.3f} x pyspark's")
    print(f"connect_first_run_ratio={first_ratio:.3f} connect_sweep_ratio={sweep_ratio:.3f} "
          f"connect_startup_vs_classic={startup_ratio:.3f} same_result={'true' if same else 'false'} "
          f"connect_after_spark_run_ratio={after_ratio:.3f} connect_spark_after_s={spark_after_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
