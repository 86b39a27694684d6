"""A real MLflow tracking server (``mlflow server``: a SQLite backend, a
local artifact store it serves) on a free port: for the tests that read back
what ranks logged, and ``benchmarks/training.py``'s MLflow overhead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


class MlflowServer:
    """One ``mlflow server`` in a process group of its own; ``url`` once started."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="raydist-mlflow-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 120.0) -> MlflowServer:
        from raydist.engine.ports import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{self.dir / 'mlflow.db'}",
             "--artifacts-destination", str(self.dir / "artifacts")],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.dir / "server.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"mlflow server did not answer on {self.url}: {tail}")
            time.sleep(0.25)

    def stop(self) -> None:
        """End the server and the processes it started (its whole group)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(10)
                break
            except subprocess.TimeoutExpired:
                continue
