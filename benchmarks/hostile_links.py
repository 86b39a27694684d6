"""More hostile peers for benchmarks/chaos.py: attackers that hold what a
node holds, or sit on its path, or hold a door open, each against the real
mechanism run here (a NodeChannel as a cluster's driver runs it, a LinkRelay,
a BlockAgent), and a tenant past its quota against the real server.

* **A node with a valid key that sends malformed frames**: a bad MAC, a line
  in clear, a sealed line that is not JSON, JSON nested past Python's stack,
  fields of the wrong type, a line past the length bound. A breach: its
  connection still open afterwards, or another node's link (a neighbour that
  pings all along) or the channel's accepting hurt.
* **An on-path injector**: a TCP proxy between a node and the driver that,
  once the handshake is over, injects a line in clear, replays a frame it
  saw, or changes one. A breach: the driver acts on it (the node's link says
  "stopped"), or the node reads a command the driver never sealed.
* **Slow senders** (slow-loris) to the data agent and the relay: a byte every
  second, never a whole first line. A breach: the connection still held
  past the handshake's deadline plus slack.
* **A node flooding log replies**: answers nobody asked for, answers past
  what was asked, a storm of log lines. A breach: an answer kept past its
  ``max_bytes``, or more log lines kept than the link's tail holds.
* **A tenant past its quota** (``mallory``, ``max_workers = 1``): creates
  bigger than her quota. A breach: anything but RESOURCE_EXHAUSTED naming the key.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable

from raydist.engine.link.channel import LOG_TAIL_LINES, NodeChannel, NodeLink
from raydist.engine.link.keys import NodeKeys, relay_key, say_hello
from raydist.engine.link.relay import LinkRelay
from raydist.engine.link.wire import HANDSHAKE_S, MAX_LINE, encode

__all__ = ["LinkAttackers"]

_THINK_S = 0.05
_AWAY = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}


class _Node:
    """A node's end of a link to a channel, as a supervisor holds it."""

    def __init__(self, address: tuple[str, int], key: str, secret: str) -> None:
        self.sock = socket.create_connection(address, timeout=5)
        _, self.rest, self.frames = say_hello(self.sock, key, secret, host="h", pid=os.getpid(),
                                              incarnation=os.urandom(4).hex(), resume=False)

    def send(self, message: dict) -> None:
        self.sock.sendall(self.frames.seal(encode(message)))

    def closed_within(self, seconds: float) -> bool:
        """Whether the far end closes (or resets) this connection within ``seconds``."""
        self.sock.settimeout(0.2)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if self.sock.recv(65536) == b"":
                    return True
            except TimeoutError:
                continue
            except OSError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


class LinkAttackers:
    """The attackers above, as threads run until ``stop``; they count into
    ``count(kind, breach)`` as benchmarks/hostile.py's do."""

    def __init__(self, count: Callable[[str, str], None], stop: threading.Event, seed: int,
                 tenant_client: Callable[[], object] | None = None) -> None:
        # The channel's refusals are the point: said once here, not once an attempt.
        logging.getLogger("raydist.engine.link.channel").setLevel(logging.ERROR)
        logging.getLogger("raydist.engine.link.relay").setLevel(logging.ERROR)
        self._count = count
        self._stop = stop
        self._rng = random.Random(seed)
        self._tenant_client = tenant_client

    def bodies(self) -> list[Callable[[], None]]:
        found = [self.frames, self.injector, self.slowloris, self.logflood]
        return found + ([self.quota] if self._tenant_client is not None else [])

    # -- a node with a valid key, sending malformed frames --------------------------

    def frames(self) -> None:
        keys = NodeKeys()
        heard: list[tuple[str, str]] = []
        channel = NodeChannel("127.0.0.1", keys, lambda event, link: heard.append((event, link.key)))
        address = (channel.host, channel.port)
        neighbour = _Node(address, "w0", keys.issue("w0"))
        lines = neighbour.sock.makefile("rb")
        n = 0
        try:
            while not self._stop.wait(_THINK_S):
                n += 1
                key = f"w{n}"
                node = _Node(address, key, keys.issue(key))
                kind = self._rng.choice(["bad-mac", "clear", "not-json", "nested", "types", "long"])
                if kind == "bad-mac":
                    node.sock.sendall(b'{"type":"ping"}\t' + b"0" * 32 + b"\n")
                elif kind == "clear":
                    node.sock.sendall(encode({"type": "stopped", "code": 0, "reason": "said in clear"}))
                elif kind == "not-json":
                    node.sock.sendall(node.frames.seal(b"not json at all\n"))
                elif kind == "nested":
                    node.sock.sendall(node.frames.seal(b"[" * 60_000 + b"\n"))
                elif kind == "types":
                    node.send(self._rng.choice([{"type": "started", "info": 1, "node_ip": []},
                                                {"type": "stopped", "code": "x", "log_tail": 1},
                                                {"type": "logs", "req": [], "size": "big"}]))
                else:
                    node.sock.sendall(b"x" * (MAX_LINE + 10))
                if kind == "types":
                    # A sealed frame of the right kind with odd fields may be
                    # taken (as "stopped" with no code) or refused; either way
                    # nothing past this connection is hurt.
                    node.closed_within(0.5)
                elif not node.closed_within(HANDSHAKE_S):
                    self._count("frames", f"a {kind} frame left its connection open")
                node.close()
                # The neighbour's link still answers, and the channel still admits nodes.
                neighbour.send({"type": "ping"})
                neighbour.sock.settimeout(5)
                try:
                    pong = json.loads(neighbour.frames.open(lines.readline().rstrip(b"\n")))
                except (OSError, ValueError) as exc:
                    self._count("frames", f"after a {kind} frame, the neighbour's link broke: {exc!r}"[:200])
                    return
                self._count("frames", "" if pong.get("type") == "pong" else f"the neighbour heard {pong}")
        finally:
            neighbour.close()
            channel.close()

    # -- an on-path injector --------------------------------------------------------

    def injector(self) -> None:
        keys = NodeKeys()
        heard: list[tuple[str, str]] = []
        channel = NodeChannel("127.0.0.1", keys, lambda event, link: heard.append((event, link.key)))
        n = 0
        try:
            while not self._stop.wait(_THINK_S):
                n += 1
                key = f"w{n}"
                proxy = _Proxy((channel.host, channel.port))
                node = _Node(("127.0.0.1", proxy.port), key, keys.issue(key))
                node.send({"type": "ping"})  # one real frame each way for the proxy to see
                node.sock.settimeout(5)
                lines = node.sock.makefile("rb")
                first = lines.readline()
                node.frames.open(first.rstrip(b"\n"))  # the node took the real pong
                way = self._rng.choice(["to-driver-clear", "to-driver-replay", "to-driver-changed",
                                        "to-node-clear", "to-node-replay"])
                if way == "to-driver-clear":
                    proxy.to_driver(encode({"type": "stopped", "code": 0, "reason": "injected"}))
                elif way == "to-driver-replay":
                    proxy.to_driver(proxy.seen_to_driver[-1])
                elif way == "to-driver-changed":
                    frame = bytearray(proxy.seen_to_driver[-1])
                    frame[2] ^= 0x01
                    proxy.to_driver(bytes(frame))
                elif way == "to-node-clear":
                    proxy.to_node(encode({"type": "stop"}))
                else:
                    proxy.to_node(first)
                if way.startswith("to-driver"):
                    if not node.closed_within(HANDSHAKE_S):
                        self._count("injector", f"{way}: the driver kept the connection")
                    elif (("stopped", key) in heard):
                        self._count("injector", f"{way}: the driver acted on an injected stop")
                    else:
                        self._count("injector")
                else:
                    try:
                        opened = node.frames.open(lines.readline().rstrip(b"\n"))
                        self._count("injector", f"{way}: the node opened {opened[:60]!r}")
                    except ValueError:
                        self._count("injector")  # BadFrame: the node drops the connection
                    except OSError:
                        self._count("injector")
                node.close()
                proxy.close()
        finally:
            channel.close()

    # -- slow senders ----------------------------------------------------------------

    def slowloris(self) -> None:
        from raydist.data import _agent

        agent = _agent.BlockAgent()
        agent_port = agent.open("127.0.0.1")
        relay = LinkRelay("127.0.0.1", relay_key(NodeKeys().issue("head")))
        targets = {"agent": (agent_port, _agent._HEADER_S), "relay": (relay.port, HANDSHAKE_S)}
        try:
            while not self._stop.is_set():
                name = self._rng.choice(sorted(targets))
                port, bound = targets[name]
                crowd = []
                for _ in range(4):
                    try:
                        crowd.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                    except OSError:
                        break
                started = time.monotonic()
                held = list(crowd)
                while held and time.monotonic() - started < bound + 3 and not self._stop.is_set():
                    for sock in list(held):
                        try:
                            sock.sendall(b"{")  # a byte a second, never a line
                        except OSError:
                            held.remove(sock)
                    self._stop.wait(1.0)
                if self._stop.is_set():
                    break
                for sock in crowd:
                    self._count("slowloris", f"the {name} held a slow sender past {bound:g} s" if sock in held
                                else "")
                    sock.close()
        finally:
            relay.close()
            if agent._server is not None:
                agent._server.close()

    # -- a node flooding log replies ---------------------------------------------------

    def logflood(self) -> None:
        keys = NodeKeys()
        links: dict[str, NodeLink] = {}

        def heard(event: str, link: NodeLink) -> None:
            links[link.key] = link

        channel = NodeChannel("127.0.0.1", keys, heard)
        node = _Node((channel.host, channel.port), "w0", keys.issue("w0"))
        reader = node.sock.makefile("rb")
        chunk = base64.b64encode(os.urandom(30_000)).decode()
        try:
            deadline = time.monotonic() + 5
            while "w0" not in links and time.monotonic() < deadline:
                time.sleep(0.05)
            link = links["w0"]
            while not self._stop.wait(_THINK_S):
                kind = self._rng.choice(["unasked", "past-max", "lines"])
                if kind == "unasked":
                    for _ in range(20):
                        node.send({"type": "logs", "req": os.urandom(8).hex(), "name": "x.log", "size": 1,
                                   "data": chunk})
                    self._count("logflood", f"{len(link._log_requests)} log requests held"
                                if link._log_requests else "")
                elif kind == "past-max":
                    request = link.ask_logs(max_bytes=4096)
                    node.sock.settimeout(5)
                    asked = json.loads(node.frames.open(reader.readline().rstrip(b"\n")))
                    for _ in range(20):
                        node.send({"type": "logs", "req": asked["req"], "name": "x.log", "size": 1 << 30,
                                   "data": chunk})
                    node.send({"type": "logs", "req": asked["req"], "done": True})
                    try:
                        kept = sum(len(data) for _, _, data in request.wait(5))
                    except TimeoutError:
                        kept = 0  # the answer was cut: nothing handed on
                    self._count("logflood", f"kept {kept} bytes of logs where 4096 were asked" if kept > 4096
                                else "")
                else:
                    for i in range(LOG_TAIL_LINES * 3):
                        node.send({"type": "log", "line": f"line {i}"})
                    time.sleep(0.2)
                    self._count("logflood", f"{len(link.log_tail)} log lines kept"
                                if len(link.log_tail) > LOG_TAIL_LINES else "")
        finally:
            node.close()
            channel.close()

    # -- a tenant past its quota ---------------------------------------------------------

    def quota(self) -> None:
        from raydist.errors import RPCError
        from raydist.spec import ClusterSpec

        assert self._tenant_client is not None
        mallory = self._tenant_client()
        n = 0
        while not self._stop.wait(0.5):
            n += 1
            try:
                mallory.create(ClusterSpec(name=f"big{n}", workers=2, cpus_per_worker=1))  # type: ignore[attr-defined]
                self._count("quota", f"create big{n} past max_workers = 1 was taken")
                mallory.delete(f"big{n}", allow_missing=True)  # type: ignore[attr-defined]
            except RPCError as exc:
                if exc.code in _AWAY:
                    continue
                self._count("quota", "" if exc.code == "RESOURCE_EXHAUSTED" and "max_workers" in exc.details
                            else f"create past quota: {exc.code} {exc.details[:80]}")
        mallory.close()  # type: ignore[attr-defined]


class _Proxy:
    """A TCP proxy between a node and the driver that lets the attacker add lines."""

    def __init__(self, driver: tuple[str, int]) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._driver = driver
        self.seen_to_driver: list[bytes] = []
        self._node: socket.socket | None = None
        self._up: socket.socket | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="hostile-proxy").start()

    def _accept(self) -> None:
        try:
            self._node, _ = self._server.accept()
            self._up = socket.create_connection(self._driver, timeout=5)
        except OSError:
            return
        finally:
            self._ready.set()
        threading.Thread(target=self._pump, args=(self._node, self._up, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self._up, self._node, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_driver: bool) -> None:
        buf = b""
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
                if to_driver:
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    self.seen_to_driver += [line + b"\n" for line in lines]
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def to_driver(self, data: bytes) -> None:
        self._ready.wait(5)
        assert self._up is not None
        self._up.sendall(data)

    def to_node(self, data: bytes) -> None:
        self._ready.wait(5)
        assert self._node is not None
        self._node.sendall(data)

    def close(self) -> None:
        for sock in (self._node, self._up, self._server):
            if sock is not None:
                sock.close()

