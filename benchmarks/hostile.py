"""Hostile peers for benchmarks/chaos.py: attackers in each position the
architecture names, run beside the faults, each attempt judged by what the
attacker got.

* **Another tenant** (``mallory``, a valid token of her own) calls every
  by-name RPC on the victim tenant's clusters, by their names and by their
  full names, lists, and counts; a stranger with a made-up token calls too.
  A breach: any answer but a refusal, a refusal that names the victim, or a
  list or count that shows a cluster not hers.
* **A stranger on the network** at the control plane's node-link ports (every
  port the server listens on but its gRPC one): hellos with forged proofs for
  ``head`` and ``w0``, with keys no cluster issues (``../../x``), and floods of
  connections that say nothing. A breach: a ``welcome``, a challenge for a key
  that can never be issued, or a silent connection still held past the
  handshake bound.
* **An eavesdropper** replays a handshake it recorded, against a link run
  here as a cluster's driver runs it (one real handshake is recorded first).
  A breach: a ``welcome``.
* **A sender to the data agent** (a real :class:`BlockAgent` here, expecting
  one job): parts out of any plan, oversize parts, the wrong job secret, and
  crowds of silent connections. A breach: a part stored.

* The attackers of :mod:`benchmarks.hostile_links`: a node with a valid key
  sending malformed frames, an on-path injector, slow senders to the data
  agent and the relay, a node flooding log replies, a tenant past its quota.

Every attempt that reaches its target counts toward ``hostile``; an answer
of UNAVAILABLE (the server is being restarted by a fault) does not.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable

import psutil

from raydist.control.client import Client
from raydist.engine.link.channel import NodeChannel, NodeLink
from raydist.engine.link.keys import NodeKeys, say_hello
from raydist.engine.link.wire import HANDSHAKE_S, encode
from raydist.errors import RPCError

#: Codes that mean "the server is not there now" (a restart), not an answer.
_AWAY = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
_FLOOD = 20
#: Each attacker's pause between attempts: together a few thousand in a
#: minute, leaving this 2-core machine room for the faults and the churn.
_THINK_S = 0.05


class Hostile:
    """Runs the attackers (threads) until ``stop``; ``attempts`` and
    ``breaches`` say how it went."""

    def __init__(self, address: str, attacker_token: str, victim: str, victim_names: Callable[[], list[str]],
                 server_pid: Callable[[], int | None], stop: threading.Event, seed: int) -> None:
        self.address, self.victim = address, victim
        self._token = attacker_token
        self._names = victim_names
        self._server_pid = server_pid
        self._stop = stop
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.attempts: dict[str, int] = {}
        self.breaches: list[str] = []
        self.failures: list[str] = []  # an attacker's own errors (not breaches), to read
        self._ports: tuple[float, list[tuple[str, int]]] = (0.0, [])

    def threads(self) -> list[threading.Thread]:
        from benchmarks.hostile_links import LinkAttackers

        links = LinkAttackers(self._count, self._stop, self._rng.randrange(1 << 30),
                              lambda: Client(self.address, token=self._token, timeout=10, retries=0))
        bodies = (self.tenant, self.link, self.flood, self.replay, self.agent, *links.bodies())
        return [threading.Thread(target=self._run, args=(body,), daemon=True, name=f"hostile-{body.__name__}")
                for body in bodies]

    def _run(self, body: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                body()
            except Exception as exc:  # noqa: BLE001 - an attacker's own bug: said, and it goes on
                with self._lock:
                    self.failures.append(f"{body.__name__}: {exc!r}"[:300])
                print(f"  attacker {body.__name__} failed: {exc!r}"[:300], flush=True)
                self._stop.wait(0.5)

    def _count(self, kind: str, breach: str = "") -> None:
        with self._lock:
            self.attempts[kind] = self.attempts.get(kind, 0) + 1
            if breach:
                self.breaches.append(f"{kind}: {breach}"[:300])
                print(f"  BREACH {self.breaches[-1]}", flush=True)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.attempts.values())

    # -- another tenant -------------------------------------------------------

    def tenant(self) -> None:
        mallory = Client(self.address, token=self._token, timeout=10, retries=0)
        stranger = Client(self.address, token="a-made-up-token-" + os.urandom(8).hex(), timeout=10, retries=0)
        calls: dict[str, Callable[[str], object]] = {
            "get": mallory.get,
            "credentials": mallory.credentials,
            "logs": lambda n: mallory.node_logs(n, "0"),
            "delete": mallory.delete,
            "resize": lambda n: mallory.update(n, workers=2),
            "watch": lambda n: next(iter(mallory.watch(n, timeout=2))),
        }
        while not self._stop.wait(_THINK_S):
            names = self._names() or ["c0-0"]
            name = self._rng.choice(names)
            if self._rng.random() < 0.3:
                name = f"{name}.{self.victim}"  # the victim's cluster by the name an admin sees
            what = self._rng.choice([*calls, "list", "count", "stranger"])
            try:
                if what == "list":
                    rows = mallory.list()
                    self._count("tenant", f"list shows {[r.spec.name for r in rows]}" if rows else "")
                elif what == "count":
                    seen = mallory.server_info().clusters
                    self._count("tenant", f"server_info counts {seen} clusters" if seen else "")
                elif what == "stranger":
                    stranger.get(name)
                    self._count("stranger", f"get {name} answered a made-up token")
                else:
                    calls[what](name)
                    self._count("tenant", f"{what} {name} answered")
            except RPCError as exc:
                if exc.code in _AWAY:
                    continue
                wanted = {"UNAUTHENTICATED"} if what == "stranger" else {"NOT_FOUND", "INVALID_ARGUMENT"}
                if exc.code not in wanted:
                    self._count(what if what == "stranger" else "tenant", f"{what} {name}: {exc.code}")
                elif self.victim in exc.details.replace(name, ""):  # her own words echoed are no news
                    self._count("tenant", f"{what} {name}: the refusal names {self.victim}")
                else:
                    self._count("stranger" if what == "stranger" else "tenant")
            except StopIteration:
                self._count("tenant", f"watch {name} ended without a refusal")
            except Exception:  # noqa: BLE001 - a connection cut by a server restart
                continue
        mallory.close()
        stranger.close()

    # -- a stranger at the node-link ports -------------------------------------

    def _link_ports(self) -> list[tuple[str, int]]:
        """The node-link ports of the server's clusters now: where it listens
        and its supervisors are connected (its other listeners, py4j's say,
        are not the link). Read at most every 2 s (a walk of every socket on the host)."""
        with self._lock:
            at, ports = self._ports
            if time.monotonic() - at < 2.0:
                return ports
        found: set[tuple[str, int]] = set()
        pid = self._server_pid()
        try:
            server = psutil.Process(pid) if pid is not None else None
            listening = {c.laddr.port: c.laddr.ip for c in (server.net_connections(kind="tcp") if server else [])
                         if c.status == psutil.CONN_LISTEN}
            supervisors = {p.pid for p in (server.children(recursive=True) if server else [])
                           if "raydist.engine.node.supervisor" in " ".join(_argv(p))}
            for conn in psutil.net_connections(kind="tcp") if supervisors else []:
                if conn.pid in supervisors and conn.raddr and conn.raddr.port in listening:
                    found.add((listening[conn.raddr.port], conn.raddr.port))
        except psutil.Error:
            pass
        with self._lock:
            self._ports = (time.monotonic(), sorted(found))
        return sorted(found)

    def link(self) -> None:
        while not self._stop.wait(_THINK_S):
            ports = self._link_ports()
            if not ports:
                self._stop.wait(0.5)
                continue
            host, port = self._rng.choice(ports)
            key = self._rng.choice(["head", "w0", "w1", "../../x", "w0/../../x"])
            hello = {"type": "hello", "key": key, "nonce": os.urandom(16).hex(), "host": "h", "pid": 1,
                     "incarnation": "i", "resume": False}
            try:
                with socket.create_connection((host, port), timeout=5) as sock:
                    sock.sendall(encode(hello))
                    first = _line(sock)
                    if first.get("type") == "challenge":
                        if "/" in key:
                            self._count("link", f"a challenge for key {key!r}")
                            continue
                        sock.sendall(encode({"type": "proof", "proof": os.urandom(32).hex()}))
                        first = _line(sock)
                    self._count("link", f"{key}: welcomed on a forged proof" if first.get("type") == "welcome"
                                else "")
            except ConnectionRefusedError:
                continue  # the cluster went meanwhile: nothing to attack
            except OSError:
                self._count("link")  # closed on it (this host's share of the handshake slots is taken)

    def flood(self) -> None:
        while not self._stop.wait(1.0):
            ports = self._link_ports()
            if not ports:
                continue
            host, port = self._rng.choice(ports)
            crowd = []
            for _ in range(_FLOOD):
                try:
                    crowd.append(socket.create_connection((host, port), timeout=5))
                except OSError:
                    break
            self._stop.wait(HANDSHAKE_S + 2)
            for sock in crowd:
                sock.settimeout(0.5)
                try:
                    held = sock.recv(1) != b""
                except TimeoutError:
                    held = True
                except OSError:
                    held = False  # reset: dropped
                self._count("flood", f"a silent connection to {host}:{port} held past {HANDSHAKE_S:g} s"
                            if held else "")
                sock.close()

    # -- an eavesdropper --------------------------------------------------------

    def replay(self) -> None:
        logging.getLogger("raydist.engine.link.channel").setLevel(logging.ERROR)  # its refusals are the point
        keys = NodeKeys()
        secret = keys.issue("w0")
        welcomed: list[str] = []

        def heard(event: str, link: NodeLink) -> None:
            if event == "hello":
                welcomed.append(link.key)

        channel = NodeChannel("127.0.0.1", keys, heard)
        try:
            recorded: list[bytes] = []
            with socket.create_connection((channel.host, channel.port), timeout=5) as real:
                say_hello(_Recording(real, recorded), "w0", secret, host="h", pid=1, incarnation="i", resume=False)
            while not self._stop.wait(_THINK_S):
                with socket.create_connection((channel.host, channel.port), timeout=5) as sock:
                    for line in recorded:
                        sock.sendall(line)
                    sock.settimeout(5)
                    answers = b""
                    try:
                        while chunk := sock.recv(4096):
                            answers += chunk
                    except OSError:
                        pass
                self._count("replay", "a replayed handshake was welcomed" if b'"welcome"' in answers else "")
            if len(welcomed) != 1:
                self._count("replay", f"the link heard {len(welcomed)} hellos (1 real)")
        finally:
            channel.close()

    # -- a sender to the data agent ----------------------------------------------

    def agent(self) -> None:
        from raydist.data import _agent

        agent = _agent.BlockAgent()
        port = agent.open("127.0.0.1")
        job, secret = "job", os.urandom(16).hex()
        agent.expect(job, secret, max_bytes=4096)
        body = _ipc(10_000)  # ~80 KB, over the job's bound
        try:
            while not self._stop.wait(_THINK_S):
                kind = self._rng.choice(["out-of-plan", "oversize", "wrong-secret", "crowd"])
                if kind == "crowd":
                    crowd = []
                    for _ in range(_agent._MAX_CONNECTIONS + 8):
                        try:
                            crowd.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                        except OSError:
                            break
                    for sock in crowd:
                        sock.close()
                    self._count("agent")
                    continue
                header = {"job": job, "secret": secret, "part": self._rng.choice([-1, 1 << 30, "0; drop"])}
                if kind == "oversize":
                    header["part"] = 0
                elif kind == "wrong-secret":
                    header = {"job": job, "secret": "guess", "part": 0}
                _send(port, header, body if kind == "oversize" else _ipc(3))
                self._count("agent")
        finally:
            parts, _ = agent.take(job)
            if parts:
                self._count("agent", f"parts {sorted(parts)} stored")
            if agent._server is not None:
                agent._server.close()


def _argv(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


class _Recording:
    """A socket that keeps what its owner sends (an eavesdropper's copy)."""

    def __init__(self, sock: socket.socket, sent: list[bytes]) -> None:
        self._sock, self._sent = sock, sent

    def sendall(self, data: bytes) -> None:
        self._sent.append(data)
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def _line(sock: socket.socket) -> dict:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            return {}
        buf += chunk
    return json.loads(buf)


def _send(port: int, header: dict, body: bytes) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(json.dumps(header).encode() + b"\n" + body)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(10)
            while sock.recv(4096):
                pass
    except OSError:
        pass  # refused: reset or closed mid-send


def _ipc(rows: int) -> bytes:
    import pyarrow as pa

    table = pa.table({"x": list(range(rows))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
