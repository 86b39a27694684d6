"""The process that owns one Ray node: ``python -m raydist.engine.node.supervisor``.

Why a separate process: a Spark task's Python worker can die by SIGKILL (task
killed, executor lost), and then nothing in it runs. The supervisor is started
in its own session, becomes a *child subreaper* (so every process Ray spawns,
even after its parent exits, stays its descendant), runs ``ray start --block``,
and tears the whole tree down when any of these happens:

* a watched process dies (the Spark task's Python worker, the executor JVM, or
  the driver for the head node);
* the driver says ``stop``, or the link to the driver stays broken past the
  reconnect grace window (see :mod:`raydist.engine.link.wire`);
* it receives SIGTERM/SIGINT;
* ``ray start`` exits on its own (the node crashed).

If the supervisor itself is SIGKILLed, ``ray start`` dies with it
(``PR_SET_PDEATHSIG``; Ray's processes fate-share with ``ray start``), and a
forked sentinel kills whatever is left in the supervisor's session and removes
the node's temp dir (:func:`start_sentinel`).

It reports over the link (see :mod:`raydist.engine.link.channel`) and exits only
when every descendant is gone. Configuration arrives as one JSON object on
stdin, so no secret ever appears on a command line.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
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

from raydist.engine.link import messages
from raydist.engine.link.keys import say_hello
from raydist.engine.link.nodelink import LOG_TAIL_LINES
from raydist.engine.link.wire import (
    HANDSHAKE_S,
    HEAD_FROM_LINK,
    HEARTBEAT_S,
    IDLE_S,
    MAX_LINE,
    RECONNECT_GRACE_S,
    LineReader,
    LinkBroken,
    LinkRefused,
    enable_keepalive,
    encode,
)
from raydist.engine.node import dashboard
from raydist.engine.node.reaper import (
    KILL_GRACE_S,
    become_subreaper,
    core_died,
    die_with_parent,
    kill_descendants,
    start_sentinel,
    watched_alive,
)
from raydist.engine.nodelogs import NODE_BYTES, last_words, read_logs
from raydist.engine.ports import free_port, wait_for_port
from raydist.paths import open_private_log

_POLL_S = 0.2
#: Per-node ports raydist picks so that nodes sharing a host never race for Ray's defaults.
NODE_PORT_OPTIONS = (
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
)


_NODE_ID_FILE = re.compile(r"_port_([0-9a-f]{56})$")


def ray_node_id(temp_dir: str) -> str:
    """The Ray node id of the node running under ``temp_dir``, or "". Ray
    names the port files of its session after the node
    (``<temp>/session_latest/*_port_<node id>``)."""
    if not temp_dir:
        return ""
    for path in glob.glob(os.path.join(temp_dir, "session_latest", "*_port_*")):
        if match := _NODE_ID_FILE.search(path):
            return match.group(1)
    return ""


class Supervisor:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.stop = threading.Event()
        self.reason = ""
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.sock: socket.socket | None = None
        #: The current connection's sealed frames (linkauth.Frames), and those
        #: of connections opened but not attached yet.
        self.frames: Any = None
        self._frames_of: dict[socket.socket, Any] = {}
        self.lock = threading.Lock()
        self._dashboard_lock = threading.Lock()
        self.proc: subprocess.Popen[str] | None = None
        self.pump: threading.Thread | None = None
        self.started = False  # whether the node's `ray start` was told to go
        self.log_file: Any = None
        self.argv_used: list[str] = []
        #: The head's GCS address, for a worker whose head runs in a Spark task
        #: (the driver says it over the link once the head is up).
        self.head_address = ""
        self.head_known = threading.Event()
        self.incarnation = secrets.token_hex(8)
        #: What was said while the link was broken, sent when it resumes.
        self.unsent: deque[dict[str, Any]] = deque(maxlen=2000)
        self.grace_s = float(cfg.get("grace_s", RECONNECT_GRACE_S))
        #: How long Ray's processes get after SIGTERM at the end (0: the
        #: driver tears the whole cluster down, so no graceful stop is owed).
        self.kill_grace_s = KILL_GRACE_S
        self.idle_s = float(cfg.get("idle_s", IDLE_S))
        self.heartbeat_s = float(cfg.get("heartbeat_s", HEARTBEAT_S))

    # link ------------------------------------------------------------------

    def _open(self, *, resume: bool) -> tuple[socket.socket, LineReader]:
        """A new authenticated connection to the driver (raises OSError or LinkBroken)."""
        host, port = self.cfg["channel"]
        sock = socket.create_connection((host, int(port)), timeout=HANDSHAKE_S)
        try:
            enable_keepalive(sock)
            _, rest, frames = say_hello(sock, self.cfg["key"], self.cfg["node_secret"], host=socket.gethostname(),
                                        pid=os.getpid(), incarnation=self.incarnation, resume=resume)
            sock.settimeout(self.idle_s)  # a send to a silent peer fails too, instead of hanging
            self._frames_of[sock] = frames
            return sock, LineReader(sock, idle_s=self.idle_s, initial=rest, frames=frames)
        except BaseException:
            sock.close()
            raise

    def connect(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                sock, reader = self._open(resume=False)
                break
            except (LinkRefused, ConnectionRefusedError):
                # A wrong key does not get better with retries; and the
                # channel listens from before any plan names it until the
                # cluster is gone, so nothing listening means it is gone
                # (torn down while this node's task started).
                raise
            except (OSError, LinkBroken):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self._attach(sock)
        threading.Thread(target=self._read_link, args=(reader,), daemon=True).start()
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _attach(self, sock: socket.socket) -> None:
        with self.lock:
            self.frames = self._frames_of.pop(sock)
            try:
                while self.unsent:
                    sock.sendall(self.frames.seal(encode(self.unsent[0])))
                    self.unsent.popleft()
            except OSError:
                pass  # the reader notices the broken link
            self.sock = sock

    def emit(self, message: dict[str, Any]) -> None:
        with self.lock:
            if self.sock is None or self.frames is None:
                self.unsent.append(message)
                return
            try:
                self.sock.sendall(self.frames.seal(encode(message)))
            except OSError:
                self.unsent.append(message)

    def _heartbeat(self) -> None:
        while not self.stop.wait(self.heartbeat_s):
            with self.lock:
                if self.sock is None or self.frames is None:
                    continue
                try:  # sealed and sent under the lock: frames go out in the order they are counted
                    self.sock.sendall(self.frames.seal(encode(messages.ping())))
                except OSError:
                    pass  # the reader notices the broken link

    def _read_link(self, reader: LineReader) -> None:
        while True:
            try:
                while True:
                    msg = reader.read()
                    kind = messages.kind(msg)
                    if kind == "stop":
                        if msg.get("hard"):
                            self.kill_grace_s = 0.0
                        self.request_stop("stopped by the driver")
                        return
                    if kind == "logs":
                        threading.Thread(target=self._send_logs, args=(msg,), daemon=True).start()
                    if kind == "dashboard":
                        threading.Thread(target=self._switch_dashboard, args=(msg,), daemon=True).start()
                    if kind == "head" and not self.head_known.is_set():
                        self.head_address = str(msg.get("address", ""))
                        self.head_known.set()
            except LinkBroken as exc:
                broke = str(exc)
            if self.stop.is_set():
                return
            with self.lock:
                old, self.sock = self.sock, None
            # The old socket stays open while this reconnects: closing it would
            # tell a driver that still hears us that this node is gone.
            resumed = self._reconnect(broke)
            if old is not None:
                old.close()
            if resumed is None:
                self.request_stop(f"lost the link to the driver ({broke})")
                return
            reader = resumed

    def _send_logs(self, msg: dict[str, Any]) -> None:
        """Answer the driver's ``logs`` request with this node's log files."""
        try:
            files = read_logs(str(self.cfg.get("temp_dir") or ""), name=str(msg.get("name") or ""),
                              max_bytes=min(int(msg.get("max_bytes") or NODE_BYTES), 4 * NODE_BYTES),
                              offset=max(0, int(msg.get("offset") or 0)))
        except (TypeError, ValueError):
            files = []
        for message in messages.logs_parts(str(msg.get("req", "")), files):
            self.emit(message)

    def _switch_dashboard(self, msg: dict[str, Any]) -> None:
        """Answer the driver's ``dashboard`` request: Ray's dashboard on this
        head with every module, or (``stop``) back to what it ran before."""
        req = str(msg.get("req", ""))[:32]
        with self._dashboard_lock:  # one switch at a time: two would each replace the other's
            try:
                url = dashboard.switch(full=not msg.get("stop"), temp_dir=str(self.cfg.get("temp_dir") or ""))
                reply = messages.dashboard_answer(req, url=url)
            except (RuntimeError, OSError, psutil.Error) as exc:
                reply = messages.dashboard_answer(req, error=str(exc)[:500] or type(exc).__name__)
        self.emit(reply)

    def _reconnect(self, broke: str) -> LineReader | None:
        """Resume the link within the grace window; None when it cannot be."""
        self._write_log(f"raydist: link to the driver broken ({broke}); reconnecting for {self.grace_s:g} s")
        deadline = time.monotonic() + self.grace_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                sock, reader = self._open(resume=True)
            except (ConnectionRefusedError, LinkRefused):
                return None  # nothing listens, or the driver refused: its channel is gone
            except (OSError, LinkBroken):
                self.stop.wait(1.0)
                continue
            self._attach(sock)
            self.log("raydist: link to the driver resumed")
            return reader
        return None

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()

    # node ------------------------------------------------------------------

    def log(self, line: str) -> None:
        self.tail.append(line)
        self.emit(messages.log(line[:MAX_LINE // 2]))

    def _write_log(self, line: str) -> None:
        """A line for the node's local log only (the link may be down)."""
        if self.log_file is not None:
            try:
                self.log_file.write(line + "\n")
                self.log_file.flush()
            except (OSError, ValueError):
                pass

    def _pump(self, stream: Any) -> None:
        for line in stream:
            line = line.rstrip("\n")
            self._write_log(line)
            self.log(line)
            if "Ray runtime started" in line:
                info = {**self.cfg.get("info", {}), "node_id": ray_node_id(str(self.cfg.get("temp_dir") or ""))}
                self.emit(messages.started(str(self.cfg.get("node_ip", "")), info))
                if float(self.cfg.get("demand_s") or 0) > 0:
                    threading.Thread(target=self._report_demand, daemon=True).start()

    def _report_demand(self) -> None:
        """Run :mod:`raydist.engine.node.demand` beside the head (a child: it goes
        with the node) and forward each reading to the driver."""
        port = next((a.split("=", 1)[1] for a in self.argv_used if a.startswith("--port=")), "")
        gcs = f"{self.cfg.get('node_ip') or '127.0.0.1'}:{port}"
        env = {**os.environ, **self.cfg.get("env", {})}
        proc = subprocess.Popen([sys.executable, "-m", "raydist.engine.node.demand", gcs, str(self.cfg["demand_s"])],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, env=env, preexec_fn=die_with_parent)
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                reading = json.loads(line)
            except ValueError:
                continue
            if isinstance(reading, dict) and not self.stop.is_set():
                self.emit(messages.demand(reading))

    def argv(self) -> list[str]:
        argv = [f"--address={self.head_address}" if a == f"--address={HEAD_FROM_LINK}" else a
                for a in self.cfg["argv"]]
        host = self.cfg.get("node_ip") or "127.0.0.1"
        # Ports the plan named already (the driver picked a head's GCS,
        # client and dashboard ports): Ray refuses one port for two components.
        taken = ports_named(argv)
        for option in NODE_PORT_OPTIONS:
            if not any(a.startswith(f"--{option}") for a in argv):
                argv.append(f"--{option}={free_port(host if host != '0.0.0.0' else '127.0.0.1', taken)}")
        return argv

    def _load_ray(self) -> None:
        """Start the node's ``ray start`` process now, loading Ray's command
        line while the link connects and the head comes up
        (:mod:`raydist.engine.node.raystart`); :meth:`_start_ray` tells it to go."""
        env = dict(os.environ)
        env.update(self.cfg.get("env", {}))
        log_path = self.cfg.get("log_path")
        self.log_file = open_private_log(log_path) if log_path else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raydist.engine.node.raystart"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=self.cfg.get("cwd") or None,
            preexec_fn=die_with_parent,
        )
        self.pump = threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True)
        self.pump.start()

    def _start_ray(self) -> None:
        """Run ``ray start --block`` for this node in the loaded process; its
        output goes to the node's log and over the link."""
        assert self.proc is not None and self.proc.stdin is not None
        self.argv_used = self.argv()
        self.proc.stdin.write(json.dumps(self.argv_used) + "\n")
        self.proc.stdin.close()
        self.started = True

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: self.request_stop("signalled"))
        watch = [(int(p), float(t)) for p, t in self.cfg.get("watch", [])]
        deadline = time.monotonic() + float(self.cfg.get("deadline_s", 180))
        code = 0
        try:
            self._load_ray()
            wait = self.cfg.get("wait_for")
            if not wait:
                # Nothing to wait for (a head): Ray starts while the link
                # connects; what it says meanwhile is sent once it has.
                self._start_ray()
            self.connect()
            if wait == HEAD_FROM_LINK:
                while not self.stop.is_set() and not self.head_known.wait(0.5):
                    if time.monotonic() > deadline:
                        self.log("raydist: the driver did not say where the head is before the start deadline")
                        self.request_stop("head unknown")
                        code = 3
                wait = self.head_address
            if wait:
                host, port = wait.rsplit(":", 1)
                while not self.stop.is_set() and not wait_for_port(host, int(port), time.monotonic() + 1):
                    if time.monotonic() > deadline:
                        self.log(f"raydist: the head at {wait} did not answer before the start deadline")
                        self.request_stop("head unreachable")
                        code = 3
            if not self.stop.is_set() and not self.started:
                self._start_ray()
            if self.started and self.proc is not None and self.pump is not None:
                pump = self.pump
                core: dict[int, tuple[psutil.Process, str]] = {}
                polls = 0
                while not self.stop.wait(_POLL_S):
                    polls += 1
                    if polls % 5 == 0 and (dead := core_died(core)):
                        for line in last_words(self.cfg.get("temp_dir") or "", dead):
                            self.log(f"raydist: {dead}: {line}")  # read before the temp dir goes
                        self.request_stop(f"Ray's {dead} exited")
                        code = 1
                        break
                    if self.proc.poll() is not None:
                        pump.join(timeout=2)
                        code = self.proc.returncode or 1
                        self.request_stop(f"ray start exited with code {self.proc.returncode}")
                        break
                    for pid, created in watch:
                        if not watched_alive(pid, created):
                            self.request_stop(f"watched process {pid} died")
                            break
        except Exception as exc:  # report any failure to the driver, then clean up
            self.log(f"raydist supervisor error: {exc!r}")
            code = 2
        finally:
            kill_descendants(self.kill_grace_s)
            temp_dir = self.cfg.get("temp_dir")
            if temp_dir:
                # The node's Ray session (logs, sockets, spilled objects): on an
                # executor host nothing else would ever remove it.
                shutil.rmtree(temp_dir, ignore_errors=True)
            # The link is left open: it closes when this process ends (main
            # exits at once), so the driver's "closed" means "gone", and a
            # teardown that waits for it leaves no supervisor behind.
            self.emit(messages.stopped(code, self.reason))
        return code


def ports_named(argv: list[str]) -> set[int]:
    """The port numbers a ``ray start`` command line gives (``--...port=N``)."""
    found = set()
    for arg in argv:
        name, _, value = arg.partition("=")
        if name.startswith("--") and name.endswith("port") and value.isdigit():
            found.add(int(value))
    return found


def main() -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    become_subreaper()
    cfg = json.loads(sys.stdin.read())
    sys.stdin.close()
    start_sentinel(str(cfg.get("temp_dir") or ""))
    code = Supervisor(cfg).run()
    sys.stdout.flush()
    os._exit(code)  # no interpreter shutdown to wait on: the link closes as the process ends


if __name__ == "__main__":
    sys.exit(main())
