"""A real Spark standalone cluster on this machine: one master and N worker
daemons from pip's pyspark, on free ports, optionally each worker in its own
network namespace (a separate "host" with its own address).

Used by the tests and by ``benchmarks/startup.py --master standalone``::

    with StandaloneSpark(workers=2, isolate=True) as sc:
        spark = embedded_session(sc.master_url, sc.driver_conf())
        ...
        sc.kill_worker(0)     # a host's worker daemon dies (SIGKILL)
        sc.start_worker(0)    # and comes back
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

from raydist.engine.ports import free_port, wait_for_port
from raydist.testing.netns import HostNetwork

__all__ = ["StandaloneSpark", "WorkerDaemon", "spark_home"]

log = logging.getLogger(__name__)


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class WorkerDaemon:
    """One Spark worker daemon and the host it lives on."""

    index: int
    host: str
    netns: str | None
    gpus: list[str]
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class StandaloneSpark:
    """Master plus ``workers`` worker daemons of ``cores`` cores and ``memory``
    each. ``gpus_per_worker`` fake GPUs per worker come from
    ``gpu_discovery_script``, which is handed the host's addresses in
    ``RAYDIST_FAKE_GPU_ADDRESSES`` (host i owns ``i*k .. i*k+k-1``, so a
    mapping mistake across hosts shows). ``isolate`` puts each worker in its
    own network namespace, plus ``client_hosts`` namespaces with no daemon,
    for clients "on another machine" (:attr:`client_netns`). ``run_as`` (a
    uid, root only) runs the worker daemons, and so every executor and Ray
    node, as that user: tenants' code then cannot read what the driver's
    user owns."""

    workers: int = 2
    cores: int = 1
    memory: str = "2g"
    gpus_per_worker: int = 0
    gpu_discovery_script: str | None = None
    isolate: bool = False
    client_hosts: int = 0
    start_timeout_s: float = 90.0
    run_as: int | None = None
    master_url: str = ""
    driver_host: str = "127.0.0.1"
    daemons: list[WorkerDaemon] = field(default_factory=list)
    _dir: Path | None = None
    _master: subprocess.Popen[bytes] | None = None
    _master_ui: int = 0
    _net: HostNetwork | None = None

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> StandaloneSpark:
        self._dir = Path(tempfile.mkdtemp(prefix="raydist-standalone-"))
        if self.run_as is not None:
            self._dir.chmod(0o711)  # the workers' user reaches its own work dir, lists nothing
        try:
            if self.isolate:
                self._net = HostNetwork(self.workers + self.client_hosts).create()
                self.driver_host = self._net.gateway
            port, self._master_ui = free_port(self.driver_host), free_port(self.driver_host)
            self.master_url = f"spark://{self.driver_host}:{port}"
            self._master = self._spawn(
                ["org.apache.spark.deploy.master.Master", "--host", self.driver_host, "--port", str(port),
                 "--webui-port", str(self._master_ui)],
                netns=None, log_name="master.log", env={},
            )
            if not wait_for_port(self.driver_host, port, time.monotonic() + self.start_timeout_s):
                raise RuntimeError(f"Spark master did not listen: {self._tail('master.log')}")
            for i in range(self.workers):
                host = self._net.addresses[i] if self._net else "127.0.0.1"
                netns = self._net.names[i] if self._net else None
                gpus = [str(i * self.gpus_per_worker + g) for g in range(self.gpus_per_worker)]
                self.daemons.append(WorkerDaemon(i, host, netns, gpus))
                self.start_worker(i, wait=False)
            self.wait_workers(self.workers)
        except Exception:
            self.stop()
            raise
        return self

    @property
    def client_netns(self) -> list[str]:
        """The network namespaces of the client hosts (``isolate`` only):
        run a command on one with ``ip netns exec NAME ...``."""
        return self._net.names[self.workers:] if self._net else []

    @property
    def client_host(self) -> str:
        """The address of the first client host (``isolate`` and ``client_hosts`` only)."""
        return self._net.addresses[self.workers] if self._net and self.client_hosts else ""

    def start_worker(self, i: int, wait: bool = True) -> None:
        """Start (or start again) worker ``i``'s daemon on its host."""
        assert self._dir is not None
        d = self.daemons[i]
        env = {}
        opts = []
        if self.gpus_per_worker:
            if not self.gpu_discovery_script:
                raise ValueError("gpus_per_worker needs gpu_discovery_script")
            opts += [f"-Dspark.worker.resource.gpu.amount={self.gpus_per_worker}",
                     f"-Dspark.worker.resource.gpu.discoveryScript={self.gpu_discovery_script}"]
            env["RAYDIST_FAKE_GPU_ADDRESSES"] = ",".join(d.gpus)
        env["SPARK_WORKER_OPTS"] = " ".join(opts)
        work = self._dir / f"worker-{i}"
        work.mkdir(exist_ok=True)
        env["SPARK_LOCAL_DIRS"] = str(work)
        if self.run_as is not None:
            os.chown(work, self.run_as, self.run_as)
            env["HOME"] = str(work)
        before = self.alive_workers()
        d.log_path = self._dir / f"worker-{i}.log"
        d.proc = self._spawn(
            ["org.apache.spark.deploy.worker.Worker", "--host", d.host, "--port", "0",
             "--webui-port", str(free_port()), "--cores", str(self.cores), "--memory", self.memory,
             "--work-dir", str(work), self.master_url],
            netns=d.netns, log_name=d.log_path.name, env=env, uid=self.run_as,
        )
        if wait:
            self.wait_workers(before + 1)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i``'s daemon, as a crashed host would lose it; its
        executors exit on their own when they lose the worker."""
        d = self.daemons[i]
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(timeout=30)

    def stop(self) -> list[psutil.Process]:
        """Stop every daemon (and what they started), then the namespaces.
        Returns the processes of the daemons' trees still alive 10 s later
        (empty when everything ended); only then is the temporary directory
        of logs and work dirs removed."""
        procs = [d.proc for d in self.daemons] + [self._master]
        tree: list[psutil.Process] = []
        for proc in procs:
            if proc is not None and proc.poll() is None:
                try:
                    root = psutil.Process(proc.pid)
                    tree += [root, *root.children(recursive=True)]
                except psutil.Error:
                    pass
        for proc in procs:
            _stop_group(proc)
        self.daemons.clear()
        self._master = None
        _, alive = psutil.wait_procs(tree, timeout=10)
        if self._net is not None:
            self._net.remove()
            self._net = None
        left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left and self._dir is not None:
            # Logs and work dirs are kept only when something went wrong.
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return left

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what a driver needs -------------------------------------------------

    def driver_conf(self, apps: int = 1) -> dict[str, str]:
        """Spark settings for a driver on this cluster: the driver's address
        (reachable from every host), one executor per worker sized to leave
        room for ``apps`` applications at once, and the GPU request."""
        cores = max(1, self.cores // apps)
        conf = {
            "spark.driver.host": self.driver_host,
            "spark.driver.bindAddress": self.driver_host,
            "spark.executor.cores": str(cores),
            "spark.cores.max": str(cores * self.workers),
            "spark.executor.memory": "1g",
            "spark.ui.enabled": "false",
        }
        if self.gpus_per_worker:
            conf["spark.executor.resource.gpu.amount"] = str(max(1, self.gpus_per_worker // apps))
        return conf

    # -- state ---------------------------------------------------------------

    def alive_workers(self) -> int:
        """Workers the master counts as ALIVE."""
        try:
            with urllib.request.urlopen(f"http://{self.driver_host}:{self._master_ui}/json/", timeout=2) as r:
                state = json.load(r)
        except (OSError, ValueError):
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def wait_workers(self, count: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while self.alive_workers() < count:
            for d in self.daemons:
                exited = d.proc is not None and d.proc.poll() is not None
                if exited and d.log_path is not None and d.proc.returncode not in (-signal.SIGKILL, -signal.SIGTERM):
                    raise RuntimeError(f"Spark worker {d.index} exited: {self._tail(d.log_path.name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.alive_workers()} of {count} Spark workers registered; "
                                   f"master log: {self._tail('master.log')}")
            time.sleep(0.2)

    # -- helpers -------------------------------------------------------------

    def _spawn(self, args: list[str], *, netns: str | None, log_name: str,
               env: dict[str, str], uid: int | None = None) -> subprocess.Popen[bytes]:
        assert self._dir is not None
        home = spark_home()
        full_env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOG_DIR": str(self._dir), **env}
        full_env.pop("SPARK_LOCAL_IP", None)
        argv = [str(home / "bin" / "spark-class"), *args]
        if uid is not None:
            argv = _as_user(uid, argv)
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        out = open(self._dir / log_name, "ab")  # noqa: SIM115 - owned by the child
        try:
            return subprocess.Popen(argv, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            out.close()

    def _tail(self, name: str, lines: int = 30) -> str:
        assert self._dir is not None
        try:
            return "\n".join((self._dir / name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _as_user(uid: int, argv: list[str]) -> list[str]:
    """``argv`` run as ``uid``. When the Python install sits under a directory
    that user cannot enter (pyenv under a 0700 ``/root``), the command gets a
    mount namespace of its own in which that directory is an empty tmpfs
    showing only the Python install: the user reaches the interpreter and
    still sees nothing else of the directory."""
    script = []
    for blocked, needed in _blocked_paths(uid, Path(sys.base_prefix).resolve()):
        script += [
            'stage=$(mktemp -d)', f'mount --bind "{needed}" "$stage"', f'mount -t tmpfs -o mode=755 tmpfs "{blocked}"',
            f'mkdir -p "{needed}"', f'mount --move "$stage" "{needed}"',
        ]
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    if not script:
        return [*setpriv, *argv]
    script.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-ec", "; ".join(script), "sh", *setpriv, *argv]


def _blocked_paths(uid: int, target: Path) -> list[tuple[Path, Path]]:
    """The outermost directory on the way to ``target`` that ``uid`` cannot
    enter, with its child on that way; empty when every one lets it pass."""
    for parent in reversed(target.parents):
        st = parent.stat()
        if parent != Path("/") and st.st_uid != uid and not st.st_mode & 0o001:
            return [(parent, parent / target.relative_to(parent).parts[0])]
    return []


def _stop_group(proc: subprocess.Popen[bytes] | None, grace_s: float = 10.0) -> None:
    """SIGTERM a daemon's process group, then SIGKILL what is left of it."""
    if proc is None:
        return
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The daemon is gone; its executors may still be exiting.
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.1)
        if not _group_alive(pgid):
            break


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
