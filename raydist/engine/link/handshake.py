"""The driver's side of the node link's handshake: accepting connections and
proving them, until each is a link or closed.

A connection says ``hello`` (its node key and a fresh nonce), gets a
``challenge`` (the driver's nonce and a proof that the driver knows the
key), and answers with its own ``proof``; only then is it a link
(:mod:`raydist.engine.link.keys` says what the proofs are). Every step is
bounded: at most :data:`HELLO_MAX` bytes a line, the whole handshake within
its deadline, at most :data:`MAX_PENDING` connections saying hello at once and
:data:`MAX_PENDING_PER_SOURCE` from one address, so that strangers cannot hold
every place or push out a node that is saying hello. Out of file
descriptors, accepting pauses (backing off) rather than spinning on a
listener that stays readable. It runs on the channel's selector thread
(:mod:`raydist.engine.link.channel`), never blocking it.
"""

from __future__ import annotations

import errno
import logging
import re
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raydist.backoff import Backoff
from raydist.engine.link import messages
from raydist.engine.link.admission import Places
from raydist.engine.link.keys import Frames, NodeKeys, driver_proof, fresh_nonce, node_proof, proven
from raydist.engine.link.wire import Lines, LineTooLong, encode, parse

__all__ = ["HELLO_MAX", "MAX_PENDING", "MAX_PENDING_PER_SOURCE", "Handshakes", "listen"]

log = logging.getLogger("raydist.engine.link.channel")

#: Longest hello (or proof) accepted from a connection that has not authenticated yet.
HELLO_MAX = 4096
#: Connections allowed to be saying hello at once; one more is closed at once (a supervisor tries again).
MAX_PENDING = 64
#: Of the connections saying hello, from one address (connections dialled to a relay are not counted).
MAX_PENDING_PER_SOURCE = 8
#: The node keys a cluster issues (launch.HEAD_KEY and slot.WorkerSlot's
#: ``wN``): a peer's key names a directory when its logs are kept.
_NODE_KEY = re.compile(r"(head|w[0-9]{1,9})\Z")
_NONCE = re.compile(r"[0-9a-f]{32}\Z")
#: At most one warning about refused connections (or a full file table) this often.
REFUSALS_LOG_S = 10.0
#: Connections taken from the listen backlog in one round.
ACCEPT_BATCH = 256
#: The listen backlog: a thousand supervisors may dial at once.
BACKLOG = 1024


def listen(host: str, ports: tuple[int, int] | None) -> socket.socket:
    """A listening socket on a free port, or the first free one of ``ports`` (low, high)."""
    if ports is None:
        return socket.create_server((host, 0), backlog=BACKLOG)
    low, high = ports
    for port in range(low, high + 1):
        try:
            return socket.create_server((host, port), backlog=BACKLOG)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    from raydist.errors import LinkPortsInUseError

    raise LinkPortsInUseError(low, high)

#: Called with a proven connection, its hello, what it sent past its proof,
#: and the connection's sealed frames from now on.
Proven = Callable[[socket.socket, dict[str, Any], bytes, Frames], None]


@dataclass
class _Pending:
    """A connection in its handshake: read bytes, its deadline, and once it
    said hello, the hello, the node's secret and the challenge's nonce."""

    lines: Lines
    deadline: float
    source: str | None
    hello: dict[str, Any] | None = None
    node_secret: str = ""
    nonce: str = ""
    proven: bool = False


class Handshakes:
    """The connections saying hello to one channel, on its selector."""

    def __init__(self, sel: selectors.BaseSelector, server: socket.socket, keys: NodeKeys, handshake_s: float,
                 on_proven: Proven) -> None:
        self._sel = sel
        self._server = server
        self._paused_until = 0.0
        self._pause_for = Backoff(0.1, 5.0)
        self._places = Places(MAX_PENDING, MAX_PENDING_PER_SOURCE)
        self._emfile_logged = -REFUSALS_LOG_S
        sel.register(server, selectors.EVENT_READ, self)
        self._keys = keys
        self._handshake_s = handshake_s
        self._on_proven = on_proven
        self._pending: dict[socket.socket, _Pending] = {}
        self._refused = 0  # refusals not logged yet
        self._refusal_logged = -REFUSALS_LOG_S

    def next_deadline(self) -> float | None:
        return min([p.deadline for p in self._pending.values()] + ([self._paused_until] if self._paused_until else []),
                   default=None)

    def expire(self, now: float) -> None:
        """Close the connections whose handshake ran past its deadline; accept again after a pause."""
        for conn in [c for c, p in self._pending.items() if p.deadline <= now]:
            self._forget(conn, close=True)
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            self._sel.register(self._server, selectors.EVENT_READ, self)

    def _accept(self) -> None:
        # Every connection queued (up to a bound), so that a flood cannot
        # fill the listen backlog under a node.
        for _ in range(ACCEPT_BATCH):
            try:
                conn, peer = self._server.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause(exc)
                return
            self._pause_for.reset()
            self.take(conn, str(peer[0]))

    def _pause(self, exc: OSError) -> None:
        """Out of file descriptors: stop accepting for a while (0.1 s,
        doubling to 5 s) instead of waking on a listener that stays readable."""
        pause = self._pause_for.next()
        self._paused_until = time.monotonic() + pause
        self._sel.unregister(self._server)
        now = time.monotonic()
        if now - self._emfile_logged >= REFUSALS_LOG_S:
            self._emfile_logged = now
            log.warning("the node channel cannot accept (%s); pausing %.1f s. Raise the driver's open-file limit "
                        "(ulimit -n)", exc.strerror, pause)

    def take(self, conn: socket.socket, source: str | None) -> None:
        """A new connection (``source``: its address; None for one this process dialled)."""
        if not self._places.take(source):
            conn.close()  # full: refused, not one saying hello pushed out
            return
        conn.setblocking(False)
        self._pending[conn] = _Pending(Lines(limit=HELLO_MAX), time.monotonic() + self._handshake_s, source)
        self._sel.register(conn, selectors.EVENT_READ, self)

    def read(self, sock: socket.socket) -> None:
        """``sock`` is readable: new connections (the listener), or every whole line a connection sent."""
        if sock is self._server:
            self._accept()
            return
        state = self._pending.get(sock)
        if state is None:
            return
        try:
            chunk = sock.recv(HELLO_MAX)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._forget(sock, close=True)
            return
        state.lines.feed(chunk)
        while True:  # every whole line in: a hello and its proof may come in one read
            try:
                line = state.lines.next()
            except LineTooLong:
                self._forget(sock, close=True)
                return
            if line is None:
                return
            try:
                done = self._step(sock, state, line)
            except Exception:  # noqa: BLE001 - one bad connection must not stop the others
                log.exception("node connection failed in its handshake")
                self._forget(sock, close=True)
                return
            if done:
                self._forget(sock, close=False)
                if state.proven:
                    assert state.hello is not None
                    frames = Frames.after_handshake(state.node_secret, str(state.hello["nonce"]), state.nonce,
                                                    driver=True)
                    self._on_proven(sock, state.hello, state.lines.rest(), frames)
                return

    def close_all(self) -> None:
        for conn in list(self._pending):
            self._forget(conn, close=True)

    def _forget(self, conn: socket.socket, *, close: bool) -> None:
        if (state := self._pending.pop(conn, None)) is not None:
            self._places.give_back(state.source)
            self._sel.unregister(conn)
        if close:
            conn.close()

    def _step(self, conn: socket.socket, state: _Pending, line: bytes) -> bool:
        """Take one line of ``conn``'s handshake: a hello (answered with the
        challenge) or the proof. True when the handshake is over, either way
        (``state.proven`` says which)."""
        msg = parse(line)
        if msg is None:
            return self._refuse(conn, "that did not speak the link's protocol")
        if state.hello is None:
            key = str(msg.get("key", ""))
            node_secret = self._keys.secret_of(key) if _NODE_KEY.match(key) else None
            if messages.kind(msg) != "hello" or not _NONCE.match(str(msg.get("nonce", ""))):
                return self._refuse(conn, "that did not say hello")
            if node_secret is None:
                return self._refuse(conn, "with a node key the cluster never issued")
            state.hello, state.node_secret, state.nonce = msg, node_secret, fresh_nonce()
            challenge = messages.challenge(state.nonce, driver_proof(node_secret, msg, state.nonce))
            try:
                conn.send(encode(challenge))  # a few hundred bytes into an empty socket buffer
            except OSError:
                conn.close()
                return True
            return False
        if messages.kind(msg) != "proof" or not proven(node_proof(state.node_secret, state.hello, state.nonce),
                                                     msg.get("proof")):
            return self._refuse(conn, f"that could not prove node key {state.hello.get('key')}")
        state.proven = True
        return True

    def _refuse(self, conn: socket.socket, why: str) -> bool:
        # One warning per REFUSALS_LOG_S at most (with how many more): a
        # flood of strangers must not flood the log.
        now = time.monotonic()
        self._refused += 1
        if now - self._refusal_logged >= REFUSALS_LOG_S:
            more = f" ({self._refused - 1} more refused since the last warning)" if self._refused > 1 else ""
            log.warning("refused a node connection %s%s", why, more)
            self._refused, self._refusal_logged = 0, now
        try:
            conn.send(encode(messages.refused()))
        except OSError:
            pass
        conn.close()
        return True
