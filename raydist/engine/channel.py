"""The link between a cluster's driver and each of its node supervisors.

Every Ray node of a cluster (the head on the driver, each worker in a Spark
task) runs under a supervisor process that holds one TCP connection to this
channel on the driver. The connection is the cluster's nervous system:

* a supervisor says ``hello`` and the two ends prove its node key to each
  other (:mod:`raydist.engine.linkauth`); it gets ``welcome``, streams the
  output of ``ray start``, says ``started`` once its node is up, and
  ``stopped`` once every process of its node is gone;
* the driver says ``stop`` to tear a node down at once, without waiting for
  Spark to kill the task;
* both ends hear from each other every few seconds (``ping``/``pong``). When
  the link breaks, the supervisor reconnects and *resumes* it; only if that
  fails within the grace window (:data:`raydist.engine.wire.RECONNECT_GRACE_S`)
  does each side count the other gone: the driver marks the node lost, the
  supervisor kills its node (the driver died, so nothing may be left running).

Framing and bounds are in :mod:`raydist.engine.wire`. No secret crosses the
link; proofs are compared in constant time and never logged.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raydist.engine.linkauth import NodeKeys, driver_proof, fresh_nonce, node_proof, proven
from raydist.engine.nodelink import LOG_TAIL_LINES, NodeLink
from raydist.engine.wire import (
    HANDSHAKE_S,
    IDLE_S,
    RECONNECT_GRACE_S,
    LineReader,
    LinkBroken,
    LinkClosed,
    enable_keepalive,
    encode,
    send,
)

__all__ = ["NodeChannel", "NodeLink", "send", "LOG_TAIL_LINES"]

log = logging.getLogger(__name__)

#: Longest hello (or proof) accepted from a connection that has not authenticated yet.
_HELLO_MAX = 4096
#: Connections allowed to be saying hello at once; one more is closed at
#: once (a supervisor tries again), so strangers cannot push out a node
#: that is saying hello.
_MAX_PENDING = 64
#: Connections taken from the listen backlog in one round of the handshake thread.
_ACCEPT_BATCH = 256
#: Of the connections saying hello, from one address: strangers on one host cannot hold every slot.
#: (Connections this process dialled to a relay are not counted here.)
_MAX_PENDING_PER_SOURCE = 8
#: The node keys a cluster issues (launch.HEAD_KEY and slot.WorkerSlot's
#: ``wN``): a peer's key names a directory when its logs are kept.
_NODE_KEY = re.compile(r"(head|w[0-9]{1,9})\Z")
_NONCE = re.compile(r"[0-9a-f]{32}\Z")
#: At most one warning about refused connections this often.
_REFUSALS_LOG_S = 10.0


@dataclass
class _Pending:
    """A connection in its handshake: read bytes, its deadline, and once it
    said hello, the hello, the node's secret and the challenge's nonce."""

    buf: bytearray
    deadline: float
    source: str | None
    hello: dict[str, Any] | None = None
    node_secret: str = ""
    nonce: str = ""


def _listen(host: str, ports: tuple[int, int] | None) -> socket.socket:
    if ports is None:
        return socket.create_server((host, 0), backlog=64)
    low, high = ports
    for port in range(low, high + 1):
        try:
            return socket.create_server((host, port), backlog=64)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    from raydist.errors import LinkPortsInUseError

    raise LinkPortsInUseError(low, high)


#: Called with (event, link): event is "hello", "started", "log", "demand", "stopped" or "closed".
Listener = Callable[[str, NodeLink], None]


class NodeChannel:
    """Driver-side server that every supervisor of one cluster connects to.

    One thread runs every connection's handshake (non-blocking, at most
    ``_HELLO_MAX`` bytes a line, all within ``handshake_s``); only a
    connection that proves a node key ``keys`` issued gets a thread of its own. A link that breaks
    without its node saying ``stopped`` is reported ``closed`` only if the
    supervisor does not resume it within ``grace_s``. It listens on a free
    port, or on the first free one of ``ports`` (low, high: a range a
    firewall rule names).
    """

    def __init__(
        self,
        host: str,
        keys: NodeKeys,
        listener: Listener,
        *,
        grace_s: float = RECONNECT_GRACE_S,
        idle_s: float = IDLE_S,
        handshake_s: float = HANDSHAKE_S,
        ports: tuple[int, int] | None = None,
    ) -> None:
        self._keys = keys
        self._listener = listener
        self._grace_s = grace_s
        self._idle_s = idle_s
        self._handshake_s = handshake_s
        self._server = _listen(host, ports)
        self._server.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._adopted: deque[socket.socket] = deque()  # connections dialled out to a relay, to say hello
        self.host = host
        self.port: int = self._server.getsockname()[1]
        self._links: dict[str, NodeLink] = {}
        self._lock = threading.Lock()
        self._resumed = threading.Condition(self._lock)
        self._closing = False
        self._refused = 0  # refusals not logged yet (the handshake thread's alone)
        self._refusal_logged = -_REFUSALS_LOG_S
        self._stopped = False  # after stop_all(): every node, also one that says hello later, is told to stop
        self._thread = threading.Thread(target=self._handshakes, name=f"raydist-channel-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def links(self) -> dict[str, NodeLink]:
        with self._lock:
            return dict(self._links)

    def adopt(self, conn: socket.socket) -> None:
        """Take a connection this process dialled (to the cluster's relay,
        :mod:`raydist.engine.relay`) as if the supervisor at its far end had
        connected here: its hello is read and checked the same way."""
        self._adopted.append(conn)
        try:
            self._wake_w.send(b"a")
        except OSError:
            conn.close()  # the channel is closed

    def stop_all(self, *, hard: bool = False) -> None:
        """Tell every node to stop (``hard``: see :meth:`NodeLink.stop`),
        and every node that connects from now on."""
        with self._lock:
            self._stopped = True
            links = list(self._links.values())
            self._resumed.notify_all()  # a broken link is not waited for any more
        for link in links:
            link.stop(hard=hard)

    def close(self) -> None:
        """Stop accepting and drop every connection (supervisors then stop their nodes)."""
        with self._lock:
            self._closing = True
            self._resumed.notify_all()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        for link in self.links().values():
            if link._sock is not None:
                try:
                    link._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # internals: the handshake thread ------------------------------------------

    def _handshakes(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._server, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        pending: dict[socket.socket, _Pending] = {}

        def forget(conn: socket.socket) -> None:
            pending.pop(conn, None)
            sel.unregister(conn)

        def drop(conn: socket.socket) -> None:
            forget(conn)
            conn.close()

        def room_for(source: str | None) -> bool:
            if len(pending) >= _MAX_PENDING:
                return False
            return source is None or sum(1 for p in pending.values() if p.source == source) < _MAX_PENDING_PER_SOURCE

        try:
            while not self._closing:
                now = time.monotonic()
                for conn in [c for c, p in pending.items() if p.deadline <= now]:
                    drop(conn)
                timeout = min((p.deadline for p in pending.values()), default=now + 1.0) - now
                for key, _ in sel.select(max(0.0, timeout)):
                    sock = key.fileobj
                    if self._closing:
                        continue
                    new: list[tuple[socket.socket, str | None]] = []
                    if sock is self._wake_r:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                        while self._adopted:
                            new.append((self._adopted.popleft(), None))
                    elif sock is self._server:
                        # Every connection queued (up to a bound), so that a
                        # flood cannot fill the listen backlog under a node.
                        for _ in range(_ACCEPT_BATCH):
                            try:
                                conn, peer = self._server.accept()
                            except BlockingIOError:
                                break
                            except OSError:
                                time.sleep(0.05)  # out of file descriptors, say: back off, do not spin
                                break
                            new.append((conn, str(peer[0])))
                    for conn, source in new:
                        if not room_for(source):
                            conn.close()  # full: refused, not one saying hello pushed out
                            continue
                        conn.setblocking(False)
                        pending[conn] = _Pending(bytearray(), time.monotonic() + self._handshake_s, source)
                        sel.register(conn, selectors.EVENT_READ)
                    if sock is self._wake_r or sock is self._server:
                        continue
                    assert isinstance(sock, socket.socket)
                    state = pending.get(sock)
                    if state is None:
                        continue  # dropped earlier in this round
                    try:
                        chunk = sock.recv(_HELLO_MAX)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    state.buf += chunk
                    if not chunk:
                        drop(sock)
                        continue
                    while True:  # every whole line in: a hello and its proof may come in one read
                        end = state.buf.find(b"\n")
                        if (end < 0 and len(state.buf) > _HELLO_MAX) or end > _HELLO_MAX:
                            drop(sock)
                            break
                        if end < 0:
                            break
                        line, state.buf = bytes(state.buf[:end]), state.buf[end + 1:]
                        try:
                            done = self._step(sock, state, line)
                        except Exception:  # noqa: BLE001 - one bad connection must not stop the handshakes
                            log.exception("node connection failed in its handshake")
                            done = True
                            sock.close()
                        if done:
                            forget(sock)
                            break
        finally:
            for conn in list(pending):
                drop(conn)
            while self._adopted:
                self._adopted.popleft().close()
            sel.close()
            for s in (self._server, self._wake_r, self._wake_w):
                try:
                    s.close()
                except OSError:
                    pass

    def _step(self, conn: socket.socket, state: _Pending, line: bytes) -> bool:
        """Take one line of ``conn``'s handshake: a hello (answered with the
        challenge) or the proof (answered with a welcome, and the link then
        has a thread of its own). True when the handshake is over, either way."""
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            return self._refuse(conn, "that did not speak the link's protocol")
        if state.hello is None:
            key = str(msg.get("key", ""))
            node_secret = self._keys.secret_of(key) if _NODE_KEY.match(key) else None
            if msg.get("type") != "hello" or not _NONCE.match(str(msg.get("nonce", ""))):
                return self._refuse(conn, "that did not say hello")
            if node_secret is None:
                return self._refuse(conn, "with a node key the cluster never issued")
            state.hello, state.node_secret, state.nonce = msg, node_secret, fresh_nonce()
            challenge = {"type": "challenge", "nonce": state.nonce,
                         "proof": driver_proof(node_secret, msg, state.nonce)}
            try:
                conn.send(encode(challenge))  # a few hundred bytes into an empty socket buffer
            except OSError:
                conn.close()
                return True
            return False
        if msg.get("type") != "proof" or not proven(node_proof(state.node_secret, state.hello, state.nonce),
                                                     msg.get("proof")):
            return self._refuse(conn, f"that could not prove node key {state.hello.get('key')}")
        conn.setblocking(True)
        threading.Thread(target=self._serve, args=(conn, state.hello, bytes(state.buf)), daemon=True,
                         name=f"raydist-channel-{state.hello.get('key')}").start()
        return True

    def _refuse(self, conn: socket.socket, why: str) -> bool:
        # One warning per _REFUSALS_LOG_S at most (with how many more): a
        # flood of strangers must not flood the log.
        now = time.monotonic()
        self._refused += 1
        if now - self._refusal_logged >= _REFUSALS_LOG_S:
            more = f" ({self._refused - 1} more refused since the last warning)" if self._refused > 1 else ""
            log.warning("refused a node connection %s%s", why, more)
            self._refused, self._refusal_logged = 0, now
        try:
            conn.send(encode({"type": "refused"}))
        except OSError:
            pass
        conn.close()
        return True

    # internals: one thread per authenticated link -----------------------------

    def _attach(self, conn: socket.socket, hello: dict[str, Any]) -> tuple[NodeLink, bool, bool]:
        """The link this hello speaks for (a new one, or the one it resumes)."""
        key = str(hello.get("key"))
        incarnation = str(hello.get("incarnation", ""))
        with self._lock:
            old = self._links.get(key)
            late = self._stopped or self._closing
            if (hello.get("resume") and old is not None and incarnation and old.incarnation == incarnation
                    and not old.closed.is_set()):
                stale, old._sock = old._sock, conn
                self._resumed.notify_all()
                if stale is not None and stale is not conn:
                    try:
                        stale.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return old, True, late
            link = NodeLink(key=key, host=str(hello.get("host", "")), pid=int(hello.get("pid", 0) or 0),
                            incarnation=incarnation, _sock=conn)
            if hello.get("resume"):
                return link, False, late  # not kept: _serve tells it to stop
            self._links[key] = link
        if old is not None and old._sock is not None:
            # A resubmitted node replaces a stale connection of the same slot.
            old.stop()
        return link, False, late

    def _serve(self, conn: socket.socket, hello: dict[str, Any], rest: bytes) -> None:
        enable_keepalive(conn)
        conn.settimeout(self._idle_s)
        link, resumed, late = self._attach(conn, hello)
        send(conn, link._lock, {"type": "welcome"})
        if late:
            # The cluster is going away: a supervisor that connects now (its
            # task started late, on a loaded host) stops its node at once
            # instead of running one nobody will stop.
            link.stop()
        if resumed:
            log.info("node %s resumed its link", link.key)
        elif hello.get("resume"):
            # The driver gave up on this node already (its grace ran out
            # here first, or the node was replaced): it must not come back.
            send(conn, link._lock, {"cmd": "stop"})
            conn.close()
            return
        else:
            self._listener("hello", link)
        reader = LineReader(conn, idle_s=self._idle_s, initial=rest)
        closed_by_peer = False
        try:
            while True:
                self._handle(link, conn, reader.read())
        except LinkBroken as exc:
            # A peer that closed its end is gone (its process died: the
            # kernel closed the socket); a silent or reset link may come back.
            closed_by_peer = isinstance(exc, LinkClosed)
            log.debug("node %s: link ended: %s", link.key, exc)
        finally:
            try:
                conn.close()
            except OSError:
                pass
        with self._lock:
            resumed_elsewhere = link._sock is not conn
        if resumed_elsewhere:
            return
        if closed_by_peer or not self._wait_resume(link, conn):
            link.closed.set()
            self._listener("closed", link)

    def _handle(self, link: NodeLink, conn: socket.socket, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "ping":
            send(conn, link._lock, {"type": "pong"})
        elif kind == "log":
            link.log_tail.append(str(msg.get("line", "")))
            self._listener("log", link)
        elif kind == "started":
            link.started = True
            link.node_ip = str(msg.get("node_ip", ""))
            info = msg.get("info", {})
            link.info = dict(info) if isinstance(info, dict) else {}
            self._listener("started", link)
        elif kind == "demand":
            link.demand = msg
            self._listener("demand", link)
        elif kind == "logs":
            link._on_logs(msg)
        elif kind == "stopped":
            link.stopped = True
            code = msg.get("code")
            link.exit_code = code if isinstance(code, int) else None
            for tail_line in msg.get("log_tail", []) or []:
                link.log_tail.append(str(tail_line))
            self._listener("stopped", link)

    def _wait_resume(self, link: NodeLink, conn: socket.socket) -> bool:
        """After ``conn`` broke: True when the link went on (or goes on within
        the grace window) over another connection of the same supervisor."""
        deadline = time.monotonic() + self._grace_s
        with self._lock:
            if link._sock is conn and not (link.stopped or self._stopped or self._closing):
                log.info("node %s: link broken; waiting %g s for its supervisor to reconnect", link.key,
                         self._grace_s)
            while link._sock is conn:
                left = deadline - time.monotonic()
                if link.stopped or self._stopped or self._closing or left <= 0:
                    return False
                self._resumed.wait(left)
            return True
