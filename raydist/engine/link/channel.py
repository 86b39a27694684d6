"""The link between a cluster's driver and each of its node supervisors.

Every Ray node of a cluster (the head on the driver, each worker in a Spark
task) runs under a supervisor process that holds one TCP connection to this
channel on the driver: the cluster's nervous system. What each end says is
:mod:`raydist.engine.link.messages`: a supervisor proves its node key
(:mod:`raydist.engine.link.keys`), streams ``ray start``'s output, says when
its node is up and when it is gone; the driver may stop a node at once. When
the link breaks, the supervisor reconnects and *resumes* it; only if that
fails within the grace window (:data:`raydist.engine.link.wire.RECONNECT_GRACE_S`)
does each side count the other gone: the driver marks the node lost, the
supervisor kills its node (the driver died, so nothing may be left running).

One thread serves every connection of a channel, handshakes and links alike
(non-blocking sockets on one selector), so a cluster of a thousand nodes costs
the driver one thread, not a thousand. Nothing on it blocks: what the driver
says to a node goes into that connection's outgoing buffer (bounded: a peer
that stops reading is dropped, not waited for), and listeners run on it, so
they must not block either (the cluster's take its lock, which nothing holds
across a Spark call or a socket send).

Framing and bounds are in :mod:`raydist.engine.link.wire`. No secret crosses the
link; proofs are compared in constant time and never logged.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raydist.engine.link import messages
from raydist.engine.link.handshake import Handshakes, listen
from raydist.engine.link.keys import BadFrame, Frames, NodeKeys
from raydist.engine.link.limits import raise_open_files
from raydist.engine.link.nodelink import LOG_TAIL_LINES, NodeLink
from raydist.engine.link.wire import (
    HANDSHAKE_S,
    IDLE_S,
    MAX_LINE,
    RECONNECT_GRACE_S,
    Lines,
    LineTooLong,
    enable_keepalive,
    parse,
)

__all__ = ["NodeChannel", "NodeLink", "LOG_TAIL_LINES"]

log = logging.getLogger(__name__)

#: Bytes a link may have waiting to be sent before its peer counts as stuck
#: (it stopped reading) and the connection is dropped (it may resume).
_OUT_MAX = 4 << 20
#: How often silent links and grace windows are looked at.
_TICK_S = 0.5
#: How long a link whose peer closed it waits for the same supervisor to say
#: hello again (it retries a failed handshake within a second) before the node
#: counts as gone.
CLOSED_GRACE_S = 3.0


@dataclass
class _Conn:
    """An authenticated connection: the link it carries, bytes read and not
    yet a line, bytes to send, and when its peer was last heard."""

    link: NodeLink
    sock: socket.socket
    heard: float
    frames: Frames  # this connection's sealed frames, both ways
    lines: Lines = field(default_factory=Lines)
    out: bytearray = field(default_factory=bytearray)
    writing: bool = False


#: Called with (event, link): event is "hello", "resumed" (the same supervisor on a new
#: connection), "started", "log", "demand", "stopped" or "closed".
Listener = Callable[[str, NodeLink], None]


class NodeChannel:
    """Driver-side server that every supervisor of one cluster connects to.

    Handshakes are bounded (:mod:`raydist.engine.link.handshake`: short lines, all within
    ``handshake_s``); only a connection that proves a node key ``keys``
    issued becomes a link. A link that breaks without its node saying
    ``stopped`` is reported ``closed`` only if the supervisor does not resume
    it within ``grace_s``. It listens on a free port, or on the first free
    one of ``ports`` (low, high: a range a firewall rule names).
    """

    def __init__(self, host: str, keys: NodeKeys, listener: Listener, *, grace_s: float = RECONNECT_GRACE_S,
                 idle_s: float = IDLE_S, handshake_s: float = HANDSHAKE_S,
                 ports: tuple[int, int] | None = None) -> None:
        raise_open_files()
        self._keys = keys
        self._listener = listener
        self._grace_s = grace_s
        self._idle_s = idle_s
        self._handshake_s = handshake_s
        self._server = listen(host, ports)
        self._server.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        # Connections dialled out to a relay, to say hello, and where their far end came from.
        self._adopted: deque[tuple[socket.socket, str]] = deque()
        self.host = host
        self.port: int = self._server.getsockname()[1]
        self._links: dict[str, NodeLink] = {}
        self._lock = threading.Lock()  # guards _links, _conns, each _Conn's out and the want sets
        self._conns: dict[socket.socket, _Conn] = {}
        self._want_write: set[socket.socket] = set()
        self._stuck: set[socket.socket] = set()
        self._grace: dict[str, tuple[NodeLink, socket.socket, float, str]] = {}  # loop thread's alone
        self._closing = False
        self._stopped = False  # after stop_all(): every node, also one that says hello later, is told to stop
        self._thread = threading.Thread(target=self._run, name=f"raydist-channel-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def links(self) -> dict[str, NodeLink]:
        with self._lock:
            return dict(self._links)

    def adopt(self, conn: socket.socket, source: str = "relay:") -> None:
        """Take a connection this process dialled (to the cluster's relay,
        :mod:`raydist.engine.link.relay`) as if the supervisor at its far end had
        connected here: its hello is read and checked the same way, and
        counted against ``source`` (where the far end connected from) as a
        direct connection is against its address."""
        self._adopted.append((conn, source))
        if not self._wake():
            conn.close()  # the channel is closed

    def stop_all(self, *, hard: bool = False) -> None:
        """Tell every node to stop (``hard``: see :meth:`NodeLink.stop`),
        and every node that connects from now on."""
        with self._lock:
            self._stopped = True
            links = list(self._links.values())
        for link in links:
            link.stop(hard=hard)
        self._wake()  # a broken link is not waited for any more

    def close(self) -> None:
        """Stop accepting and drop every connection (supervisors then stop
        their nodes); every link not closed yet is reported ``closed``."""
        with self._lock:
            self._closing = True
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(10)

    # sending (any thread) -----------------------------------------------------

    def _post(self, link: NodeLink, data: bytes) -> bool:
        """Queue ``data`` on ``link``'s connection; never blocks. False when
        the link has no connection now (what was said is lost, as on a
        broken link)."""
        with self._lock:
            conn = self._conns.get(link._sock) if link._sock is not None else None
            if conn is None or conn.sock in self._stuck:
                return False
            data = conn.frames.seal(data)  # in the order the bytes go out: under the lock
            if not conn.out:
                try:
                    data = data[conn.sock.send(data):]
                except BlockingIOError:
                    pass
                except OSError:
                    return False  # the loop sees the broken connection on its next read
            if not data:
                return True
            conn.out += data
            if len(conn.out) > _OUT_MAX:
                self._stuck.add(conn.sock)
            elif conn.writing:
                return True
            elif threading.current_thread() is self._thread:
                conn.writing = True
                self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                return True
            else:
                self._want_write.add(conn.sock)
        self._wake()
        return True

    def _wake(self) -> bool:
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:
            pass  # a wake-up is pending already
        except OSError:
            return False
        return True

    # the loop -------------------------------------------------------------------

    def _run(self) -> None:
        self._sel = sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        hellos = Handshakes(sel, self._server, self._keys, self._handshake_s, self._admit)
        next_tick = time.monotonic() + _TICK_S
        try:
            while not self._closing:
                now = time.monotonic()
                hellos.expire(now)
                wake_at = min(t for t in (next_tick, hellos.next_deadline()) if t is not None)
                for key, mask in sel.select(max(0.0, wake_at - now)):
                    if self._closing:
                        break
                    what = key.data
                    if what == "wake":
                        self._on_wake(hellos)
                    elif what is hellos:
                        hellos.read(key.fileobj)  # type: ignore[arg-type]
                    elif isinstance(what, _Conn):
                        if mask & selectors.EVENT_WRITE:
                            self._flush(what)
                        if mask & selectors.EVENT_READ and what.sock in self._conns:
                            self._read(what)
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + _TICK_S
                    self._tick()
        except Exception:  # noqa: BLE001 - say why the node links ended; the finally still reports them
            log.exception("the node channel on port %d stopped", self.port)
        finally:
            hellos.close_all()
            self._shut()

    def _on_wake(self, hellos: Handshakes) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        while self._adopted:
            conn, source = self._adopted.popleft()
            if self._closing:
                conn.close()
            else:
                hellos.take(conn, source)
        with self._lock:
            stuck, self._stuck = self._stuck, set()
            want, self._want_write = self._want_write, set()
            for sock in want - stuck:
                conn = self._conns.get(sock)
                if conn is not None and not conn.writing and conn.out:
                    conn.writing = True
                    self._sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        for sock in stuck:
            if (conn := self._conns.get(sock)) is not None:
                log.warning("node %s stopped reading its link (%d bytes waiting): dropping the connection",
                            conn.link.key, len(conn.out))
                self._broken(conn, f"it stopped reading its link ({len(conn.out)} bytes waiting)")
        if self._stopped:
            self._tick()  # broken links are not waited for any more

    # links --------------------------------------------------------------------

    def _admit(self, sock: socket.socket, hello: dict[str, Any], rest: bytes, frames: Frames) -> None:
        """A proven connection becomes its node's link (a new one, or the one
        it resumes). Whatever its hello or first lines hold, a fault here
        ends this connection only, never the channel."""
        try:
            self._admit_link(sock, hello, rest, frames)
        except Exception as exc:  # noqa: BLE001 - one peer's bytes must not end every node's link
            log.warning("node %s: closing its connection: its hello or first frame could not be used (%s: %s)",
                        str(hello.get("key", "?"))[:64], type(exc).__name__, str(exc)[:200])
            conn = self._conns.get(sock)
            if conn is not None:
                self._broken(conn, f"it sent a frame raydist could not use ({type(exc).__name__})")
            else:
                sock.close()

    def _admit_link(self, sock: socket.socket, hello: dict[str, Any], rest: bytes, frames: Frames) -> None:
        try:
            enable_keepalive(sock)
        except OSError:
            sock.close()
            return
        key = str(hello.get("key"))
        incarnation = str(hello.get("incarnation", ""))
        replaced: NodeLink | None = None
        with self._lock:
            old = self._links.get(key)
            late = self._stopped or self._closing
            # The same supervisor process (its incarnation) carries on with its
            # link: after a break (``resume``), or after a handshake it gave up
            # on once the driver had taken it (a first hello said again).
            resumed = bool(old is not None and incarnation and old.incarnation == incarnation
                           and not old.closed.is_set())
            if resumed:
                assert old is not None
                link, stale = old, old._sock
                link._sock = sock
                self._grace.pop(key, None)
            else:
                pid = hello.get("pid")
                link = NodeLink(key=key, host=str(hello.get("host", ""))[:255],
                                pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else 0,
                                incarnation=incarnation, _sock=sock, _post=self._post)
                stale = None
                if not hello.get("resume"):
                    self._links[key] = link
                    if old is not None and old._sock is not None:
                        replaced = old  # a resubmitted node replaces a stale connection of the same slot
            conn = _Conn(link, sock, time.monotonic(), frames, Lines(rest))
            self._conns[sock] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)
        if stale is not None and stale is not sock and (gone := self._conns.get(stale)) is not None:
            self._drop(gone)  # the connection it resumed from, still open here
        link.tell(messages.welcome())
        if replaced is not None:
            # The stale connection hears why and is closed: a peer that goes
            # on pinging on it must not hold a connection (and its buffers)
            # for a node that has a new one.
            replaced.stop()
            if (stale_conn := self._conns.get(replaced._sock)) is not None:  # type: ignore[arg-type]
                self._flush(stale_conn)
                self._drop(stale_conn)
            # Whoever still holds the old link sees it end; listeners heard
            # the new link's hello, and hear nothing of the old one's end.
            replaced.end_reason = replaced.end_reason or "a new connection of its node replaced it"
            replaced.closed.set()
        if late:
            # The cluster is going away: a supervisor that connects now (its
            # task started late, on a loaded host) stops its node at once
            # instead of running one nobody will stop.
            link.stop()
        if resumed:
            log.info("node %s resumed its link", key)
            self._emit("resumed", link)  # what was said on the old connection may be lost
        elif hello.get("resume"):
            # The driver gave up on this node already (its grace ran out
            # here first, or the node was replaced): it must not come back.
            link.tell(messages.stop())
            self._flush(conn)
            self._drop(conn)
            return
        else:
            self._emit("hello", link)
        self._lines(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("node %s: link ended: %s", conn.link.key, exc)
            self._broken(conn, f"its link failed ({exc})")
            return
        if not chunk:
            # A peer that closed its end is gone, as a rule (its process
            # died: the kernel closed the socket); it gets a moment, though,
            # since a supervisor whose handshake timed out on its side
            # closes a connection the driver took, and says hello again.
            self._broken(conn, "its supervisor closed the link", by_peer=True)
            return
        conn.heard = time.monotonic()
        conn.lines.feed(chunk)
        self._lines(conn)

    def _lines(self, conn: _Conn) -> None:
        while conn.sock in self._conns:
            try:
                line = conn.lines.next()
            except LineTooLong:
                log.debug("node %s: a line longer than %d bytes", conn.link.key, MAX_LINE)
                self._broken(conn, f"it sent a line longer than {MAX_LINE} bytes")
                return
            if line is None:
                return
            try:
                line = conn.frames.open(line)
            except BadFrame:
                log.warning("node %s: a frame whose MAC does not hold (injected, changed or replayed on the "
                            "way): closing its connection", conn.link.key)
                self._broken(conn, "it sent a frame whose MAC does not hold")
                return
            msg = parse(line)
            if msg is None:
                self._broken(conn, "it sent a line that is not a JSON object")
                return
            try:
                self._handle(conn.link, msg)
            except Exception as exc:  # noqa: BLE001 - the one guard on what a peer sends: its connection ends
                log.warning("node %s sent a %r frame raydist could not use (%s: %s): closing its connection",
                            conn.link.key, messages.kind(msg), type(exc).__name__, str(exc)[:200])
                self._broken(conn, f"it sent a frame raydist could not use ({type(exc).__name__})")
                return

    def _handle(self, link: NodeLink, msg: dict[str, Any]) -> None:
        if (event := link.heard(msg)) is not None:
            self._emit(event, link)

    def _emit(self, event: str, link: NodeLink) -> None:
        try:
            self._listener(event, link)
        except Exception:  # noqa: BLE001 - a listener's bug must not end every node's link
            log.exception("node %s: the %s event's listener failed", link.key, event)

    def _flush(self, conn: _Conn) -> None:
        with self._lock:
            try:
                sent = conn.sock.send(conn.out) if conn.out else 0
            except BlockingIOError:
                sent = 0
            except OSError:
                conn.out.clear()
                sent = 0
            del conn.out[:sent]
            if not conn.out and conn.writing and conn.sock in self._conns:
                conn.writing = False
                self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: _Conn) -> None:
        """Close ``conn`` without judging its link (it moved elsewhere, or is done)."""
        with self._lock:
            self._conns.pop(conn.sock, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _broken(self, conn: _Conn, why: str, *, by_peer: bool = False) -> None:
        """``conn`` ended (``why``): its link waits for its supervisor to
        resume it (the grace window; a few seconds when the peer closed it),
        unless the node or the cluster is stopping."""
        self._drop(conn)
        link = conn.link
        with self._lock:
            if link._sock is not conn.sock:
                return  # resumed over another connection already
            waiting = not (link.stopped or self._stopped or self._closing)
        if waiting:
            grace = min(self._grace_s, CLOSED_GRACE_S) if by_peer else self._grace_s
            log.info("node %s: link broken (%s); waiting %g s for its supervisor to reconnect", link.key, why, grace)
            self._grace[link.key] = (link, conn.sock, time.monotonic() + grace, why)
        else:
            self._closed(link, why)

    def _closed(self, link: NodeLink, why: str) -> None:
        if not link.closed.is_set():
            if not link.end_reason:
                link.end_reason = why
            log.debug("node %s: link closed: %s", link.key, why)
            link.closed.set()
            self._emit("closed", link)

    def _tick(self) -> None:
        """Silent links count as broken; grace windows that ran out close their links."""
        now = time.monotonic()
        for conn in [c for c in list(self._conns.values()) if now - c.heard > self._idle_s]:
            log.debug("node %s: silent for %g s", conn.link.key, self._idle_s)
            self._broken(conn, f"its link was silent for {self._idle_s:g} s")
        for key, (link, sock, deadline, why) in list(self._grace.items()):
            if link._sock is not sock:
                self._grace.pop(key, None)  # resumed
            elif deadline <= now or link.stopped or self._stopped or self._closing:
                self._grace.pop(key, None)
                self._closed(link, why + (", and it did not come back in time" if deadline <= now else ""))

    def _shut(self) -> None:
        while self._adopted:
            self._adopted.popleft()[0].close()
        for conn in list(self._conns.values()):
            self._flush(conn)
            self._drop(conn)
            self._closed(conn.link, "the driver's node channel closed")
        for link, _, _, why in list(self._grace.values()):
            self._closed(link, why)
        self._grace.clear()
        with self._lock:
            self._closing = True
        self._sel.close()
        for s in (self._server, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
