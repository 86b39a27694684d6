"""The control plane forks while it serves (Spark's gateway JVM, a head's
`ray start`). gRPC's fork handlers crashed such children before exec (CI: the
server's first Spark start died with SIGSEGV); raydist turns them off."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.component

# A fresh interpreter: gRPC reads its fork setting at its first import, which
# must be raydist's (as in `raydist serve`), not pytest's.
_SCRIPT = textwrap.dedent("""
    import asyncio, signal, subprocess, threading
    import raydist.control.server  # noqa: F401 - the first gRPC import, as in `raydist serve`
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    def call(address, stop):
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not stop.is_set():
                stub.Check(health_pb2.HealthCheckRequest(), timeout=5)

    def fork(codes):
        for _ in range(200):  # preexec_fn: the fork pyspark's gateway launch makes
            child = subprocess.Popen(["true"], stdin=subprocess.PIPE,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            codes.append(child.wait())

    async def main():
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop, codes = threading.Event(), []
        for _ in range(2):
            threading.Thread(target=call, args=(f"127.0.0.1:{port}", stop), daemon=True).start()
        forker = threading.Thread(target=fork, args=(codes,))
        forker.start()
        while forker.is_alive():
            await asyncio.sleep(0.05)
        stop.set()
        await server.stop(0)
        print(len(codes), sorted(set(codes)))

    asyncio.run(main())
""")


def test_children_forked_while_grpc_serves_all_run() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # 200 children, every one exited 0 (a crashed one exits -11 or -6)
    assert out.stdout.split("\n")[-2] == "200 [0]", out.stdout + out.stderr[-2000:]
