"""Threads training at once on the session cluster, run as a script by
tests/test_notebook_life.py: one thread trains on 2 processes twice; once
its first run is done, a second trains on 4 (more nodes of the same size:
the cluster grows under the first thread's runs) and a third fits with 2
CPUs per worker (bigger nodes: the cluster is replaced once no run uses it,
and runs that come meanwhile wait their turn). No cluster= anywhere. Prints
one JSON line."""

import json
import os
import threading
import time

#: This program checks the session cluster's own life (the Ray path: a warm
#: run, the yield that keeps the head, retirement), so every run goes there;
#: tests/programs/first_runs.py checks the default path (Spark's tasks first).
os.environ.setdefault("RAYDIST_FIRST_RUN", "ray")

from pyspark.sql import SparkSession  # noqa: E402

from raydist.compat import TorchDistributor  # noqa: E402
from raydist.train import TorchTrainer  # noqa: E402

spark = SparkSession.builder.master("local-cluster[2,2,1024]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")


def steps(lr, world, all_reduce):
    """The same training on every rank; the loss is the same on any number of ranks."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    y = x.sum(1, keepdim=True)
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            all_reduce(p.grad)
            p.grad /= world
        opt.step()
    return round(loss.item(), 6)


def train(lr):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    loss = steps(lr, world, dist.all_reduce)
    dist.destroy_process_group()
    return {"loss": loss, "world": world}


def train_ray(config):
    import torch.distributed as dist  # Ray Train set up the process group

    world = dist.get_world_size()
    return {"loss": steps(config["lr"], world, dist.all_reduce), "world": world}


expected = steps(0.1, 1, lambda grad: None)  # here, on one process
out: dict = {"expected": expected, "errors": []}
first_done = threading.Event()
stop = threading.Event()
samples: list[tuple[int, str | None]] = []


def watch() -> None:
    from raydist.train.session import training_session

    session = training_session()
    while not stop.wait(0.1):
        reapers = sum(1 for t in threading.enumerate() if t.name.startswith("raydist-session-reaper"))
        cluster = session.cluster
        samples.append((reapers, cluster.name if cluster is not None else None))


def thread(name, work) -> threading.Thread:
    def run() -> None:
        try:
            out[name] = work()
        except BaseException as e:  # noqa: BLE001 - the test says what it was
            out["errors"].append(f"{name}: {type(e).__name__}: {e}"[:500])
        finally:
            first_done.set()

    return threading.Thread(target=run, name=name)


def small() -> list:
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    runs = [distributor.run(train, 0.1)]
    first_done.set()
    runs.append(distributor.run(train, 0.1))
    return runs


def big() -> list:
    first_done.wait()
    distributor = TorchDistributor(num_processes=4, local_mode=False, use_gpu=False)
    return [distributor.run(train, 0.1)]


def bigger_nodes() -> dict:
    first_done.wait()
    return TorchTrainer(train_ray, workers=2, resources_per_worker={"CPU": 2}, config={"lr": 0.1}).run()


watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
t0 = time.monotonic()
threads = [thread("small", small), thread("big", big), thread("bigger_nodes", bigger_nodes)]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["seconds"] = round(time.monotonic() - t0, 1)
stop.set()
watcher.join()
out["max_reapers"] = max(r for r, _ in samples)
out["reapers_while_a_cluster_lives"] = sorted({r for r, c in samples if c is not None})
clusters: list[str] = []
for _, c in samples:
    if c is not None and c not in clusters:
        clusters.append(c)
out["session_clusters"] = clusters
spark.stop()
time.sleep(1)

from raydist.engine.node.procs import ray_processes  # noqa: E402

out["reapers_after_stop"] = [t.name for t in threading.enumerate() if "reaper" in t.name]
out["ray_processes_after_stop"] = [p.name() for p in ray_processes()]
print("RESULT " + json.dumps(out), flush=True)
