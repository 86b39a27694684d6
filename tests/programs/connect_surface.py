"""A Spark user's training program on a Spark Connect session, with one import
changed (``--original``: pyspark's and spark-tensorflow-distributor's own
classes), run as a script by tests/test_connect.py: every distributor on the
session cluster, local mode on the client, and (raydist only) a facade and the
DataFrame handoff to Ray and back; then the user's own Spark work, (raydist
only) a wait past the session cluster's retirement and Ray's GCS reconnect
timeout and one more run, and ``spark.stop()``. Prints one RESULT line.

Short clocks, the same property: Ray's GCS reconnect timeout is
GCS_TIMEOUT_S here (Ray's default is 60 s), so the wait is seconds; a process
still connected to a cluster that went would be ended by Ray within it.
"""

import json
import os
import sys
import time

#: Ray's GCS reconnect timeout for this process and all it starts (read by
#: Ray's C++ config from the environment, before Ray is imported).
GCS_TIMEOUT_S = 8
os.environ["RAY_gcs_rpc_server_reconnect_timeout_s"] = str(GCS_TIMEOUT_S)
#: This program checks the session cluster's own life (the Ray path: a warm
#: run, the yield that keeps the head, retirement), so every run goes there;
#: tests/programs/first_runs.py checks the default path (Spark's tasks first).
os.environ.setdefault("RAYDIST_FIRST_RUN", "ray")

from pyspark.sql import SparkSession  # noqa: E402

ORIGINAL = "--original" in sys.argv
if ORIGINAL:
    from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor
    from pyspark.ml.torch.distributor import TorchDistributor
    from spark_tensorflow_distributor import MirroredStrategyRunner
else:
    from raydist.compat import DeepspeedTorchDistributor, MirroredStrategyRunner, TorchDistributor

STARTED = time.time()
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()


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
    return {"loss": round(loss, 6), "world": world}


def train_deepspeed():
    """Reads its config the way Spark hands it over: the command line."""
    import argparse

    import deepspeed

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()
    with open(args.deepspeed_config) as f:
        return {"deepspeed": args.deepspeed, "config": json.load(f)}


def mirrored():
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
    return {"replicas": int(strategy.num_replicas_in_sync), "sum": float(total)}


out = {}
distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
out["runs"] = [distributor.run(train, lr) for lr in (0.05, 0.1)]
if not ORIGINAL:
    from raydist.train.session import training_session

    session = training_session()
    out["session_cluster_torch"] = session.cluster.name if session.cluster else None
out["local"] = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train, 0.05)
config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
ds = DeepspeedTorchDistributor(numGpus=2, nnodes=1, localMode=False, useGpu=False, deepspeedConfig=config)
out["deepspeed"] = ds.run(train_deepspeed)
try:
    out["mirrored"] = MirroredStrategyRunner(num_slots=2, use_gpu=False, use_custom_strategy=True).run(mirrored)
except Exception as e:  # noqa: BLE001 - the original has no Connect support: what it says is the result
    out["mirrored_error"] = f"{type(e).__name__}: {str(e)[:300]}"

if not ORIGINAL:
    import ray

    from raydist.data import from_spark, to_spark
    from raydist.train import TorchTrainer

    out["session_cluster"] = session.cluster.name if session.cluster else None

    def facade(config):
        import torch
        import torch.distributed as dist

        t = torch.tensor([dist.get_rank() + config["base"]])
        dist.all_reduce(t)
        return float(t.item())

    out["facade"] = TorchTrainer(facade, config={"base": 1.0}, workers=2).run()
    # The DataFrame to Ray and back, on the cluster this process is connected to (the session cluster).
    df = spark.range(1000, numPartitions=4).selectExpr("id", "id * 2 as twice")
    data = from_spark(df)
    out["ray_rows"] = data.count()
    out["ray_sum"] = int(data.sum("twice"))
    back = to_spark(data.map_batches(lambda b: {"id": b["id"], "twice": b["twice"] + 1}), spark)
    out["back"] = [back.count(), back.selectExpr("sum(twice)").collect()[0][0]]
    out["session_cluster_after"] = session.cluster.name if session.cluster else None
    out["connected"] = ray.is_initialized()

out["spark_sum"] = spark.range(100, numPartitions=2).selectExpr("sum(id) as s").collect()[0]["s"]
if not ORIGINAL:
    # The user's own time: the session cluster retires (on Connect after
    # BLIND_KEEP_WARM_S idle), then Ray's GCS timeout passes, which ends a
    # process still connected to a cluster that went; then another run.
    from raydist.train.session import BLIND_KEEP_WARM_S

    time.sleep(BLIND_KEEP_WARM_S + GCS_TIMEOUT_S + 4)
    out["session_cluster_after_wait"] = session.cluster.name if session.cluster else None
    out["connected_after_wait"] = ray.is_initialized()
    out["run_after_wait"] = distributor.run(train, 0.05)
spark.stop()
time.sleep(1)
if not ORIGINAL:
    from raydist.engine.node.procs import ray_processes

    out["session_cluster_after_stop"] = session.cluster.name if session.cluster else None
    out["ray_processes_after_stop"] = [p.name() for p in ray_processes() if p.create_time() >= STARTED]
print("RESULT " + json.dumps(out), flush=True)
