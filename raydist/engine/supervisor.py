"""The process that owns one Ray node: ``python -m raydist.engine.supervisor``.

Why a separate process: a Spark task's Python worker can die by SIGKILL (task
killed, executor lost), and then nothing in it runs. The supervisor is started
in its own session, becomes a *child subreaper* (so every process Ray spawns,
even after its parent exits, stays its descendant), runs ``ray start --block``,
and tears the whole tree down when any of these happens:

* a watched process dies (the Spark task's Python worker, the executor JVM, or
  the driver for the head node);
* its link to the driver closes or the driver says ``stop``;
* it receives SIGTERM/SIGINT;
* ``ray start`` exits on its own (the node crashed).

It reports over the link (see :mod:`raydist.engine.channel`) and exits only
when every descendant is gone. Configuration arrives as one JSON object on
stdin, so no secret ever appears on a command line.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

import psutil

from raydist.engine.channel import LOG_TAIL_LINES, enable_keepalive, send
from raydist.engine.ports import free_port, wait_for_port

_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.2
_GRACE_S = 1.5
#: Per-node ports raydist picks so that nodes sharing a host never race for Ray's defaults.
NODE_PORT_OPTIONS = (
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
)


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: children may escape on parent death
        pass


def _alive(pid: int, create_time: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - create_time) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_descendants(grace_s: float = _GRACE_S) -> int:
    """SIGTERM every descendant, SIGKILL what is left after ``grace_s``, reap
    them all; repeat for anything that appeared meanwhile. Returns how many
    processes were ended."""
    me = psutil.Process()
    ended = 0
    for _ in range(5):
        procs = me.children(recursive=True)
        if not procs:
            break
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        ended += len(procs)
        grace_s = 0.5
    # Reap any zombie children left behind (we are their subreaper).
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return ended


class Supervisor:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.stop = threading.Event()
        self.reason = ""
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[str] | None = None

    # link ------------------------------------------------------------------

    def connect(self) -> None:
        host, port = self.cfg["channel"]
        deadline = time.monotonic() + 30
        while True:
            try:
                sock = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        sock.settimeout(None)
        enable_keepalive(sock)
        self.sock = sock
        self.emit(
            {
                "type": "hello",
                "secret": self.cfg["secret"],
                "key": self.cfg["key"],
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
        )
        threading.Thread(target=self._read_link, daemon=True).start()

    def emit(self, message: dict[str, Any]) -> None:
        if self.sock is not None:
            send(self.sock, self.lock, message)

    def _read_link(self) -> None:
        assert self.sock is not None
        reader = self.sock.makefile("r", encoding="utf-8", errors="replace")
        try:
            for line in reader:
                try:
                    if json.loads(line).get("cmd") == "stop":
                        self.request_stop("stopped by the driver")
                        return
                except ValueError:
                    continue
        except OSError:
            pass
        self.request_stop("lost the link to the driver")

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()

    # node ------------------------------------------------------------------

    def log(self, line: str) -> None:
        self.tail.append(line)
        self.emit({"type": "log", "line": line})

    def _pump(self, stream: Any, log_file: Any) -> None:
        for line in stream:
            line = line.rstrip("\n")
            if log_file is not None:
                log_file.write(line + "\n")
                log_file.flush()
            self.log(line)
            if "Ray runtime started" in line:
                self.emit({"type": "started", "node_ip": self.cfg.get("node_ip", ""), "info": self.cfg.get("info", {})})

    def argv(self) -> list[str]:
        argv = list(self.cfg["argv"])
        host = self.cfg.get("node_ip") or "127.0.0.1"
        taken: set[int] = set()
        for option in NODE_PORT_OPTIONS:
            if not any(a.startswith(f"--{option}") for a in argv):
                argv.append(f"--{option}={free_port(host if host != '0.0.0.0' else '127.0.0.1', taken)}")
        return argv

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: self.request_stop("signalled"))
        watch = [(int(p), float(t)) for p, t in self.cfg.get("watch", [])]
        deadline = time.monotonic() + float(self.cfg.get("deadline_s", 180))
        code = 0
        try:
            self.connect()
            wait = self.cfg.get("wait_for")
            if wait:
                host, port = wait.rsplit(":", 1)
                while not self.stop.is_set() and not wait_for_port(host, int(port), time.monotonic() + 1):
                    if time.monotonic() > deadline:
                        self.log(f"raydist: the head at {wait} did not answer before the start deadline")
                        self.request_stop("head unreachable")
                        code = 3
            if not self.stop.is_set():
                env = dict(os.environ)
                env.update(self.cfg.get("env", {}))
                log_path = self.cfg.get("log_path")
                log_file = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115
                self.proc = subprocess.Popen(
                    self.argv(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                    cwd=self.cfg.get("cwd") or None,
                )
                pump = threading.Thread(target=self._pump, args=(self.proc.stdout, log_file), daemon=True)
                pump.start()
                while not self.stop.wait(_POLL_S):
                    if self.proc.poll() is not None:
                        pump.join(timeout=2)
                        code = self.proc.returncode or 1
                        self.request_stop(f"ray start exited with code {self.proc.returncode}")
                        break
                    for pid, created in watch:
                        if not _alive(pid, created):
                            self.request_stop(f"watched process {pid} died")
                            break
        except Exception as exc:  # report any failure to the driver, then clean up
            self.log(f"raydist supervisor error: {exc!r}")
            code = 2
        finally:
            kill_descendants()
            temp_dir = self.cfg.get("temp_dir")
            if temp_dir:
                # The node's Ray session (logs, sockets, spilled objects): on an
                # executor host nothing else would ever remove it.
                shutil.rmtree(temp_dir, ignore_errors=True)
            self.emit({"type": "stopped", "code": code, "reason": self.reason, "log_tail": []})
            if self.sock is not None:
                try:
                    self.sock.close()
                except OSError:
                    pass
        return code


def main() -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    _become_subreaper()
    cfg = json.loads(sys.stdin.read())
    sys.stdin.close()
    return Supervisor(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
