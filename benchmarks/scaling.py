"""Elastic clusters and the DataFrame handoff, each against its anchor in the same run.

(a) Scale: on one SparkSession (local-cluster[2,2,2048]), a cluster with no
    worker node (min 0, max 2, one CPU each) gets one task that needs a CPU;
    the time from submitting it to the task starting on a new node is
    measured for `ray.util.spark.setup_ray_cluster(min_worker_nodes=0,
    max_worker_nodes=2)` (Ray's autoscaler with its Spark node provider) and
    for `raydist.up(min_workers=0, max_workers=2)`. Then, for raydist, the time
    from that task's end until the node is gone and its Spark job has ended
    (idle timeout --idle-timeout s). The floor: on the same cluster, a bare
    `ray start` begun at the instant a task is submitted, to the task running
    (no detection delay, no Spark); its ratio to the anchor is printed too.
(b) Handoff: a DataFrame of --rows rows (a long, two doubles, a string) into
    a fully consumed Ray Dataset on a 2-worker raydist cluster:
    `raydist.data.from_spark(df)` against `df.write.parquet` +
    `ray.data.read_parquet`: each path's first call (printed apart), then
    --rounds rounds (5) of both, each round alternating which goes first;
    medians. Both must give Spark's own row count and
    column checksums. Peak memory: the machine's memory in use (MemTotal -
    MemAvailable) during each path, above what was in use just before it.

Last line:
  scale_up_ratio=<raydist/ray.util.spark> scale_down_s=<s> handoff_ratio=<raydist/parquet> same_rows=<true|false>

Targets: scale_up_ratio <= 0.5, scale_down_s <= idle timeout + 15, handoff_ratio <= 0.5, same_rows=true.

Run: .venv/bin/python benchmarks/scaling.py [--rows 2000000] [--idle-timeout 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

def _demand_to_node(ray: Any) -> float:
    """Submit one task that needs a CPU no node has; seconds until it starts."""

    @ray.remote(num_cpus=1)
    def started() -> float:
        return time.time()

    t0 = time.time()
    return ray.get(started.remote(), timeout=600) - t0


def anchor_scale_up(spark: Any, trials: int) -> list[float]:
    """``trials`` times: a fresh `setup_ray_cluster(min 0, max 2)`, one task, teardown."""
    import ray
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    times = []
    for _ in range(trials):
        setup_ray_cluster(min_worker_nodes=0, max_worker_nodes=2, num_cpus_worker_node=1, num_gpus_worker_node=0,
                          num_cpus_head_node=0)
        try:
            ray.init()
            times.append(_demand_to_node(ray))
        finally:
            ray.shutdown()
            shutdown_ray_cluster()
    return times


def bare_demand_to_task(ray: Any, address: str, env: dict[str, str]) -> float:
    """The floor of any demand-to-task time here: a task that needs a CPU no
    node has, and at that same instant a bare `ray start` joining the cluster
    (no detection delay, no Spark, no raydist); seconds until the task runs.
    The node has its own free ports and temp dir and is stopped by its own
    process group."""
    import signal
    import subprocess

    from raydist.engine.node.launch import ray_executable
    from raydist.engine.node.supervisor import NODE_PORT_OPTIONS
    from raydist.engine.ports import free_port

    @ray.remote(num_cpus=1)
    def started() -> float:
        return time.time()

    temp = tempfile.mkdtemp(prefix="raydist-floor-")
    taken: set[int] = set()
    argv = [ray_executable(), "start", "--block", f"--address={address}", "--num-cpus=1", "--num-gpus=0",
            f"--temp-dir={temp}", "--disable-usage-stats",
            *(f"--{opt}={free_port('127.0.0.1', taken)}" for opt in NODE_PORT_OPTIONS)]
    t0 = time.time()
    ref = started.remote()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **env}, start_new_session=True)
    try:
        return float(ray.get(ref, timeout=120)) - t0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


def raydist_scale(spark: Any, idle_timeout: float, trials: int) -> tuple[list[float], list[float], list[float]]:
    """``trials`` times on one elastic cluster: one task, then the wait until
    the idle node is gone; then ``trials`` floor readings on the same head."""
    import ray

    import raydist

    cluster = raydist.up(spark, name="scaling", min_workers=0, max_workers=2, cpus_per_worker=1,
                         idle_timeout_s=idle_timeout)
    tracker = spark.sparkContext.statusTracker()

    def slots_held() -> bool:
        jobs = tracker.getJobIdsForGroup(cluster.job_group)
        running = [j for j in jobs if (info := tracker.getJobInfo(j)) is not None and info.status == "RUNNING"]
        return bool(running) or cluster.status().desired_workers > 0

    ups, downs, floors = [], [], []
    try:
        assert cluster.status().desired_workers == 0
        ray.init()
        for _ in range(trials):
            t0 = time.time()
            ups.append(_demand_to_node(ray))
            ended = time.monotonic()
            while slots_held():
                time.sleep(0.2)
            downs.append(time.monotonic() - ended)
            steps = [f"+{t - t0:.2f} s {event.split(':')[0]}" for t, event in cluster.events()
                     if t >= t0 and ("scaling" in event or "worker" in event)]
            print(f"    trial {len(ups)}: {ups[-1]:.2f} s up, {downs[-1]:.1f} s down; {'; '.join(steps)}", flush=True)
        cluster.resize(workers=0)  # raydist adds no node now: the bare one is the only one
        floors = [bare_demand_to_task(ray, cluster.address, cluster.env()) for _ in range(trials)]
        return ups, downs, floors
    finally:
        ray.shutdown()
        cluster.down()


class PeakMemory:
    """The machine's highest memory in use while running, above what was in
    use at the start. In use is MemTotal - MemAvailable: shared memory (Ray's
    object store) counts once, where a sum of RSS counts it in every process
    that maps it; page cache that can be dropped does not count. One read of
    /proc/meminfo per sample, so the sampling does not slow what it measures."""

    def __init__(self) -> None:
        self.base = self._total()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _total() -> int:
        mem = psutil.virtual_memory()
        return int(mem.total - mem.available)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._total())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def _consume(ds: Any) -> tuple[int, int, float, int]:
    import pyarrow.compute as pc

    rows, ids, xs, chars = 0, 0, 0.0, 0
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        rows += batch.num_rows
        ids += pc.sum(batch.column("id")).as_py() or 0
        xs += pc.sum(batch.column("x")).as_py() or 0.0
        chars += pc.sum(pc.utf8_length(batch.column("s"))).as_py() or 0
    return rows, ids, round(xs, 3), chars


def handoff(spark: Any, rows: int, rounds: int) -> tuple[list[float], list[float], bool, float, float]:
    import ray
    from pyspark.sql import functions as F

    import raydist
    from raydist.data import from_spark

    df = spark.range(0, rows, 1, 8).selectExpr(
        "id", "CAST(id AS DOUBLE) * 0.5 AS x", "CAST(id % 1000 AS DOUBLE) AS y",
        "concat('row-', CAST(id AS STRING)) AS s")
    agg = df.agg(F.count("*"), F.sum("id"), F.sum("x"), F.sum(F.length("s"))).first()
    expected = (int(agg[0]), int(agg[1]), round(float(agg[2]), 3), int(agg[3]))
    ours, theirs, same = [], [], True
    first = (0.0, 0.0)
    peak_ours = peak_theirs = 0.0
    cluster = raydist.up(spark, name="handoff", workers=2, cpus_per_worker=1)

    def via_raydist() -> tuple[float, float, tuple[int, int, float, int]]:
        with PeakMemory() as mem:
            t0 = time.perf_counter()
            got = _consume(from_spark(df))
            took = time.perf_counter() - t0
        return took, mem.extra_mb, got

    def via_parquet() -> tuple[float, float, tuple[int, int, float, int]]:
        where = tempfile.mkdtemp(prefix="raydist-handoff-")
        try:
            with PeakMemory() as mem:
                t0 = time.perf_counter()
                df.write.mode("overwrite").parquet(where)
                got = _consume(ray.data.read_parquet(where))
                took = time.perf_counter() - t0
            return took, mem.extra_mb, got
        finally:
            shutil.rmtree(where, ignore_errors=True)

    try:
        ray.init()
        # Round 0 is each path's first call (Spark compiles the plan, Ray Data
        # starts its actors, from_spark starts the block agents): printed, and
        # kept apart from the medians.
        for r in range(rounds + 1):
            # Each round alternates which goes first: neither always finds Spark warmer.
            order = (via_raydist, via_parquet) if r % 2 == 0 else (via_parquet, via_raydist)
            results = {path: path() for path in order}
            (t_ours, m_ours, got_ours), (t_theirs, m_theirs, got_theirs) = results[via_raydist], results[via_parquet]
            same &= got_ours == expected and got_theirs == expected
            label = f"round {r}" if r else "first call"
            print(f"  {label}: from_spark {t_ours:.2f} s (+{m_ours:.0f} MB), parquet {t_theirs:.2f} s "
                  f"(+{m_theirs:.0f} MB), rows {got_ours[0]}", flush=True)
            if r == 0:
                first = (t_ours, t_theirs)
                continue
            ours.append(t_ours)
            theirs.append(t_theirs)
            peak_ours, peak_theirs = max(peak_ours, m_ours), max(peak_theirs, m_theirs)
    finally:
        ray.shutdown()
        cluster.down()
    return [first[0], *ours], [first[1], *theirs], same, peak_ours, peak_theirs


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _part(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one part in a fresh process (one Ray driver life per process: Ray
    does not take a second cluster with other auth settings well)."""
    import json
    import subprocess

    argv = [sys.executable, __file__, "--part", name, "--rows", str(args.rows), "--rounds", str(args.rounds),
            "--idle-timeout", str(args.idle_timeout), "--master", args.master, "--trials", str(args.trials)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        if not line.startswith("PART "):
            print(line, flush=True)
    results = [line for line in proc.stdout.splitlines() if line.startswith("PART ")]
    if proc.returncode != 0 or not results:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"part {name} failed (exit {proc.returncode})")
    return dict(json.loads(results[-1][len("PART "):]))


def run_part(args: argparse.Namespace) -> int:
    import json

    from raydist.engine.spark.session import embedded_session

    spark = embedded_session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if args.part == "anchor":
            out: dict[str, Any] = {"anchor": anchor_scale_up(spark, args.trials)}
        elif args.part == "scale":
            up, down, floor = raydist_scale(spark, args.idle_timeout, args.trials)
            out = {"up": up, "down": down, "floor": floor}
        else:
            ours, theirs, same, peak_ours, peak_theirs = handoff(spark, args.rows, args.rounds)
            out = {"ours": ours, "theirs": theirs, "same": same, "peak_ours": peak_ours, "peak_theirs": peak_theirs}
    finally:
        spark.stop()
    print("PART " + json.dumps(out), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=3, help="scale-ups measured per side (medians)")
    parser.add_argument("--idle-timeout", type=float, default=10.0)
    # Two cores per executor: the Ray nodes take one each, Spark's own jobs (the handoff) the other.
    parser.add_argument("--master", default="local-cluster[2,2,2048]")
    parser.add_argument("--part", choices=("anchor", "scale", "handoff"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        return run_part(args)
    from raydist.engine.node.procs import ray_processes, wait_no_ray_processes

    before = {p.pid for p in ray_processes()}
    anchors = _part("anchor", args)["anchor"]
    anchor = statistics.median(anchors)
    print(f"scale up, ray.util.spark: {anchor:.1f} s from demand to a task on a new node "
          f"(median of {_fmt(anchors)})", flush=True)
    scale = _part("scale", args)
    up, down, floor = (statistics.median(scale[k]) for k in ("up", "down", "floor"))
    print(f"scale up, raydist:        {up:.1f} s (median of {_fmt(scale['up'])}); slots back {down:.1f} s after "
          f"the work ended (idle timeout {args.idle_timeout:g} s)", flush=True)
    print(f"scale up, floor:          {floor:.1f} s (median of {_fmt(scale['floor'])}): a bare `ray start` begun at "
          f"the instant of demand, to the task running; floor ratio {floor / anchor:.3f}", flush=True)
    data = _part("handoff", args)
    left = wait_no_ray_processes(ignore=before)
    o, t = statistics.median(data["ours"][1:]), statistics.median(data["theirs"][1:])
    print(f"handoff of {args.rows} rows, median of {args.rounds} rounds: from_spark {o:.2f} s "
          f"(peak +{data['peak_ours']:.0f} MB), parquet {t:.2f} s (peak +{data['peak_theirs']:.0f} MB); "
          f"first call (block agents start, Spark and Ray Data cold): {data['ours'][0]:.2f} s against "
          f"{data['theirs'][0]:.2f} s "
          f"(ratio {data['ours'][0] / data['theirs'][0]:.3f}); leftover_ray_processes={len(left)}")
    print(f"scale_up_ratio={up / anchor:.3f} scale_down_s={down:.1f} handoff_ratio={o / t:.3f} "
          f"same_rows={'true' if data['same'] else 'false'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
