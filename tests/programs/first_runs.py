"""A notebook's life when runs go to Spark's tasks first (RAYDIST_FIRST_RUN=spark):

    first_runs.py (--master MASTER | --connect URL)

Train twice back to back, a failing run, the user's Spark job on every slot,
a pause (the session cluster warms up), train twice, the Spark job again,
train, ``spark.stop()``. Each run reports where its ranks ran (their parent
process: a Spark Python worker or a Ray Train worker) and what they saw.
Prints one RESULT line.
"""

import argparse
import json
import os
import sys
import time

os.environ["RAYDIST_FIRST_RUN"] = "spark"

import psutil  # noqa: E402
from _session import session_args, user_session  # noqa: E402

from raydist.compat import TorchDistributor  # noqa: E402

parser = argparse.ArgumentParser()
session_args(parser)
args = parser.parse_args()
spark = user_session(args)
KEYS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
env_before = {k: os.environ.get(k) for k in KEYS}


def train(lr):
    import os
    import sys

    import psutil
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    loss = torch.nn.functional.mse_loss(model(x), y).item()
    print(f"rank {rank} trained: loss {loss:.6f}", flush=True)
    parent = " ".join(psutil.Process(os.getppid()).cmdline())
    seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")}
    dist.destroy_process_group()
    return {"loss": round(loss, 6), "world": world, "argv": sys.argv[1:], "seen": seen,
            "place": "ray" if "RayTrainWorker" in parent else "spark" if "pyspark" in parent else parent}


def ray_processes():
    mine = os.getpid()
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "raylet" in cmd or "gcs_server" in cmd:
            found.append(p.pid)
    return [p for p in found if p != mine]


def session_cluster():
    from raydist.train.runtime import training_session

    return training_session().cluster


def timed(fn):
    t = time.monotonic()
    out = fn()
    return out, round(time.monotonic() - t, 2)


SLOTS = 3 if args.connect else 2  # every slot of the test's executors


def spark_job():
    """The user's own Spark work, a second a task on every slot at once."""
    from pyspark.sql.functions import col, udf

    square = udf(lambda i: time.sleep(1) or i * i, "long")
    return spark.range(SLOTS, numPartitions=SLOTS).select(square(col("id")).alias("sq")).groupBy().sum("sq").first()[0]


out = {"spark_job_expected": sum(i * i for i in range(SLOTS))}
ray_before = set(ray_processes())
d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
out["run1"], out["run1_s"] = timed(lambda: d.run(train, 0.05))
out["ray_after_run1"] = sorted(set(ray_processes()) - ray_before)  # any Ray the first run started
out["cluster_after_run1"] = session_cluster() is not None
out["run2"], out["run2_s"] = timed(lambda: d.run(train, 0.05))


def fails():
    raise ValueError("bad input on every rank")


try:
    d.run(fails)
    out["error"] = None
except ValueError as e:
    out["error"] = {"type": "ValueError", "message": str(e), "notes": getattr(e, "__notes__", [])}

out["spark_job1"], out["spark_job1_s"] = timed(spark_job)

# A pause: the session cluster starts for the next run, with its warm workers.
deadline = time.monotonic() + 150
while time.monotonic() < deadline:
    from raydist.train.runtime import training_session

    cluster = session_cluster()
    if cluster is not None and training_session().warm_runs.ready_on(cluster.address):
        break
    time.sleep(0.5)
out["warm_after_pause"] = session_cluster() is not None
out["run3"], out["run3_s"] = timed(lambda: d.run(train, 0.05))
out["run4"], out["run4_s"] = timed(lambda: d.run(train, 0.1))

# The user's Spark job takes the slots back from the idle cluster; the next run goes to Spark's tasks.
out["spark_job2"], out["spark_job2_s"] = timed(spark_job)
out["run5"], out["run5_s"] = timed(lambda: d.run(train, 0.1))

spark.stop()
time.sleep(1)
out["cluster_after_stop"] = session_cluster() is not None
out["ray_after_stop"] = sorted(set(ray_processes()) - ray_before)
out["env_after"] = {k: os.environ.get(k) for k in KEYS}
out["env_before"] = env_before
out["alive"] = True
print("RESULT " + json.dumps(out), flush=True)
sys.exit(0)
