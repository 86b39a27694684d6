"""Time to a ready Ray cluster on Spark: raydist vs ray.util.spark.

In one process and on one SparkSession (local-cluster[2,1,2048] by default),
alternate at least 3 times:
  (a) the anchor: ray.util.spark.setup_ray_cluster(max_worker_nodes=2,
      num_cpus_worker_node=1, num_gpus_worker_node=0) to ready, then
      shutdown_ray_cluster();
  (b) raydist.up(workers=2, cpus_per_worker=1) to ready, then down().
Prints each run, the medians, and as the last line:
  startup_ratio=<raydist/anchor median> teardown_s=<raydist median> leftover_processes=<n>

With --master standalone, the same on a real Spark standalone cluster started
here (master and two worker daemons from pip's pyspark), each worker in its own
network namespace when the machine allows it, so Ray nodes sit on separate
hosts (raydist.testing.standalone).

Run: make bench-startup   (or .venv/bin/python benchmarks/startup.py --rounds 3)
     .venv/bin/python benchmarks/startup.py --master standalone
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def anchor_once(spark) -> tuple[float, float]:
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    # As its users run it: no token auth. Said explicitly: once ~/.ray/auth_token
    # exists, `ray start --head` turns token auth on by itself while the
    # ray.init it then makes does not, and the anchor cannot start at all.
    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        t0 = time.perf_counter()
        setup_ray_cluster(max_worker_nodes=2, num_cpus_worker_node=1, num_gpus_worker_node=0)
        ready = time.perf_counter() - t0
        t0 = time.perf_counter()
        shutdown_ray_cluster()
        return ready, time.perf_counter() - t0
    finally:
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before


def raydist_once(spark, i: int) -> tuple[float, float]:
    import raydist

    t0 = time.perf_counter()
    cluster = raydist.up(spark, name=f"bench-{i}", workers=2, cpus_per_worker=1)
    ready = time.perf_counter() - t0
    assert cluster.status().ready_workers == 2
    created = cluster.status().created_at
    steps = [f"{when - created:5.1f}s {what}" for when, what in cluster.events() if " up " in f" {what} "]
    print("    " + "; ".join(steps), flush=True)
    t0 = time.perf_counter()
    cluster.down()
    return ready, time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--master", default="local-cluster[2,1,2048]",
                        help="Spark master, or 'standalone' to start a standalone cluster of two "
                             "1-core worker hosts here (default: local-cluster[2,1,2048])")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
    from raydist.engine.spark.session import embedded_session

    before = {p.pid for p in ray_processes()}
    standalone = None
    master, conf = args.master, {"spark.ui.enabled": "false"}
    if args.master == "standalone":
        from raydist.testing.netns import netns_unavailable_reason
        from raydist.testing.standalone import StandaloneSpark

        why = netns_unavailable_reason()
        standalone = StandaloneSpark(workers=2, cores=1, memory="3g", isolate=why is None).start()
        master, conf = standalone.master_url, standalone.driver_conf()
        hosts = ", ".join(d.host for d in standalone.daemons)
        print(f"standalone master {master}; worker hosts {hosts}"
              + (f" (one host: {why})" if why else " (separate network namespaces)"), flush=True)
    spark = embedded_session(master, conf)
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.parallelize(range(2), 2).count()  # warm the executors' Python workers

    anchor: list[float] = []
    ours: list[float] = []
    ours_down: list[float] = []
    try:
        for i in range(args.rounds):
            a_up, a_down = anchor_once(spark)
            wait_no_ray_processes(30, ignore=before)
            anchor.append(a_up)
            print(f"round {i}: ray.util.spark ready {a_up:6.2f} s  shutdown {a_down:5.2f} s", flush=True)
            wait_no_ray_processes(30, ignore=before)  # the anchor's nodes exit asynchronously
            before_ours = {p.pid for p in ray_processes()}
            r_up, r_down = raydist_once(spark, i)
            ours.append(r_up)
            ours_down.append(r_down)
            print(f"round {i}: raydist         ready {r_up:6.2f} s  down     {r_down:5.2f} s", flush=True)
        # Measured at once after the last down(): down() promises the processes are gone.
        left = [p for p in ray_processes() if p.pid not in before_ours]
        leftover = len(left)
        for proc in left:
            print(f"left running: pid {proc.pid} {' '.join(proc.cmdline()[:3])}")
    finally:
        spark.stop()
        if standalone is not None:
            standalone.stop()

    a_med, r_med, d_med = statistics.median(anchor), statistics.median(ours), statistics.median(ours_down)
    print(f"median ready: ray.util.spark {a_med:.2f} s, raydist {r_med:.2f} s; raydist down {d_med:.2f} s")
    print(f"startup_ratio={r_med / a_med:.3f} teardown_s={d_med:.2f} leftover_processes={leftover}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
