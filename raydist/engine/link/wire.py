"""Framing of the driver <-> supervisor link, shared by both ends.

Messages are JSON objects, one per line, each at most :data:`MAX_LINE` bytes.
Both ends send something at least every :data:`HEARTBEAT_S` (a ``ping`` when
there is nothing else to say) and treat :data:`IDLE_S` of silence as a broken
link. A supervisor whose link breaks keeps its node for
:data:`RECONNECT_GRACE_S` while it reconnects; the driver waits as long before
it calls the node lost. These bounds are what make the link safe to expose on
a network: a peer that sends no line, an endless line or nothing at all costs
one bounded buffer for a bounded time.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

__all__ = [
    "HANDSHAKE_S",
    "HEAD_FROM_LINK",
    "HEARTBEAT_S",
    "IDLE_S",
    "MAX_LINE",
    "RECONNECT_GRACE_S",
    "LineReader",
    "LineTooLong",
    "Lines",
    "LinkBroken",
    "LinkClosed",
    "LinkRefused",
    "enable_keepalive",
    "encode",
    "parse",
    "read_line",
    "send",
]

#: A worker's ``--address`` when the head runs in a Spark task of its own: the
#: driver tells each supervisor the head's address over the link once it is up.
HEAD_FROM_LINK = "@head"
#: Longest message either end accepts, in bytes (a log line is cut to fit).
MAX_LINE = 64 * 1024
#: How long an unauthenticated connection may take to say hello.
HANDSHAKE_S = 5.0
#: How often each end speaks at least.
HEARTBEAT_S = 2.0
#: Silence after which a link counts as broken.
IDLE_S = 10.0
#: How long a supervisor keeps its node while it reconnects a broken link
#: (and the driver waits for it): a network blip shorter than this costs nothing.
RECONNECT_GRACE_S = 30.0


class LinkBroken(Exception):
    """The peer closed the link, fell silent for too long, or broke the framing."""


class LinkClosed(LinkBroken):
    """The peer closed the link."""


class LinkRefused(LinkClosed):
    """The driver said no to a hello (a wrong secret): retrying cannot help.

    Only an explicit ``refused`` answer means this. A connection that closes
    without one during a handshake may be the driver's handshake timer firing
    on a hello a network blip swallowed, and is worth another try.
    """


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def send(sock: socket.socket, lock: threading.Lock, message: dict[str, Any]) -> bool:
    """Write one message; False if the peer is gone."""
    data = encode(message)
    try:
        with lock:
            sock.sendall(data)
        return True
    except OSError:
        return False


def enable_keepalive(sock: socket.socket) -> None:
    """Let the kernel notice a dead peer on another host too (a backstop to
    the heartbeat when a send blocks)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


class LineTooLong(LinkBroken):
    """The peer sent more than the limit without a line's end."""


class Lines:
    """Whole lines out of what a peer sent, each at most ``limit`` bytes.

    The link's one framing reader: every end feeds it the bytes it read, its
    own way (a blocking read, a selector's callback), and takes lines out.
    Holds at most ``limit`` bytes of a line not yet ended, so a peer that
    never ends one costs a bounded buffer.
    """

    def __init__(self, initial: bytes = b"", *, limit: int = MAX_LINE) -> None:
        self._buf = bytearray(initial)
        self._limit = limit

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> bytes | None:
        """The next whole line (without its newline), or None until one has
        come. Raises LineTooLong past the limit."""
        end = self._buf.find(b"\n")
        if end > self._limit or (end < 0 and len(self._buf) > self._limit):
            raise LineTooLong(f"a line longer than {self._limit} bytes")
        if end < 0:
            return None
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        return line

    def rest(self) -> bytes:
        """What was read past the last line taken (for a reader that takes over)."""
        return bytes(self._buf)


def read_line(sock: socket.socket, deadline: float, *, limit: int, said: bytes = b"") -> tuple[bytes, bytes]:
    """The first whole line ``sock`` sends before ``deadline`` (monotonic),
    and what it sent past it; ``said``: bytes already read from it. For a new
    connection's first words: a deadline, not an idle timeout, so bytes that
    trickle in hold no place for long. Raises LineTooLong past ``limit``,
    TimeoutError at the deadline, LinkClosed when the peer closes first."""
    lines = Lines(said, limit=limit)
    while (line := lines.next()) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no whole line before the deadline")
        sock.settimeout(left)
        chunk = sock.recv(limit + 1)
        if not chunk:
            raise LinkClosed("closed before a whole line")
        lines.feed(chunk)
    return line, lines.rest()


def parse(line: bytes) -> dict[str, Any] | None:
    """A line as a message (a JSON object), or None for anything else
    (including JSON nested past Python's stack)."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


class LineReader:
    """Reads JSON messages off a socket with bounded line length and idle time.

    ``initial`` holds bytes already read past a previous line (the handshake).
    """

    def __init__(self, sock: socket.socket, *, idle_s: float = IDLE_S, initial: bytes = b"",
                 frames: Any = None, refusal_in_clear: bool = False) -> None:
        self._sock = sock
        self._lines = Lines(initial)
        self._idle_s = idle_s
        #: The connection's :class:`~raydist.engine.link.keys.Frames` once its
        #: handshake is over: every line must then be a sealed frame.
        self._frames = frames
        #: For the line right after the node's proof: the driver's refusal
        #: comes in clear (a node with a wrong key could not open it sealed).
        self._refusal_in_clear = refusal_in_clear

    def read(self) -> dict[str, Any]:
        """The next message. Raises LinkBroken on EOF, silence past the idle
        bound, a line longer than :data:`MAX_LINE`, or a line that is not a
        JSON object."""
        while (line := self._lines.next()) is None:
            self._sock.settimeout(self._idle_s)
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError as exc:
                raise LinkBroken(f"silent for {self._idle_s:g} s") from exc
            except OSError as exc:
                raise LinkBroken(str(exc)) from exc
            if not chunk:
                raise LinkClosed("closed by the peer")
            self._lines.feed(chunk)
        if self._frames is not None:
            if self._refusal_in_clear and line == b'{"type":"refused"}':
                return {"type": "refused"}
            self._refusal_in_clear = False
            try:
                line = self._frames.open(line)
            except ValueError as exc:  # BadFrame
                raise LinkBroken(str(exc)) from exc
        message = parse(line)
        if message is None:
            raise LinkBroken("a line that is not a JSON object")
        return message

    def rest(self) -> bytes:
        """What was read past the last message (for a reader that takes over)."""
        return self._lines.rest()
