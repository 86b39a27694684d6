"""The node link's far end inside the cluster, for a driver nobody can dial.

A Spark Connect client may run where the executors cannot reach it (a laptop,
a notebook sandbox). Its cluster's node links must then end inside the
cluster: the head's Spark task runs a :class:`LinkRelay`, every supervisor
(the head's included) connects to the relay as it would to the driver's
channel, and the driver reaches the relay only by dialling out
(:class:`RelayDialer`):

* the driver holds one *control* connection to the relay; for each
  supervisor that connects, the relay says ``dial`` with a fresh id;
* the driver opens a *pair* connection naming that id, and the relay joins
  the two byte streams; the driver's :class:`~raydist.engine.link.channel.NodeChannel`
  adopts the pair connection as if it had accepted the supervisor itself.

The link protocol (the handshake, heartbeats, resume, stop) passes through
unchanged and is checked end to end by the driver and each supervisor; the
relay checks only that control and pair connections come from the driver:
the control connection answers a fresh challenge, and a pair connection
proves its one-time id, each with a MAC under the relay's key
(:func:`raydist.engine.link.keys.relay_key`, derived from the head's key).
After its challenge, every line on the control connection, both ways, is a
sealed frame (:class:`~raydist.engine.link.keys.Frames`, keyed by the relay's
key and both ends' nonces): a host on the path can neither make the driver
dial (nor stop it dialling) nor pass for either end. An end that closes its side is
passed on as a close, an end that breaks as a reset, so the driver and the
supervisor each read the other's end exactly as on a direct link (a close:
gone; a reset or silence: wait for a resume).
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable

from raydist.backoff import Backoff
from raydist.engine.link import messages
from raydist.engine.link.admission import Places
from raydist.engine.link.keys import Frames, fresh_nonce, proven, relay_proof
from raydist.engine.link.wire import (
    HANDSHAKE_S,
    HEARTBEAT_S,
    IDLE_S,
    LineReader,
    LinkBroken,
    enable_keepalive,
    encode,
    parse,
    read_line,
)

__all__ = ["LinkRelay", "RelayDialer"]

log = logging.getLogger(__name__)

#: Longest first line the relay reads from a connection it does not know yet.
_FIRST_MAX = 4096
#: Connections allowed to be saying their first line, or waiting for the
#: driver to dial their pair, at once; more are refused (closed) at once.
_MAX_WAITING = 64
#: Of those, from one address: strangers on one host cannot hold every place.
_MAX_PER_SOURCE = 8


def _reset(sock: socket.socket) -> None:
    """Close with a reset, so the peer reads a broken link, not a close."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _first_line(sock: socket.socket, timeout: float, said: bytes = b"") -> tuple[bytes, bytes] | None:
    """The first line a new connection says within ``timeout`` (and what it
    sent past it), or None. ``said``: bytes already read from it."""
    try:
        return read_line(sock, time.monotonic() + timeout, limit=_FIRST_MAX, said=said)
    except (LinkBroken, OSError):
        return None


class _Joint:
    """Two connections joined both ways, one thread per direction. An end
    that closes is passed on as a close; one that breaks, or :meth:`abort`,
    resets both. Both sockets are closed, and ``ended`` called, once both
    directions ended."""

    def __init__(self, a: socket.socket, b: socket.socket, ended: Callable[[], None]) -> None:
        self._a, self._b, self._ended = a, b, ended
        self._aborted = False
        self._left = 2
        self._lock = threading.Lock()

    def start(self, first: bytes) -> None:
        """Start passing bytes; ``first``: what ``a`` said before ``b`` was there."""
        a, b = self._a, self._b
        try:
            b.sendall(first)
        except OSError:
            self._left = 0
            self._finish(reset=True)
            return
        threading.Thread(target=self._pump, args=(a, b), daemon=True, name="raydist-relay-up").start()
        threading.Thread(target=self._pump, args=(b, a), daemon=True, name="raydist-relay-down").start()

    def abort(self) -> None:
        """Reset both ends now (the relay closes)."""
        self._aborted = True
        for sock in (self._a, self._b):
            try:
                sock.shutdown(socket.SHUT_RD)  # wakes the pump that reads it; sends nothing
            except OSError:
                pass

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        reset = True
        try:
            src.settimeout(None)
            while chunk := src.recv(65536):
                dst.sendall(chunk)
            if not self._aborted:
                dst.shutdown(socket.SHUT_WR)
                reset = False
        except OSError:
            pass
        if reset:
            self._aborted = True
            for sock in (self._a, self._b):
                try:
                    sock.shutdown(socket.SHUT_RD)
                except OSError:
                    pass
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish(reset=self._aborted)

    def _finish(self, *, reset: bool) -> None:
        for sock in (self._a, self._b):
            if reset:
                _reset(sock)
            else:
                sock.close()
        self._ended()


class LinkRelay:
    """Listens on ``host`` in the head's task for supervisors and for the
    driver's dial-outs (see the module docstring). ``close()`` ends it."""

    def __init__(self, host: str, secret: str, *, wait_s: float = HANDSHAKE_S) -> None:
        self._secret = secret  # the relay's key (linkauth.relay_key)
        self._wait_s = wait_s
        self._server = socket.create_server((host, 0), backlog=64)
        self._server.settimeout(0.5)
        self.host = host
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._control_frames: Frames | None = None  # the control connection's sealed frames
        self._control_lock = threading.Lock()  # one writer at a time on the control connection
        # id -> supervisor, its bytes, deadline, its address
        self._waiting: dict[str, tuple[socket.socket, bytes, float, str]] = {}
        self._joined: set[_Joint] = set()  # links passing through now
        # Connections saying their first line or waiting for their pair, in all and per address.
        self._places = Places(_MAX_WAITING, _MAX_PER_SOURCE)
        self._pause = Backoff(0.05, 1.0)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name=f"raydist-relay-{self.port}").start()
        threading.Thread(target=self._heartbeat, daemon=True, name="raydist-relay-ping").start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        """Stop listening and reset every connection: the driver's, each
        supervisor's, waiting or linked. A supervisor then finds nothing
        listening here and stops its node at once (the head is gone)."""
        self._closed.set()
        with self._lock:
            control, self._control = self._control, None
            waiting, self._waiting = list(self._waiting.values()), {}
            joined, self._joined = list(self._joined), set()
        self._server.close()  # first: a reset supervisor that reconnects must find nothing listening
        for joint in joined:
            joint.abort()
        for sock in [control, *(w[0] for w in waiting)]:
            if sock is not None:
                _reset(sock)

    # internals ----------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            self._expire()
            try:
                conn, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(self._pause.next())  # out of file descriptors, say: back off, do not spin
                continue
            self._pause.reset()
            source = str(peer[0])
            if not self._places.take(source):
                conn.close()  # refused, not one already waiting pushed out
                continue
            threading.Thread(target=self._greet, args=(conn, source), daemon=True, name="raydist-relay-greet").start()

    def _greet(self, conn: socket.socket, source: str) -> None:
        waits = False
        try:
            waits = self._take(conn, source)
        finally:
            if not waits:  # a waiting supervisor keeps its place until paired or expired
                self._places.give_back(source)

    def _take(self, conn: socket.socket, source: str) -> bool:
        """Read a new connection's first line and give it its place: the
        driver's control or pair connection once it proves the relay's key,
        else a supervisor waiting for its pair."""
        said = _first_line(conn, self._wait_s)
        if said is None or self._closed.is_set():
            conn.close()
            return False
        first, rest = said
        msg = parse(first)
        kind = messages.kind(msg)
        if kind in ("relay-control", "relay-pair"):
            assert isinstance(msg, dict)
            proven_with = self._from_driver(conn, kind, msg, rest)
            if proven_with is None:
                log.warning("relay: refused a connection that could not prove the relay's key")
                conn.close()
                return False
            enable_keepalive(conn)
            if kind == "relay-control":
                frames, after = proven_with
                self._set_control(conn, frames, after)
            else:
                self._pair(str(msg.get("id", "")), conn)
            return False
        # A supervisor (the driver checks its handshake): wait for a pair.
        enable_keepalive(conn)
        link_id = secrets.token_hex(8)
        with self._lock:
            self._waiting[link_id] = (conn, first + b"\n" + rest, time.monotonic() + self._wait_s, source)
        # Its address goes with it: the driver counts each stranger's
        # handshakes by where they came from, as it does on a direct link.
        self._tell(messages.dial(link_id, source))
        return True

    def _from_driver(self, conn: socket.socket, kind: str, msg: dict[str, object],
                     rest: bytes) -> tuple[Frames | None, bytes] | None:
        """None unless a driver's connection proves the relay's key: a pair
        over its one-time id, the control connection over a fresh challenge
        (then its sealed frames, and what it sent past its proof)."""
        if kind == "relay-pair":
            return (None, rest) if proven(relay_proof(self._secret, kind, str(msg.get("id", ""))),
                                          msg.get("proof")) else None
        driver_nonce = msg.get("nonce")
        if not isinstance(driver_nonce, str) or not 16 <= len(driver_nonce) <= 128:
            return None
        nonce = fresh_nonce()
        try:
            conn.sendall(encode(messages.challenge(nonce)))
        except OSError:
            return None
        said = _first_line(conn, self._wait_s, rest)
        answer = parse(said[0]) if said is not None else None
        if not (answer is not None and proven(relay_proof(self._secret, kind, nonce), answer.get("proof"))):
            return None
        assert said is not None
        return Frames.after_handshake(self._secret, driver_nonce, nonce, driver=False), said[1]

    def _set_control(self, conn: socket.socket, frames: Frames | None, rest: bytes) -> None:
        with self._lock:
            old, self._control = self._control, conn
            self._control_frames = frames
            waiting = list(self._waiting)
        if old is not None:
            _reset(old)
        log.info("relay: the driver is connected")
        for link_id in waiting:
            self._tell(messages.dial(link_id))
        threading.Thread(target=self._drain_control, args=(conn, frames, rest), daemon=True,
                         name="raydist-relay-ctl").start()

    def _drain_control(self, conn: socket.socket, frames: Frames | None, rest: bytes) -> None:
        """Read the driver's pings; forget the control connection when it
        ends, or when a line on it is not the driver's next sealed frame."""
        reader = LineReader(conn, idle_s=IDLE_S, initial=rest, frames=frames)
        try:
            while not self._closed.is_set():
                reader.read()
        except LinkBroken:
            pass
        with self._lock:
            if self._control is conn:
                self._control = None
        conn.close()

    def _pair(self, link_id: str, conn: socket.socket) -> None:
        with self._lock:
            waiting = self._waiting.pop(link_id, None)
        if waiting is not None:
            self._places.give_back(waiting[3])
        if waiting is None:
            conn.close()  # its supervisor gave up waiting, or the id is not ours
            return
        supervisor, first, _, _ = waiting
        joint = _Joint(supervisor, conn, lambda: self._forget(joint))
        with self._lock:
            closed = self._closed.is_set()
            if not closed:
                self._joined.add(joint)
        if closed:
            _reset(supervisor)
            _reset(conn)
            return
        joint.start(first)

    def _forget(self, joint: _Joint) -> None:
        with self._lock:
            self._joined.discard(joint)

    def _tell(self, message: dict[str, object]) -> None:
        with self._lock:
            control, frames = self._control, self._control_frames
        if control is None or frames is None:
            return  # said again when the driver connects
        try:
            with self._control_lock:  # frames are counted: sealed in the order they go out
                control.sendall(frames.seal(encode(message)))
        except OSError:
            _reset(control)

    def _heartbeat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            self._tell(messages.ping())

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            gone = [k for k, (_, _, deadline, _) in self._waiting.items() if deadline <= now]
            expired = [self._waiting.pop(k) for k in gone]
        for sock, _, _, source in expired:
            self._places.give_back(source)
            sock.close()  # the supervisor reads a silent close and tries again


class RelayDialer:
    """The driver's end: keeps a control connection to the relay at
    ``address`` and hands each pair connection to ``adopt`` (the channel).
    Reconnects after a break until :meth:`close`."""

    def __init__(self, address: tuple[str, int], secret: str, adopt: Callable[[socket.socket, str], None]) -> None:
        self.address = address
        self._secret = secret
        self._adopt = adopt
        self._closed = threading.Event()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"raydist-dialer-{address[1]}")
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(5)

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                sock = socket.create_connection(self.address, timeout=HANDSHAKE_S)
            except OSError as exc:
                log.debug("relay %s: %s", self.address, exc)
                self._closed.wait(0.5)
                continue
            with self._lock:
                self._sock = sock
            try:
                self._serve(sock)
            except (OSError, LinkBroken) as exc:
                log.debug("relay %s: control link ended: %s", self.address, exc)
            finally:
                with self._lock:
                    self._sock = None
                sock.close()
            self._closed.wait(0.2)

    def _serve(self, sock: socket.socket) -> None:
        enable_keepalive(sock)
        # Only this thread writes here (each pair is a connection of its own).
        mine = fresh_nonce()
        sock.sendall(encode(messages.relay_control(mine)))
        reader = LineReader(sock, idle_s=HANDSHAKE_S)
        challenge = reader.read()
        if messages.kind(challenge) != "challenge":
            raise LinkBroken("the relay sent no challenge")
        theirs = str(challenge.get("nonce", ""))
        sock.sendall(encode(messages.proof(relay_proof(self._secret, "relay-control", theirs))))
        # From here on both ways are sealed frames: a line that is not the
        # relay's next frame (injected, changed, replayed) ends the connection.
        frames = Frames.after_handshake(self._secret, mine, theirs, driver=True)
        reader = LineReader(sock, idle_s=IDLE_S, initial=reader.rest(), frames=frames)
        last_ping = time.monotonic()
        while not self._closed.is_set():
            msg = reader.read()
            if messages.kind(msg) == "dial":
                threading.Thread(target=self._dial, args=(str(msg.get("id", "")), str(msg.get("source", ""))[:64]),
                                 daemon=True, name="raydist-dialer-pair").start()
            if time.monotonic() - last_ping >= HEARTBEAT_S:
                sock.sendall(frames.seal(encode(messages.ping())))
                last_ping = time.monotonic()

    def _dial(self, link_id: str, source: str = "") -> None:
        try:
            conn = socket.create_connection(self.address, timeout=HANDSHAKE_S)
        except OSError as exc:
            log.debug("relay %s: pair %s: %s", self.address, link_id, exc)
            return  # the supervisor's wait runs out, and it tries again
        try:
            proof = relay_proof(self._secret, "relay-pair", link_id)
            conn.sendall(encode(messages.relay_pair(link_id, proof)))
        except OSError:
            conn.close()
            return
        self._adopt(conn, f"relay:{source}")
