"""A notebook's whole life with the distributors, one import changed, run as
a script by tests/test_notebook_life.py: train twice and DeepSpeed once, then
the user's own Spark job on every task slot, then other work for longer than
Ray waits for a lost GCS, then train again; train, idle past keep_warm_s,
train; Ctrl-C in the middle of a run (a warm one, and one with its own Ray
Train run), then a run; spark.stop(), a new SparkSession, train. No cluster=
and no RAY_ADDRESS anywhere. Prints one JSON line of what the user would check.

Short clocks, the same property: Ray's GCS reconnect timeout is set to
GCS_TIMEOUT_S here (Ray's default is 60 s), so "past the timeout" is seconds.
A process still connected to a cluster that went is ended by Ray then, as it
would be a minute later with the default.

``--original`` runs the same program on pyspark's own distributors (the
raydist-only parts, keep_warm_s and the facade, left out); its result is
recorded in tests/originals.json (``make refresh-originals``).
"""

import json
import os
import signal
import sys
import tempfile
import threading
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
OTHER_WORK_S = 5.0 if ORIGINAL else GCS_TIMEOUT_S + 6.0  # past the GCS timeout, for a process left connected
if ORIGINAL:
    from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor
    from pyspark.ml.torch.distributor import TorchDistributor
else:
    from raydist.compat import DeepspeedTorchDistributor, TorchDistributor

MASTER = "local-cluster[2,1,2048]"


def session() -> SparkSession:
    spark = SparkSession.builder.master(MASTER).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def train(lr):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x.sum(1, keepdim=True)
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
    world = dist.get_world_size()
    dist.destroy_process_group()
    return {"loss": round(loss.item(), 6), "world": world, "argv": sys.argv[1:], "parent": os.getppid(),
            "pid": os.getpid()}


def train_deepspeed():
    """Reads its config the way Spark hands it over: the command line."""
    import argparse

    import deepspeed

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()
    with open(args.deepspeed_config) as f:
        config = json.load(f)
    return {"deepspeed": args.deepspeed, "path": args.deepspeed_config, "config": config}


#: How long the job a user interrupts would run. Spark's distributor raises
#: KeyboardInterrupt at once too, but its training processes run on to the
#: end, and the next run waits for their task slots: keep it short.
LONG_JOB_S = 45


def long_job(marker):
    """Says it started, then works longer than the user waits."""
    if os.environ.get("RANK", "0") == "0":
        with open(marker, "w") as f:
            f.write("started")
    time.sleep(LONG_JOB_S)
    return "finished"


def interrupt_when_started(marker: str) -> None:
    """Ctrl-C, as a notebook's interrupt sends it: SIGINT to this process once the job runs."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, daemon=True).start()


def interrupted(run) -> dict:
    """Run ``run(marker)``, interrupted once it started: what the caller got, and how fast."""
    marker = os.path.join(tempfile.mkdtemp(prefix="raydist-life-"), "started")
    interrupt_when_started(marker)
    t = time.monotonic()
    try:
        got = {"returned": run(marker)}
    except KeyboardInterrupt:
        got = {"raised": "KeyboardInterrupt"}
    except BaseException as e:  # noqa: BLE001 - the test says what it was
        got = {"raised": f"{type(e).__name__}: {e}"[:300]}
    got["seconds"] = round(time.monotonic() - t, 1)
    return got


def timed(fn, *args):
    t = time.monotonic()
    value = fn(*args)
    return value, round(time.monotonic() - t, 1)


def connected() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def session_cluster():
    if ORIGINAL:
        return None
    from raydist.train.session import training_session

    cluster = training_session().cluster
    return cluster.name if cluster is not None else None


def session_workers():
    """The session cluster's worker nodes up now (None: no session cluster)."""
    if ORIGINAL:
        return None
    from raydist.train.session import training_session

    cluster = training_session().cluster
    return cluster.status().ready_workers if cluster is not None else None


def watch_disconnects(out: dict) -> None:
    """Note, at each end of this process's Ray connection, raydist's threads
    still waiting in Ray: Ray frees its core worker under them (SIGSEGV)."""
    import ray

    shutdown = ray.shutdown
    out["disconnects"], out["threads_in_ray_at_disconnect"] = 0, []

    def watched(*args, **kwargs):
        out["disconnects"] += 1
        out["threads_in_ray_at_disconnect"] += [
            t.name for t in threading.enumerate() if t.name.startswith("raydist-warm-run") and t.is_alive()]
        return shutdown(*args, **kwargs)

    ray.shutdown = watched


out: dict = {"env_before": {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}}
if not ORIGINAL:
    watch_disconnects(out)
spark = session()
distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)

# 1. Train twice and DeepSpeed once, then the user's own Spark job on every
#    task slot (2 executors x 1 core).
out["run1"], out["run1_s"] = timed(distributor.run, train, 0.1)
out["run1b"], out["run1b_s"] = timed(distributor.run, train, 0.05)
out["cluster1"] = session_cluster()
config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
ds = DeepspeedTorchDistributor(numGpus=2, nnodes=1, localMode=False, useGpu=False, deepspeedConfig=config)
out["deepspeed"], out["deepspeed_s"] = timed(ds.run, train_deepspeed)
out["deepspeed_file_left"] = os.path.exists(out["deepspeed"]["path"])
out["cluster_deepspeed"] = session_cluster()
slots = spark.sparkContext.defaultParallelism
out["spark_job"], out["spark_job_s"] = timed(
    lambda: spark.sparkContext.parallelize(range(slots), slots).map(lambda i: i * i).sum())
out["connected_after_spark_job"] = connected()
out["cluster_after_spark_job"] = session_cluster()
out["workers_after_spark_job"] = session_workers()

# 2. Other work for longer than Ray waits for a lost GCS, then train again.
end = time.monotonic() + OTHER_WORK_S
rows = 0
while time.monotonic() < end:
    rows += spark.range(0, 1000, numPartitions=2).count()
    time.sleep(2)
out["other_work_rows"] = rows > 0
out["run2"], out["run2_s"] = timed(distributor.run, train, 0.1)
out["cluster_run2"] = session_cluster()

if not ORIGINAL:
    # 3. Idle past keep_warm_s: the session cluster goes by itself; the next run starts another.
    brief = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, keep_warm_s=3)
    out["run3"], out["run3_s"] = timed(brief.run, train, 0.1)
    cluster = session_cluster()
    time.sleep(6)
    out["cluster_after_idle"] = session_cluster()
    out["connected_after_idle"] = connected()
    out["run4"], out["run4_s"] = timed(brief.run, train, 0.1)
    out["cluster_idle_replaced"] = cluster is not None and session_cluster() not in (None, cluster)

# 4. Ctrl-C in the middle of a run, then a run.
out["interrupted"] = interrupted(lambda marker: distributor.run(long_job, marker))
out["run5"], out["run5_s"] = timed(distributor.run, train, 0.1)
if not ORIGINAL:
    # ...and in a run with a Ray Train run of its own (the facade).
    from raydist.train import TorchTrainer

    def fit_long(marker):
        return TorchTrainer(lambda config: long_job(config["marker"]), workers=2,
                            config={"marker": marker}).fit()

    out["interrupted_fresh"] = interrupted(fit_long)
    out["run6"], out["run6_s"] = timed(distributor.run, train, 0.1)

# 5. spark.stop(), a new SparkSession, train.
spark.stop()
out["cluster_after_stop"] = session_cluster()
out["connected_after_stop"] = connected()
spark = session()
# A distributor belongs to the session it was made in (Spark's keeps it): a new one.
distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
out["run7"], out["run7_s"] = timed(distributor.run, train, 0.1)
spark.stop()
if not ORIGINAL:
    from raydist.engine.node.procs import ray_processes

    time.sleep(1)
    out["ray_processes_after_stop"] = [p.name() for p in ray_processes()]
    out["reapers_after_stop"] = [t.name for t in threading.enumerate() if "reaper" in t.name]
out["env_after"] = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
print("RESULT " + json.dumps(out), flush=True)
