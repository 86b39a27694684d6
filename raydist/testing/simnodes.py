"""Simulated nodes for the scale benchmark: many per process, no Ray behind them.

``python -m raydist.testing.simnodes`` prints the port it takes orders on and
runs nodes as :class:`raydist.testing.simspark.SimSide` asks (one JSON line an
order: ``start``, ``cancel``); it answers ``ended`` when a node's "Spark job"
ends. Each node speaks the real node link to the driver's channel, as a
supervisor does: the authenticated hello (:func:`raydist.engine.link.keys.say_hello`),
``started`` after a Ray-start-like delay, a ``ping`` every
:data:`raydist.engine.link.wire.HEARTBEAT_S`, log requests answered with a small
log, ``stop`` answered with ``stopped`` before it goes. A cancelled node
drops its link without a word, as a killed task's supervisor does. Every node
dials from an address of its own on 127.0.0.0/8 (a host of its own, as far
as the driver's per-source limits go).

What is simulated: Spark's scheduling (a job starts its task at once) and
Ray (no process starts). What is real: the driver's whole engine, its
channel and its link protocol.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import selectors
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from raydist.engine.link import messages
from raydist.engine.link.keys import say_hello
from raydist.engine.link.wire import HEARTBEAT_S, Lines, LinkBroken, encode

log = logging.getLogger("raydist.simnodes")

#: How long a simulated `ray start` takes (seconds, uniform).
START_S = (0.5, 1.5)
_LOG = b"simulated raylet log line\n" * 400


def source_address(index: int) -> str:
    """A loopback address of node ``index``'s own."""
    return f"127.{1 + index // 62_500 % 200}.{index // 250 % 250}.{index % 250 + 1}"


@dataclass
class _Node:
    job: str
    key: str
    head: bool
    group: str
    tag: str
    index: int
    sock: socket.socket | None = None
    frames: Any = None  # the link's sealed frames (engine.linkauth.Frames)
    lines: Lines = field(default_factory=Lines)
    started_at: float = 0.0
    started: bool = False
    next_ping: float = 0.0
    done: bool = False


class Simulator:
    """The nodes of one simulator process, on one selector thread (the
    handshakes, which block, on a small pool)."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.nodes: dict[str, _Node] = {}
        self.ready: list[tuple[_Node, socket.socket, bytes, Any]] = []  # handshakes done, to register
        self.pool = ThreadPoolExecutor(16)
        self.count = 0
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.orders = Lines()

    def run(self) -> None:
        self.sel.register(self.control, selectors.EVENT_READ, "control")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in self.sel.select(0.2):
                if key.data == "control":
                    if not self._control():
                        return
                elif key.data == "wake":
                    try:
                        self.wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                else:
                    self._read(key.data)
            with self.lock:
                ready, self.ready = self.ready, []
            for node, sock, rest, frames in ready:
                if node.done:
                    sock.close()
                    continue
                sock.setblocking(False)
                node.sock = sock
                node.frames = frames
                node.lines.feed(rest)
                node.started_at = time.monotonic() + random.uniform(*START_S)
                node.next_ping = time.monotonic() + HEARTBEAT_S
                self.sel.register(sock, selectors.EVENT_READ, node)
            now = time.monotonic()
            for node in list(self.nodes.values()):
                if node.sock is None or node.done:
                    continue
                if not node.started and now >= node.started_at:
                    node.started = True
                    info: dict[str, Any] = {"cpus": 1, "gpus": 0, "gpu_ids": [], "node_id": secrets.token_hex(28)}
                    if node.head:
                        info["ports"] = {"gcs": 6379, "client": 10001, "dashboard": 8265}
                    self._send(node, messages.started(source_address(node.index), info))
                if now >= node.next_ping:
                    node.next_ping = now + HEARTBEAT_S
                    self._send(node, messages.ping())

    # orders -----------------------------------------------------------------

    def _control(self) -> bool:
        try:
            chunk = self.control.recv(65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False  # the driver went: so do its nodes
        self.orders.feed(chunk)
        while (line := self.orders.next()) is not None:
            order = json.loads(line)
            if order["op"] == "start":
                node = _Node(order["job"], order["key"], bool(order["head"]), order["group"], order["tag"],
                             self.count)
                self.count += 1
                self.nodes[node.job] = node
                self.pool.submit(self._hello, node, tuple(order["channel"]), order["node_secret"])
            elif order["op"] == "cancel":
                for node in list(self.nodes.values()):
                    if (order.get("group") and node.group == order["group"]) or (
                            order.get("tag") and node.tag == order["tag"]):
                        self._end(node, "Job cancelled: the task was killed")
        return True

    def _hello(self, node: _Node, channel: tuple[str, int], secret: str) -> None:
        deadline = time.monotonic() + 60
        while not node.done and time.monotonic() < deadline:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((source_address(node.index), 0))
                sock.settimeout(10)
                sock.connect(channel)
                _, rest, frames = say_hello(sock, node.key, secret, host=f"sim-{node.index}", pid=os.getpid(),
                                            incarnation=secrets.token_hex(8))
            except ConnectionRefusedError:
                sock.close()
                break  # nothing listens: the cluster is gone
            except (OSError, LinkBroken):
                sock.close()
                time.sleep(0.2)  # the channel was full of hellos: try again, as a supervisor does
                continue
            with self.lock:
                self.ready.append((node, sock, rest, frames))
            self.wake_w.send(b"x")
            return
        self._tell({"op": "ended", "job": node.job, "error": "the node could not link to the driver"})
        node.done = True

    # links ------------------------------------------------------------------

    def _read(self, node: _Node) -> None:
        assert node.sock is not None
        try:
            chunk = node.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._end(node, "the driver closed the node's link")
            return
        node.lines.feed(chunk)
        while (line := node.lines.next()) is not None:
            msg = json.loads(node.frames.open(line))
            if messages.kind(msg) == "stop":
                self._send(node, messages.stopped(0, "stopped by the driver"))
                self._end(node, "")
                return
            if messages.kind(msg) == "logs":
                files = [("raylet.out", len(_LOG), _LOG[-int(msg.get("max_bytes") or len(_LOG)):])]
                for each in messages.logs_parts(str(msg.get("req", "")), files):
                    self._send(node, each)

    def _send(self, node: _Node, msg: dict[str, Any]) -> None:
        if node.sock is None:
            return
        try:
            node.sock.setblocking(True)
            node.sock.sendall(node.frames.seal(encode(msg)))
            node.sock.setblocking(False)
        except OSError:
            pass

    def _end(self, node: _Node, error: str) -> None:
        if node.done:
            return
        node.done = True
        if node.sock is not None:
            try:
                self.sel.unregister(node.sock)
            except (KeyError, ValueError):
                pass
            node.sock.close()
        self.nodes.pop(node.job, None)
        self._tell({"op": "ended", "job": node.job, "error": error})

    def _tell(self, msg: dict[str, Any]) -> None:
        with self.lock:  # read only when the selector says so: blocking sends are safe
            try:
                self.control.sendall((json.dumps(msg) + "\n").encode())
            except OSError:
                pass


def main() -> int:
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    control, _ = server.accept()
    server.close()
    Simulator(control).run()
    sys.stdout.flush()
    os._exit(0)  # the driver went: every node with it, at once (its sockets close with the process)


if __name__ == "__main__":
    sys.exit(main())
