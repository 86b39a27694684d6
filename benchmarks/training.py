"""Spark's distributors against raydist's, on the path Spark users take.

Every measurement runs in a fresh process with its own SparkSession on
``local-cluster[2,1,2048]``, with no ``cluster=`` and no ``RAY_ADDRESS``:
exactly a Spark user's program with one import changed. pyspark and raydist
alternate, case by case.

1. The first run of each class in a fresh session (raydist's includes
   starting its session cluster, or its local forker):
   - ``TorchDistributor(num_processes=2, local_mode=False)`` with a function,
   - ``TorchDistributor(num_processes=2, local_mode=True)`` with an argparse script,
   - ``DeepspeedTorchDistributor(numGpus=2, localMode=False)``, the function
     reading its config from ``sys.argv`` as Spark hands it over,
   - ``MirroredStrategyRunner(num_slots=2, use_custom_strategy=True)`` with a
     custom training loop (spark-tensorflow-distributor's original).
2. A learning-rate sweep: one distributor, ``run()`` four times, per run and
   in total.
3. Compute-bound samples/s after the sweep, in the same sessions
   (``--compute-s`` split over ``--compute-rounds`` runs; the median counts).
4. The user's own Spark work right after a run: a Spark job needing every
   task slot, timed, then the next run, timed (what a notebook that
   alternates data work and training pays), then ``--alive-wait-s`` (past Ray's 60 s GCS timeout,
   which ends a process still connected to a cluster that went) and another
   run. ``alive`` is whether the program got to the end.
5. MLflow's cost (raydist only; the anchor is the same runs without MLflow in
   the same process): one warm distributor, runs alternating with and without
   an open MLflow run on a real tracking server (``mlflow server``, started
   here), ``--mlflow-rounds`` of each; the difference of the medians is what a
   run pays for its context reaching every rank and raydist's figures.

Last line:

  first_run_ratio=<median over the classes of raydist/pyspark> sweep_ratio=<raydist total/pyspark total>
  throughput_ratio=<samples/s raydist/pyspark> same_result=<true|false>
  spark_after_s=<that Spark job's seconds, raydist minus pyspark> alive=<true|false: both programs ended well>
  mlflow_overhead_s=<median run with MLflow on minus off>
  after_spark_run_ratio=<the run right after that Spark job, raydist/pyspark>
  sweep_floor_ratio=<the sweep's floor/pyspark total>

The sweep's floor is the same four runs with no launcher at all: the
function called by Spark's own Python worker in each barrier task, rank 0's
port picked on the driver (this benchmark's executors share its host). Any
design that runs a first run in Spark's tasks pays at least that; a
``sweep_ratio`` target below ``sweep_floor_ratio`` is below this machine's
floor.

(one line). Run: make bench-training (``--only-mlflow``: step 5 alone)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

HERE = Path(__file__).resolve().parent
MASTER = "local-cluster[2,1,2048]"
CASES = ("torch_fn", "torch_script", "deepspeed", "mirrored")
SWEEP_LRS = (0.01, 0.02, 0.05, 0.1)


# ------------------------------------------------------------------ child side


def _session():
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(MASTER)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.RAY_USAGE_STATS_ENABLED", "0")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _bare_run(spark, fn, *args):  # noqa: ANN001, ANN002, ANN202
    """The floor of any launcher in Spark's tasks, pyspark's and raydist's
    alike: one barrier stage whose tasks set torchrun's variables and call
    ``fn`` in Spark's own Python worker (no process of their own, nothing
    to watch, no round of the barrier: rank 0's port is picked here, as this
    benchmark's executors run on this host)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n = 2

    def task(_):  # noqa: ANN001, ANN202
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        os.environ.update(MASTER_ADDR=ctx.getTaskInfos()[0].address.rsplit(":", 1)[0], MASTER_PORT=str(port),
                          RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        out = fn(*args)
        return [out] if rank == 0 else []

    return spark.sparkContext.parallelize(range(n), n).barrier().mapPartitions(task).collect()[0]


def _sweep(run) -> dict:  # noqa: ANN001
    """``run(lr)`` at each of SWEEP_LRS: each run's seconds, its result, and the total."""
    runs, result = [], []
    for lr in SWEEP_LRS:
        t = time.perf_counter()
        result.append(run(lr))
        runs.append(time.perf_counter() - t)
    return {"runs": runs, "result": result, "seconds": sum(runs)}


def _classes(side: str):
    if side == "pyspark":
        from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor
        from pyspark.ml.torch.distributor import TorchDistributor
        from spark_tensorflow_distributor import MirroredStrategyRunner
    else:
        from raydist.compat import DeepspeedTorchDistributor, MirroredStrategyRunner, TorchDistributor
    return TorchDistributor, DeepspeedTorchDistributor, MirroredStrategyRunner


def child(side: str, case: str, compute_s: float, compute_rounds: int, alive_wait_s: float = 70.0,
          mlflow_uri: str = "", mlflow_rounds: int = 5) -> dict:
    sys.path.insert(0, str(HERE))
    import training_jobs as jobs
    from pyspark import cloudpickle as spark_pickle

    spark_pickle.register_pickle_by_value(jobs)  # executors cannot import benchmarks/
    if side == "raydist":
        from ray import cloudpickle as ray_pickle

        ray_pickle.register_pickle_by_value(jobs)
    spark = _session()
    torch_d, ds_d, tf_r = _classes("pyspark" if side == "bare" else side)
    out: dict = {"side": side, "case": case}
    try:
        t0 = time.perf_counter()
        if side == "bare":  # the sweep's floor
            out.update(_sweep(lambda lr: _bare_run(spark, jobs.tiny_job, lr)))
        elif case == "torch_fn":
            out["result"] = torch_d(num_processes=2, local_mode=False, use_gpu=False).run(jobs.tiny_job, 0.05)
        elif case == "torch_script":
            with tempfile.TemporaryDirectory() as tmp:
                script = Path(tmp) / "train.py"
                script.write_text(jobs.SCRIPT.format(here=str(HERE)))
                out["result"] = torch_d(num_processes=2, local_mode=True, use_gpu=False).run(
                    str(script), "--lr", "0.05"
                )
        elif case == "deepspeed":
            os.environ["DS_ACCELERATOR"] = "cpu"  # a CPU-only machine, both sides
            out["result"] = ds_d(
                numGpus=2, nnodes=1, localMode=False, useGpu=False, deepspeedConfig=jobs.DEEPSPEED_CONFIG
            ).run(jobs.deepspeed_job)
        elif case == "mirrored":
            out["result"] = tf_r(num_slots=2, local_mode=False, use_gpu=False, use_custom_strategy=True).run(
                jobs.mirrored_custom_loop
            )
        elif case == "sweep":
            distributor = torch_d(num_processes=2, local_mode=False, use_gpu=False)
            out.update(_sweep(lambda lr: distributor.run(jobs.tiny_job, lr)))
            out["samples_per_s"] = [
                distributor.run(jobs.compute_job, compute_s / compute_rounds) for _ in range(compute_rounds)
            ]
        elif case == "spark_after":
            distributor = torch_d(num_processes=2, local_mode=False, use_gpu=False)
            out["result"] = [distributor.run(jobs.tiny_job, 0.05)]
            slots = spark.sparkContext.defaultParallelism
            t = time.perf_counter()
            spark.sparkContext.parallelize(range(slots), slots).map(lambda i: i * i).sum()
            out["spark_after_s"] = time.perf_counter() - t
            t = time.perf_counter()
            out["result"].append(distributor.run(jobs.tiny_job, 0.05))
            out["after_run_s"] = time.perf_counter() - t
            time.sleep(alive_wait_s)
            out["result"].append(distributor.run(jobs.tiny_job, 0.05))
            out["alive"] = True
        elif case == "mlflow":
            import mlflow

            mlflow.set_tracking_uri(mlflow_uri)
            mlflow.set_experiment("bench-training")
            distributor = torch_d(num_processes=2, local_mode=False, use_gpu=False)
            distributor.run(jobs.tiny_job, 0.05)  # warm: the session cluster and its workers
            out["off"], out["on"] = [], []
            for _ in range(mlflow_rounds):
                t = time.perf_counter()
                distributor.run(jobs.tiny_job, 0.05)
                out["off"].append(time.perf_counter() - t)
                with mlflow.start_run():
                    t = time.perf_counter()
                    distributor.run(jobs.tiny_job, 0.05)
                    out["on"].append(time.perf_counter() - t)
        if "seconds" not in out:
            out["seconds"] = time.perf_counter() - t0
    finally:
        spark.stop()
    return out


# ----------------------------------------------------------------- parent side


def measure(side: str, case: str, args: argparse.Namespace, *, may_die: bool = False, timeout_s: float = 1200) -> dict:
    """One case in a fresh process. ``may_die``: a process that ends early
    is a finding (``alive`` false), not a failed benchmark."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"}
    env.pop("RAY_ADDRESS", None)
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        cmd = [sys.executable, __file__, "--child", side, case, result.name,
               "--compute-s", str(args.compute_s), "--compute-rounds", str(args.compute_rounds),
               "--alive-wait-s", str(args.alive_wait_s), "--mlflow-uri", getattr(args, "mlflow_uri", ""),
               "--mlflow-rounds", str(args.mlflow_rounds)]
        with open(Path(tempfile.gettempdir()) / f"bench-training-{side}-{case}.log", "w") as log:
            try:
                proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                      check=False)
            except subprocess.TimeoutExpired:  # run() killed it; its Spark JVMs end as its gateway's pipe closes
                if not may_die:
                    raise
                print(f"  {side} {case}: no answer in {timeout_s:.0f} s; see {log.name}", flush=True)
                return {"alive": False, "exit": "timeout"}
        text = Path(result.name).read_text()
    if proc.returncode != 0 or not text:
        if may_die:
            print(f"  {side} {case}: the program ended early (exit {proc.returncode}); see {log.name}", flush=True)
            return {"alive": False, "exit": proc.returncode}
        raise SystemExit(f"{side} {case} failed (exit {proc.returncode}); see {log.name}")
    return json.loads(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compute-s", type=float, default=30.0, help="seconds of compute-bound training per side")
    parser.add_argument("--compute-rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help="first-run cases to measure")
    parser.add_argument("--alive-wait-s", type=float, default=70.0,
                        help="after the Spark job, wait this long (past Ray's 60 s GCS timeout), then train again")
    parser.add_argument("--mlflow-rounds", type=int, default=5, help="runs with and without MLflow, each")
    parser.add_argument("--only-mlflow", action="store_true", help="measure MLflow's cost alone (step 5)")
    parser.add_argument("--only-sweep", action="store_true", help="measure the sweep and its floor alone (step 2)")
    parser.add_argument("--mlflow-uri", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "CASE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, case, out = args.child
        Path(out).write_text(json.dumps(child(side, case, args.compute_s, args.compute_rounds, args.alive_wait_s,
                                              args.mlflow_uri, args.mlflow_rounds)))
        return 0
    if args.only_mlflow:
        print(f"mlflow_overhead_s={mlflow_overhead(args):.3f}")
        return 0
    if args.only_sweep:
        sweep, floor, same = sweep_and_floor(args)
        theirs = sweep["pyspark"]["seconds"]
        print(f"sweep_ratio={sweep['raydist']['seconds'] / theirs:.3f} "
              f"sweep_floor_ratio={floor['seconds'] / theirs:.3f} same_result={str(same).lower()}")
        return 0

    ratios, same = [], True
    print(f"first run of each class in a fresh session on {MASTER} (no cluster=, no RAY_ADDRESS):", flush=True)
    for i, case in enumerate(args.cases.split(",")):
        order = ("pyspark", "raydist") if i % 2 == 0 else ("raydist", "pyspark")
        got = {side: measure(side, case, args) for side in order}
        theirs, ours = got["pyspark"], got["raydist"]
        ratios.append(ours["seconds"] / theirs["seconds"])
        if case != "mirrored":  # TF's collective reduction order may differ in the last digits
            same = same and theirs["result"] == ours["result"]
        print(f"  {case:13s} pyspark {theirs['seconds']:6.1f} s -> {theirs['result']}   "
              f"raydist {ours['seconds']:6.1f} s -> {ours['result']}   ratio {ratios[-1]:.2f}", flush=True)

    sweep, floor, same_sweep = sweep_and_floor(args)
    same = same and same_sweep
    print("compute-bound samples/s: " + "; ".join(
        f"{side} " + ", ".join(f"{v:,.0f}" for v in sweep[side]["samples_per_s"]) for side in ("pyspark", "raydist")
    ))
    sps = {side: statistics.median(sweep[side]["samples_per_s"]) for side in sweep}

    print(f"the user's Spark job on every slot right after a run, then {args.alive_wait_s:g} s, then a run:",
          flush=True)
    after = {side: measure(side, "spark_after", args, may_die=True) for side in ("pyspark", "raydist")}
    alive = all(after[side].get("alive") for side in after)
    for side in ("pyspark", "raydist"):
        a = after[side]
        if "spark_after_s" in a:
            print(f"  {side:8s} Spark job {a['spark_after_s']:.2f} s, the run after it {a['after_run_s']:.1f} s, "
                  f"alive={str(bool(a.get('alive'))).lower()} -> {a['result']}", flush=True)
    if alive:
        same = same and after["pyspark"]["result"] == after["raydist"]["result"]
    spark_after = (after["raydist"]["spark_after_s"] - after["pyspark"]["spark_after_s"]
                   if all("spark_after_s" in a for a in after.values()) else float("nan"))
    after_run = (after["raydist"]["after_run_s"] / after["pyspark"]["after_run_s"]
                 if all("after_run_s" in a for a in after.values()) else float("nan"))

    overhead = mlflow_overhead(args)
    first = statistics.median(ratios)
    sweep_ratio = sweep["raydist"]["seconds"] / sweep["pyspark"]["seconds"]
    print(f"first_run_ratio={first:.3f} sweep_ratio={sweep_ratio:.3f} "
          f"throughput_ratio={sps['raydist'] / sps['pyspark']:.3f} same_result={str(same).lower()} "
          f"spark_after_s={spark_after:.2f} alive={str(alive).lower()} mlflow_overhead_s={overhead:.3f} "
          f"after_spark_run_ratio={after_run:.3f} "
          f"sweep_floor_ratio={floor['seconds'] / sweep['pyspark']['seconds']:.3f}")
    return 0


def sweep_and_floor(args: argparse.Namespace) -> tuple[dict, dict, bool]:
    """Step 2: the sweep on both sides, and its floor."""
    print("sweep: one distributor, run() x4 (learning rates " + ", ".join(map(str, SWEEP_LRS)) + "):", flush=True)
    sweep = {side: measure(side, "sweep", args) for side in ("raydist", "pyspark")}
    for side in ("pyspark", "raydist"):
        s = sweep[side]
        print(f"  {side:8s} " + " / ".join(f"{t:.1f}" for t in s["runs"]) + f" s, total {s['seconds']:.1f} s "
              f"-> {s['result']}", flush=True)
    # The floor has no launcher to watch its ranks: a run whose gloo init waits for ever hangs it (seen once).
    floor = measure("bare", "sweep", args, may_die=True, timeout_s=240)
    if "runs" in floor:
        print("  floor    " + " / ".join(f"{t:.1f}" for t in floor["runs"]) + f" s, total {floor['seconds']:.1f} s "
              f"-> {floor['result']} (the function called in Spark's own barrier tasks: no launcher at all)",
              flush=True)
    else:
        floor = {"seconds": float("nan"), "result": sweep["pyspark"]["result"]}
    same = sweep["pyspark"]["result"] == sweep["raydist"]["result"] == floor["result"]
    return sweep, floor, same


def mlflow_overhead(args: argparse.Namespace) -> float:
    """Step 5: the median warm run with an open MLflow run minus without."""
    from raydist.testing.mlflow_server import MlflowServer

    server = MlflowServer().start()
    try:
        args.mlflow_uri = server.url
        got = measure("raydist", "mlflow", args)
    finally:
        server.stop()
    on, off = statistics.median(got["on"]), statistics.median(got["off"])
    print(f"MLflow on a warm TorchDistributor run ({args.mlflow_rounds} of each, alternated): "
          f"off {' / '.join(f'{t:.2f}' for t in got['off'])} s, on {' / '.join(f'{t:.2f}' for t in got['on'])} s; "
          f"medians {off:.2f} -> {on:.2f} s", flush=True)
    return on - off


if __name__ == "__main__":
    sys.exit(main())
