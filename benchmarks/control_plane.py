"""Control-plane read throughput: `raydist serve` vs a bare grpc.aio echo server.

Starts a real `raydist serve` (its own RAYDIST_HOME, 2 clusters recorded in its
store, Spark up), then 64 concurrent clients (one channel each) alternate
GetCluster and ListClusters for --seconds. The same load generator then hits a
bare grpc.aio echo server started the same way. Prints throughput, p50/p99 and,
last:

  rps=<requests per second> p99_ms=<p99 latency> errors=<count>

Run: .venv/bin/python benchmarks/control_plane.py [--seconds 20] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ECHO = "/bench.Echo/Echo"


async def _echo_server(port: int) -> None:
    import grpc

    async def echo(request: bytes, context: object) -> bytes:
        return request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await server.stop(1)


async def _load(address: str, token: str | None, clients: int, seconds: float, echo: bool) -> tuple[list[float], int]:
    import grpc

    from raydist._proto import pb

    metadata = [("authorization", f"Bearer {token}")] if token else []
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    # Requests are serialized once and responses left as bytes: the load
    # generator shares the machine's two cores with the server, and every
    # microsecond it spends on protobuf is taken from the server under test.
    if echo:
        calls = [(ECHO, b"x" * 64)]
    else:
        calls = [
            ("/raydist.v1.ClusterService/GetCluster", pb.GetClusterRequest(name="bench-a").SerializeToString()),
            ("/raydist.v1.ClusterService/ListClusters", pb.ListClustersRequest().SerializeToString()),
        ]

    async def one(i: int) -> None:
        nonlocal errors
        async with grpc.aio.insecure_channel(address) as channel:
            stubs = [(channel.unary_unary(method), body) for method, body in calls]
            n = i
            while time.perf_counter() < deadline:
                call, body = stubs[n % len(stubs)]
                t0 = time.perf_counter()
                try:
                    await call(body, timeout=5, metadata=metadata or None)
                    latencies.append(time.perf_counter() - t0)
                except grpc.RpcError:
                    errors += 1
                n += 1

    # The load generator's own garbage collections would show up as server
    # latency: collect once now, then not while measuring.
    gc.collect()
    gc.disable()
    try:
        await asyncio.gather(*(one(i) for i in range(clients)))
    finally:
        gc.enable()
    return latencies, errors


def _wait_idle(pid: int, *, below: float = 0.05, window_s: float = 2.0, timeout_s: float = 90.0) -> bool:
    """Wait until the process tree of ``pid`` uses less than ``below`` of one
    CPU over ``window_s``; False if it never does within ``timeout_s``."""
    import psutil

    def used(procs: list[psutil.Process]) -> float:
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    deadline = time.monotonic() + timeout_s
    root = psutil.Process(pid)
    while time.monotonic() < deadline:
        procs = [root, *root.children(recursive=True)]
        before = used(procs)
        time.sleep(window_s)
        if (used(procs) - before) / window_s < below:
            return True
    return False


def _report(label: str, latencies: list[float], errors: int, seconds: float) -> tuple[float, float]:
    rps = len(latencies) / seconds
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    p50, p99 = q[49] * 1000, q[98] * 1000
    print(f"{label:8} {rps:8.0f} req/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  errors {errors}", flush=True)
    return rps, p99


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--echo-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        asyncio.run(_echo_server(args.echo_server))
        return 0

    from raydist.control.client import Client
    from raydist.control.store import ClusterRow, Store
    from raydist.engine.ports import free_port
    from raydist.spec import ClusterSpec

    home = Path(tempfile.mkdtemp(prefix="raydist-bench-cp-"))
    store = Store(home / "state.db")
    for name in ("bench-a", "bench-b"):
        spec = ClusterSpec(name=name, workers=2, cpus_per_worker=1)
        store.put(ClusterRow(name=name, spec=spec.to_dict(), state="DELETED", message="recorded for the benchmark",
                             desired_workers=2))
    env = {**os.environ, "RAYDIST_HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAYDIST_TOKEN", None)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "raydist.cli", "serve", "--port", str(port), "--metrics-port",
                               "-1", "--spark-master", "local-cluster[2,1,1024]"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    echo_port = free_port()
    echo = subprocess.Popen([sys.executable, __file__, "--echo-server", str(echo_port)], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        while not (home / "server.json").exists():
            if server.poll() is not None:
                raise SystemExit("raydist serve exited")
            time.sleep(0.1)
        token = (home / "control_token").read_text().strip()
        client = Client(f"127.0.0.1:{port}", token=token)
        while not client.server_info().spark_master:
            time.sleep(0.5)
        assert len(client.list()) == 2
        # Measure a running server, not one whose executor JVMs are still
        # starting and compiling: wait until its process tree is idle.
        settled = _wait_idle(server.pid)
        print(f"server idle after start-up: {settled}", flush=True)
        assert echo.stdout is not None and echo.stdout.readline().strip() == b"ready"

        lat, errors = asyncio.run(_load(f"127.0.0.1:{port}", token, args.clients, args.seconds, echo=False))
        rps, p99 = _report("raydist", lat, errors, args.seconds)
        e_lat, e_errors = asyncio.run(_load(f"127.0.0.1:{echo_port}", None, args.clients, args.seconds, echo=True))
        e_rps, _ = _report("echo", e_lat, e_errors, args.seconds)
        print(f"raydist/echo throughput ratio: {rps / e_rps:.2f}")
        print(json.dumps({"rps": round(rps), "p99_ms": round(p99, 2), "errors": errors}))
    finally:
        for proc in (server, echo):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"rps={rps:.0f} p99_ms={p99:.2f} errors={errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
