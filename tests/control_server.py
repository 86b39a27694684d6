"""A real `raydist serve` subprocess on a free port, and the CLI beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raydist.control.client import Client

#: The Spark target of test servers unless a test names another.
MASTER = "local-cluster[2,1,1024]"
#: The Spark target of a server whose test starts no Ray cluster (auth, TLS,
#: its own life): one JVM where MASTER starts three.
NO_CLUSTERS = "local[1]"


class Server:
    def __init__(self, home: Path, port: int, extra: list[str] | None = None,
                 master: str | None = MASTER) -> None:
        self.home, self.port = home, port
        self.extra = extra or []
        self.master = master
        self.address = f"127.0.0.1:{port}"
        self.env = {**os.environ, "RAYDIST_HOME": str(home), "RAYDIST_ADDRESS": self.address}
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS", "RAYDIST_TOKEN"):
            self.env.pop(key, None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        info = self.home / "server.json"
        info.unlink(missing_ok=True)
        log = open(self.home / "test-server.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raydist.cli", "serve", "--port", str(self.port),
             *(["--spark-master", self.master] if self.master else []), *self.extra],
            env=self.env, stdout=log, stderr=log, start_new_session=True,
        )
        deadline = time.monotonic() + 60
        try:
            while not info.exists():
                assert self.proc.poll() is None, (self.home / "test-server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)
        except BaseException:
            self.stop(signal.SIGKILL)  # a server that did not come up is not left behind
            raise
        return self

    def wait_serving(self, timeout: float = 180) -> Server:
        """Wait until ClusterService reports SERVING (the server's Spark runs),
        as a deployment's readiness probe does. The server retries a Spark
        that fails to start; the log tail says why when it never does."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        request = health_pb2.HealthCheckRequest(service="raydist.v1.ClusterService")
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while stub.Check(request, timeout=5).status != health_pb2.HealthCheckResponse.SERVING:
                assert time.monotonic() < deadline, (self.home / "test-server.log").read_text()[-3000:]
                time.sleep(0.2)
        return self

    @property
    def token(self) -> str:
        return (self.home / "control_token").read_text().strip()

    def client(self, **kw: object) -> Client:
        token = kw.pop("token") if "token" in kw else self.token
        return Client(self.address, token=token, **kw)  # type: ignore[arg-type]

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "raydist.cli", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=120)
