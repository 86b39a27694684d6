"""GPU code as Spark users write it, on Spark's real GPU scheduling with fake
GPU addresses (this machine has none), run as a script by tests/test_gpu_layouts.py.

    python gpu_layouts.py LAYOUT [--original] [--connect]

starts a SparkSession with that layout (see LAYOUTS; ``--connect``: a Spark
Connect server with that layout, and this program its client), runs each distributor
on it with ``use_gpu=True``, and prints one RESULT line: for every run, what
each rank saw (its torchrun environment, its CUDA_VISIBLE_DEVICES, and
whether ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` took its own
device under a stub CUDA that checks the index against CUDA_VISIBLE_DEVICES).
``--original`` runs the same functions on pyspark's own TorchDistributor.
"""

import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

ORIGINAL = "--original" in sys.argv
CONNECT = "--connect" in sys.argv
LAYOUT = sys.argv[1]
RESOURCES = Path(__file__).resolve().parent.parent / "resources"

#: name: (master, GPUs a worker discovers, executor GPUs, task GPUs, ranks, extra conf)
LAYOUTS = {
    # Two executors of one GPU each.
    "two-executors": ("local-cluster[2,1,1024]", 1, 1, 1, 2, {}),
    # One executor with four GPUs, one GPU a task: two tasks share a host and an executor.
    "one-executor-four-gpus": ("local-cluster[1,4,2048]", 4, 4, 1, 2, {}),
    # Two tasks per executor with two GPUs each: two ranks a task.
    "two-gpus-a-task": ("local-cluster[1,2,2048]", 4, 4, 2, 4, {}),
    # Executors that run under a CUDA_VISIBLE_DEVICES of their own (YARN, Kubernetes).
    "executor-visible-devices": ("local-cluster[2,1,1024]", 1, 1, 1, 2,
                                 {"spark.executorEnv.CUDA_VISIBLE_DEVICES": "6,7"}),
}
master, worker_gpus, executor_gpus, task_gpus, RANKS, extra = LAYOUTS[LAYOUT]

os.environ["RAYDIST_FAKE_GPUS"] = str(worker_gpus)
os.environ["RAYDIST_FAKE_GPU_DIR"] = tempfile.mkdtemp(prefix="fake-gpus-")
atexit.register(shutil.rmtree, os.environ["RAYDIST_FAKE_GPU_DIR"], ignore_errors=True)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
conf = {
    "spark.ui.enabled": "false",
    "spark.worker.resource.gpu.amount": str(worker_gpus),
    "spark.worker.resource.gpu.discoveryScript": str(RESOURCES / "fake_gpus.sh"),
    "spark.executor.resource.gpu.amount": str(executor_gpus),
    "spark.task.resource.gpu.amount": str(task_gpus),
    **extra,
}
server = None
if CONNECT:
    # The cluster's own Connect server (what a platform runs); this program is its client.
    from raydist.testing.connect import ConnectServer

    server = ConnectServer(master=master, conf=conf).start()
    spark = SparkSession.builder.remote(server.url).getOrCreate()
else:
    builder = SparkSession.builder.master(master)
    conf |= {"spark.driver.resource.gpu.amount": "4",
             "spark.driver.resource.gpu.discoveryScript": str(RESOURCES / "fake_driver_gpus.sh")}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")


def seen(out_dir, set_device=True):
    """What this rank sees, written to out_dir/<RANK>.json; the stub CUDA
    is installed first: devices are CUDA_VISIBLE_DEVICES' entries."""
    import json
    import os

    import torch
    import torch.distributed

    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    chosen = {}

    def set_device_checked(device):
        index = device.index if isinstance(device, torch.device) else int(device)
        if not 0 <= index < len(visible):
            raise RuntimeError(f"CUDA error: invalid device ordinal {index} (visible: {visible})")
        chosen["device"] = visible[index]

    torch.cuda.is_available = lambda: bool(visible)
    torch.cuda.device_count = lambda: len(visible)
    torch.cuda.set_device = set_device_checked
    record = {
        key: os.environ.get(key)
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "CUDA_VISIBLE_DEVICES")
    }
    record["group_before"] = torch.distributed.is_available() and torch.distributed.is_initialized()
    record["parent"] = os.getppid()
    if set_device:
        try:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            record["device"] = chosen["device"]
        except Exception as e:  # noqa: BLE001 - what the user would see, reported
            record["device_error"] = f"{type(e).__name__}: {e}"
    rank = os.environ.get("RANK") or os.environ.get("_RAYDIST_TF_RANK") or "0"
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(record, f)
    return rank


def hvd_seen(out_dir):
    import horovod.torch as hvd
    import torch

    hvd.init()  # before the stub: the group is gloo's (this torch has no NCCL)
    seen(out_dir, set_device=False)
    path = os.path.join(out_dir, f"{hvd.rank()}.json")
    with open(path) as f:
        record = json.load(f)
    record["hvd"] = [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()]
    try:
        torch.cuda.set_device(hvd.local_rank())
        visible = record["CUDA_VISIBLE_DEVICES"].split(",")
        record["device"] = visible[hvd.local_rank()]
    except Exception as e:  # noqa: BLE001
        record["device_error"] = f"{type(e).__name__}: {e}"
    with open(path, "w") as f:
        json.dump(record, f)
    hvd.shutdown()


def tf_seen(out_dir):
    import json
    import os

    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    os.environ["_RAYDIST_TF_RANK"] = str(task)
    os.environ.pop("RANK", None)
    seen(out_dir, set_device=False)


def facade_seen(config):
    """A Ray Train function, as Ray Train's docs write one: its device from get_device()."""
    import json
    import os

    import ray.train
    import ray.train.torch

    seen(config["out"], set_device=False)
    rank = ray.train.get_context().get_world_rank()
    path = os.path.join(config["out"], f"{rank}.json")
    with open(path) as f:
        record = json.load(f)
    device = ray.train.torch.get_device()
    visible = record["CUDA_VISIBLE_DEVICES"].split(",")
    record["device"] = visible[device.index]
    record["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
    with open(path, "w") as f:
        json.dump(record, f)


def collect(run):
    out_dir = tempfile.mkdtemp(prefix="gpu-seen-")
    started = time.monotonic()
    try:
        run(out_dir)
        error = None
    except Exception as e:  # noqa: BLE001 - the original may fail on a layout: what it says is the answer
        error = f"{type(e).__name__}: {str(e)[:300]}"
    ranks = {}
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            ranks[name[:-5]] = json.load(f)
    return {"ranks": ranks, "error": error, "s": round(time.monotonic() - started, 1)}


result = {"layout": LAYOUT, "ranks_asked": RANKS}
if ORIGINAL:
    import pyspark
    from pyspark.ml.torch.distributor import TorchDistributor

    result["pyspark"] = pyspark.__version__
    result["torch"] = collect(lambda d: TorchDistributor(num_processes=RANKS, local_mode=False, use_gpu=True)
                              .run(seen, d))
    result["local"] = collect(lambda d: TorchDistributor(num_processes=2, local_mode=True, use_gpu=True)
                              .run(seen, d))
else:
    from raydist.compat import DeepspeedTorchDistributor, HorovodRunner, MirroredStrategyRunner, TorchDistributor

    result["torch"] = collect(lambda d: TorchDistributor(num_processes=RANKS, local_mode=False, use_gpu=True)
                              .run(seen, d))
    result["torch_again"] = collect(lambda d: TorchDistributor(num_processes=RANKS, local_mode=False, use_gpu=True)
                                    .run(seen, d))
    result["horovod"] = collect(lambda d: HorovodRunner(np=RANKS, use_gpu=True).run(hvd_seen, out_dir=d))
    result["deepspeed"] = collect(lambda d: DeepspeedTorchDistributor(
        numGpus=task_gpus, nnodes=RANKS // task_gpus, localMode=False, useGpu=True).run(seen, d))
    result["mirrored"] = collect(lambda d: MirroredStrategyRunner(
        num_slots=RANKS, use_gpu=True, use_custom_strategy=True).run(tf_seen, out_dir=d))
    from ray.train.torch import TorchConfig

    from raydist.train import TorchTrainer

    # Each worker asks its share of a task's CPUs, as the compat runs' ranks take them.
    result["facade"] = collect(lambda d: TorchTrainer(
        facade_seen, config={"out": d}, workers=RANKS, use_gpu=True, resources_per_worker={
            "CPU": 1 / task_gpus, "GPU": 1}, torch_config=TorchConfig(backend="gloo")).run())
    if not CONNECT:  # a Connect client's local mode has the client's own GPUs (none here)
        result["local"] = collect(lambda d: TorchDistributor(num_processes=2, local_mode=True, use_gpu=True)
                                  .run(seen, d))
spark.stop()
if server is not None:
    result["server_left"] = [p.pid for p in server.stop()]
result["alive"] = True
print("RESULT " + json.dumps(result), flush=True)
