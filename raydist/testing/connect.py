"""A real Spark Connect server on this machine, from pip's pyspark.

The server is a Spark driver of its own (``SparkConnectServer`` under
``spark-submit``) over any master, by default a ``local-cluster`` with real
executor JVMs; clients reach it only over gRPC at :attr:`ConnectServer.url`::

    with ConnectServer(master="local-cluster[2,1,2048]") as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()
        ...

Used by the tests and by ``benchmarks/connect.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

from raydist.engine.ports import free_port, wait_for_port
from raydist.testing.standalone import spark_home

__all__ = ["ConnectServer"]

_MAIN = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class ConnectServer:
    """One Spark Connect server: ``master`` is its Spark master, ``conf``
    more settings for its driver; ``host`` the address it listens on;
    ``netns`` a network namespace (:mod:`raydist.testing.netns`) to run it,
    and so its executors, in: another host, as a client sees it."""

    master: str = "local-cluster[2,1,2048]"
    conf: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    netns: str = ""
    start_timeout_s: float = 120.0
    port: int = 0
    _dir: Path | None = None
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process (its Spark driver, parent of its executors), while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def url(self) -> str:
        """The ``sc://`` address a client passes to ``SparkSession.builder.remote``."""
        return f"sc://{self.host}:{self.port}"

    def start(self) -> ConnectServer:
        self._dir = Path(tempfile.mkdtemp(prefix="raydist-connect-"))
        # A namespace of its own is a fresh host: any port is free there.
        self.port = free_port("127.0.0.1" if self.netns else self.host)
        settings = {
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": self.host,
            # Executors run this interpreter: it has Ray and raydist installed.
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.RAY_USAGE_STATS_ENABLED": "0",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.speculation": "false",
            "spark.task.maxFailures": "8",
            "spark.python.worker.reuse": "true",
            **self.conf,
        }
        argv = [*(("ip", "netns", "exec", self.netns) if self.netns else ()),
                str(spark_home() / "bin" / "spark-submit"), "--master", self.master, "--class", _MAIN]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        argv.append("spark-internal")
        # The server starts Python workers with PYSPARK_PYTHON from its own
        # environment, not spark.pyspark.python: both say the same here.
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "PYSPARK_PYTHON": settings["spark.pyspark.python"],
               "SPARK_LOG_DIR": str(self._dir)}
        env.pop("SPARK_REMOTE", None)
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        log = open(self._dir / "server.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            self._proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while not wait_for_port(self.host, self.port, min(deadline, time.monotonic() + 1.0)):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not listen on {self.url}: {tail}")
        return self

    def log_tail(self, lines: int = 30) -> str:
        if self._dir is None:
            return "(no log)"
        try:
            return "\n".join((self._dir / "server.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> list[psutil.Process]:
        """Stop the server and every process it started (executors, their
        Python workers); returns those still alive 15 s later."""
        proc, self._proc = self._proc, None
        left: list[psutil.Process] = []
        if proc is not None and proc.poll() is None:
            try:
                root = psutil.Process(proc.pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                tree = []
            try:
                os.killpg(proc.pid, 15)
            except OSError:
                pass
            _, alive = psutil.wait_procs(tree, timeout=15)
            for p in alive:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            _, alive = psutil.wait_procs(alive, timeout=5)
            left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if proc is not None and proc.poll() is None:
            proc.wait(timeout=5)
        if not left and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return left

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
