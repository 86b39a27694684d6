"""A Spark user's training program with one import changed, run as a script
by tests/test_default_path.py: no cluster=, no RAY_ADDRESS. It prints one JSON
line of what a user would check."""

import json
import os
import sys
import threading
import time

from pyspark.sql import SparkSession

ORIGINAL = "--original" in sys.argv
if ORIGINAL:
    from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor
    from pyspark.ml.torch.distributor import TorchDistributor
else:
    from raydist.compat import DeepspeedTorchDistributor, TorchDistributor

spark = SparkSession.builder.master("local-cluster[2,1,2048]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")


def train(lr):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = x.sum(1, keepdim=True)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    loss = torch.nn.functional.mse_loss(model(x), y).item()
    dist.destroy_process_group()
    return {"loss": round(loss, 6), "argv": sys.argv[1:], "parent": os.getppid(), "pid": os.getpid()}


def train_deepspeed():
    """Reads its config the way Spark hands it over: the command line."""
    import argparse

    import deepspeed

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()
    with open(args.deepspeed_config) as f:
        config = json.load(f)
    return {"deepspeed": args.deepspeed, "path": args.deepspeed_config, "config": config}


out = {}
distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
out["runs"] = [distributor.run(train, lr) for lr in (0.05, 0.1)]
if not ORIGINAL:
    from raydist.train.session import training_session

    session = training_session()
    out["session_cluster_torch"] = session.cluster.name if session.cluster else None
config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
ds = DeepspeedTorchDistributor(numGpus=2, nnodes=1, localMode=False, useGpu=False, deepspeedConfig=config)
out["deepspeed"] = ds.run(train_deepspeed)
out["deepspeed_file_left"] = os.path.exists(out["deepspeed"]["path"])
if not ORIGINAL:
    out["session_cluster"] = session.cluster.name if session.cluster else None
    # A plain Spark job while the session cluster idles: it needs the slots.
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault("sum", spark.sparkContext.parallelize(range(10), 2).sum()))
    thread.start()
    thread.join(120)
    out["spark_job"] = done.get("sum")
    out["session_cluster_after_spark_job"] = session.cluster.name if session.cluster else None
    # Training again starts a new session cluster.
    out["runs"].append(distributor.run(train, 0.05))
    out["session_cluster_again"] = session.cluster.name if session.cluster else None
spark.stop()
time.sleep(1)
if not ORIGINAL:
    from raydist.engine.procs import ray_processes

    out["session_cluster_after_stop"] = session.cluster.name if session.cluster else None
    out["ray_processes_after_stop"] = [p.name() for p in ray_processes()]
print("RESULT " + json.dumps(out), flush=True)
