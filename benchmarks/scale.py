"""One driver, many nodes: what a cluster of N worker nodes costs the driver.

For N = 10, 100 and 1,000 this starts a real ``raydist serve`` (the real
control plane, engine and node channel) whose Spark is simulated
(:mod:`raydist.testing.simspark`): each worker's "Spark task" is a simulated
node in a simulator process that speaks the real node link (authenticated
hello, ``started``, heartbeats, log requests, ``stop``) with no Ray behind it,
the head included. This machine (2 cores) cannot run a thousand Ray nodes or
a thousand Spark tasks; what is measured is the driver's own cost per node.
Real Spark and Ray at N=10 are ``make bench-startup``'s business.

Per N it prints: time from CreateCluster to RUNNING, the server's threads
(the OS's count: gRPC's own included), its RSS, its CPU (percent of one core)
over a minute of steady heartbeats, GetCluster's p99 while the cluster starts
(a client polling all along), and DeleteCluster's time. The last line is N=1000:

    nodes=1000 ready_s=... driver_threads=... steady_cpu_pct=... status_p99_ms=... down_s=... errors=0

Targets: driver_threads <= 64, steady_cpu_pct <= 10, ready_s <= 30,
status_p99_ms <= 100, down_s <= 30, errors=0.

``python benchmarks/scale.py --serve EXECUTORS ...`` is the server side: the
CLI's ``raydist serve`` with a simulated Spark of that many executors.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

SIZES = (10, 100, 1000)
STEADY_S = 60.0


def serve_simulated(executors: int, argv: list[str]) -> int:
    """``raydist serve`` whose SparkSession is a simulated one."""
    import raydist.engine.spark.session as spark_mod
    from raydist import cli
    from raydist.testing.simspark import SimSpark

    spark_mod.embedded_session = lambda *args, **kwargs: SimSpark(executors)  # type: ignore[assignment]
    return cli.main(["serve", *argv])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_one(n: int, steady_s: float) -> dict[str, float]:
    import psutil
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from raydist._proto import pb
    from raydist.control.client import Client

    home = Path(tempfile.mkdtemp(prefix=f"raydist-scale-{n}-"))
    port = _free_port()
    env = {**os.environ, "RAYDIST_HOME": str(home)}
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS", "RAYDIST_TOKEN"):
        env.pop(key, None)
    log = open(home / "server.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(n + 1), "--port", str(port), "--head",
                             "executor", "--metrics-port", "-1"], env=env, stdout=log, stderr=log,
                            start_new_session=True)
    errors = 0
    try:
        deadline = time.monotonic() + 60
        while not (home / "server.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((home / "server.log").read_text()[-2000:])
            time.sleep(0.1)
        import grpc

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="raydist.v1.ClusterService")
            while stub.Check(request, timeout=5).status != health_pb2.HealthCheckResponse.SERVING:
                time.sleep(0.1)
        client = Client(f"127.0.0.1:{port}", token=(home / "control_token").read_text().strip())
        server = psutil.Process(proc.pid)
        name = "scale"
        latencies: list[float] = []
        poll_errors = [0]
        starting = threading.Event()
        starting.set()

        def poll() -> None:
            while starting.is_set():
                t = time.perf_counter()
                try:
                    client.get(name, timeout=5)
                except Exception:  # noqa: BLE001 - NOT_FOUND before the create lands is not an error
                    if latencies:
                        poll_errors[0] += 1
                    time.sleep(0.01)
                    continue
                latencies.append((time.perf_counter() - t) * 1000)
                time.sleep(0.01)

        poller = threading.Thread(target=poll, daemon=True)
        spec = pb.ClusterSpec(name=name, workers=n, cpus_per_worker=1, start_timeout_s=600)
        t0 = time.monotonic()
        client.create(spec)
        poller.start()
        while True:
            got = client.get(name, timeout=10)
            if got.state == pb.RUNNING and got.ready_workers == n:
                break
            if got.state in (pb.FAILED, pb.DELETED) or time.monotonic() - t0 > 600:
                raise RuntimeError(f"the cluster did not start: {got.message}")
            time.sleep(0.05)
        ready_s = time.monotonic() - t0
        starting.clear()
        poller.join()
        errors += poll_errors[0]
        time.sleep(3)  # the last syncs settle
        cpu0, w0 = server.cpu_times(), time.monotonic()
        threads = server.num_threads()
        time.sleep(steady_s)
        cpu1, w1 = server.cpu_times(), time.monotonic()
        threads = max(threads, server.num_threads())
        rss = server.memory_info().rss
        steady = 100.0 * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (w1 - w0)
        got = client.get(name, timeout=10)
        if got.state != pb.RUNNING or got.ready_workers != n:
            errors += 1  # a node lost in the steady minute
        t0 = time.monotonic()
        gone = client.delete(name, timeout=120)
        down_s = time.monotonic() - t0
        if gone.state != pb.DELETED:
            errors += 1
        client.close()
        return {"nodes": n, "ready_s": ready_s, "driver_threads": threads, "rss_mb": rss / 2**20,
                "steady_cpu_pct": steady, "status_p99_ms": _percentile(latencies, 0.99),
                "status_p50_ms": _percentile(latencies, 0.5), "status_calls": len(latencies), "down_s": down_s,
                "errors": errors}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        return serve_simulated(int(sys.argv[2]), sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--steady-s", type=float, default=STEADY_S)
    args = parser.parse_args()
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        r = run_one(n, args.steady_s)
        results.append(r)
        print(f"N={n:5d}  ready {r['ready_s']:6.2f} s  threads {r['driver_threads']:3.0f}  "
              f"rss {r['rss_mb']:6.0f} MiB  steady cpu {r['steady_cpu_pct']:5.1f} %  "
              f"GetCluster p50 {r['status_p50_ms']:6.2f} ms p99 {r['status_p99_ms']:7.2f} ms "
              f"({r['status_calls']:.0f} calls)  down {r['down_s']:5.2f} s  errors {r['errors']:.0f}", flush=True)
    last = results[-1]
    print(f"nodes={last['nodes']} ready_s={last['ready_s']:.2f} driver_threads={last['driver_threads']:.0f} "
          f"steady_cpu_pct={last['steady_cpu_pct']:.1f} status_p99_ms={last['status_p99_ms']:.1f} "
          f"down_s={last['down_s']:.2f} errors={last['errors']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
