"""GPU runs: pyspark's TorchDistributor against raydist's, on a machine with GPUs.

Runs where torch sees a CUDA device and Spark (Java) and Ray are installed;
anywhere else it says why and exits 0. On ``local-cluster[N,1,4096]``, one
executor per GPU (each Spark worker discovers its own device, as hosts
would), with ``spark.task.resource.gpu.amount=1``:

1. the same DDP function on pyspark's and raydist's ``TorchDistributor(
   num_processes=N, local_mode=False, use_gpu=True)`` (NCCL, each rank on
   ``cuda:LOCAL_RANK``): the first run in a fresh session, then a 4-run
   learning-rate sweep on the same distributor, pyspark and raydist in
   fresh processes, alternating;
2. raydist's facade ``TorchTrainer(use_gpu=True)`` (``prepare_model``,
   ``get_device``);
3. DeepSpeed ZeRO-2 on GPU (raydist's ``DeepspeedTorchDistributor``).

Last line:

  gpu_first_run_ratio=<raydist/pyspark> gpu_sweep_ratio=<raydist/pyspark> same_result=<true|false>
  facade_s=<seconds> deepspeed_s=<seconds>

Run: make bench-gpu (under five minutes on a host with 2 GPUs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

HERE = Path(__file__).resolve().parent
DISCOVERY = HERE.parent / "tests" / "resources" / "fake_gpus.sh"  # with one GPU a worker: real ids 0..N-1
SWEEP_LRS = (0.01, 0.02, 0.05, 0.1)


def why_not_here() -> str | None:
    """Why this machine cannot run the benchmark (None: it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (torch.cuda.is_available() is False)"
    if shutil.which("java") is None:
        return "no Java on PATH: Spark cannot start"
    for module in ("pyspark", "ray", "raydist"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed"
    return None


# ------------------------------------------------------------------ child side


def train(lr):
    """One DDP run as pyspark's docs write it: device from LOCAL_RANK, NCCL."""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=g).to(device)
    y = x.sum(1, keepdim=True)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device),
                device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(50):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world])
        loss.backward()
        opt.step()
    out = float(loss.detach())
    dist.destroy_process_group()
    return round(out, 4)


def facade_train(config):
    import ray.train
    import ray.train.torch
    import torch

    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(torch.nn.Linear(64, 1))
    x = torch.randn(1024, 64, device=device)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        opt.step()
    ray.train.report({"loss": float(loss), "device": str(device)})


def deepspeed_train():
    import os

    import deepspeed
    import torch

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    deepspeed.init_distributed("nccl")
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "fp16": {"enabled": False}}
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(8, 64, device=engine.device)
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
    return float(loss)


def child(side: str, gpus: int) -> dict:
    from pyspark.sql import SparkSession

    os.environ["RAYDIST_FAKE_GPUS"] = "1"
    os.environ["RAYDIST_FAKE_GPU_DIR"] = tempfile.mkdtemp(prefix="bench-gpus-")
    spark = (
        SparkSession.builder.master(f"local-cluster[{gpus},1,4096]")
        .config("spark.ui.enabled", "false")
        .config("spark.worker.resource.gpu.amount", "1")
        .config("spark.worker.resource.gpu.discoveryScript", str(DISCOVERY))
        .config("spark.executor.resource.gpu.amount", "1")
        .config("spark.task.resource.gpu.amount", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if side == "pyspark":
        from pyspark.ml.torch.distributor import TorchDistributor
    else:
        from raydist.compat import TorchDistributor
    distributor = TorchDistributor(num_processes=gpus, local_mode=False, use_gpu=True)
    out: dict = {}
    started = time.monotonic()
    out["first"] = distributor.run(train, 0.05)
    out["first_s"] = time.monotonic() - started
    started = time.monotonic()
    out["sweep"] = [distributor.run(train, lr) for lr in SWEEP_LRS]
    out["sweep_s"] = time.monotonic() - started
    if side == "raydist":
        from raydist.compat import DeepspeedTorchDistributor
        from raydist.train import TorchTrainer

        started = time.monotonic()
        result = TorchTrainer(facade_train, config={"lr": 0.01}, workers=gpus, use_gpu=True).fit()
        out["facade"] = {"loss": result.metrics.get("loss"), "device": result.metrics.get("device"),
                         "error": None if result.error is None else str(result.error)}
        out["facade_s"] = time.monotonic() - started
        started = time.monotonic()
        out["deepspeed"] = DeepspeedTorchDistributor(numGpus=1, nnodes=gpus, localMode=False,
                                                     useGpu=True).run(deepspeed_train)
        out["deepspeed_s"] = time.monotonic() - started
    spark.stop()
    return out


# ------------------------------------------------------------------ parent side


def measure(side: str, gpus: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", side, str(gpus)], capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{side} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(child(sys.argv[2], int(sys.argv[3]))), flush=True)
        return 0
    why = why_not_here()
    if why is not None:
        print(f"bench-gpu: nothing to measure here: {why}. Run it on a host with NVIDIA GPUs, Java and Spark.")
        return 0
    import torch

    gpus = min(torch.cuda.device_count(), 4)
    print(f"{gpus} GPU(s): local-cluster[{gpus},1,4096], one GPU an executor, spark.task.resource.gpu.amount=1",
          flush=True)
    theirs = measure("pyspark", gpus)
    ours = measure("raydist", gpus)
    for side, r in (("pyspark", theirs), ("raydist", ours)):
        print(f"  {side:8s} first run {r['first_s']:6.1f} s (loss {r['first']}), sweep x{len(SWEEP_LRS)} "
              f"{r['sweep_s']:6.1f} s (losses {r['sweep']})", flush=True)
    print(f"  raydist facade TorchTrainer(use_gpu=True) {ours['facade_s']:.1f} s: {ours['facade']}", flush=True)
    print(f"  raydist DeepSpeed ZeRO-2 {ours['deepspeed_s']:.1f} s: loss {ours['deepspeed']}", flush=True)
    same = ours["first"] == theirs["first"] and ours["sweep"] == theirs["sweep"] and ours["facade"]["error"] is None
    print(f"gpu_first_run_ratio={ours['first_s'] / theirs['first_s']:.3f} "
          f"gpu_sweep_ratio={ours['sweep_s'] / theirs['sweep_s']:.3f} same_result={str(same).lower()} "
          f"facade_s={ours['facade_s']:.1f} deepspeed_s={ours['deepspeed_s']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
