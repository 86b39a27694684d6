"""What a run's ranks print, on the driver's console while they run.

A run in Spark's tasks (:mod:`raydist.train.spark_tasks`) reads each rank's
stdout and stderr in its task. pyspark's distributors stream torchrun's
output to the driver as it comes, so a user watches a long run's progress;
a run that printed only at its end would look hung. Where the executors can
reach the driver (a classic session), the driver listens on a port of its
own for the run (:class:`OutputServer`), and each task dials it
(:class:`OutputSender`) and sends what its ranks print as they print it.
Where they cannot (a Spark Connect client, a refused dial), the task keeps
each rank's last output and it is printed when the run ends, as before.

Only the run's own tasks are heard: each connection must first send the
run's random key (it travels with the stage's closure), so nothing else on
the network writes onto the user's console.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from raydist.engine.threads import spawn

__all__ = ["OutputServer", "OutputSender", "Where", "streamed_output"]

#: (host, port, key) of a run's server, as its tasks dial it.
Where = tuple[str, int, bytes]

_FRAME = struct.Struct("!II")  # rank, length
_KEY_BYTES = 16
#: How long a task waits for the driver to take its connection or a chunk
#: before it stops streaming (its ranks' output then comes at the end).
SEND_TIMEOUT_S = 5.0
#: The longest a run's end waits for its tasks' last output (an interrupted
#: run's tasks may still be ending).
_DRAIN_S = 2.0


class OutputServer:
    """The driver's side: takes the run's tasks' connections and writes each
    rank's output to ``sys.stdout`` a whole line at a time (ranks' lines do
    not interleave mid-line)."""

    def __init__(self, host: str) -> None:
        self.key = secrets.token_bytes(_KEY_BYTES)
        self._sock = socket.create_server((host, 0))
        self.where: Where = (host, self._sock.getsockname()[1], self.key)
        self._lock = threading.Lock()
        self._partial: dict[int, bytes] = {}
        self._readers: list[threading.Thread] = []
        self._closed = False
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # close() wakes the accepting thread at once
        self._acceptor = spawn(self._accept, name="raydist-rank-output")

    def _accept(self) -> None:
        """Take connections until closing, then the ones still waiting in
        the backlog (a short run's tasks may have dialed just before)."""
        while True:
            stopping = self._stopping.is_set()
            ready, _, _ = select.select([self._sock] if stopping else [self._sock, self._wake_r], [], [],
                                        0 if stopping else None)
            if self._sock not in ready:
                if stopping:
                    return
                continue  # woken by close(): one last look at the backlog
            conn, _ = self._sock.accept()
            reader = spawn(self._read, conn, name="raydist-rank-output-reader")
            with self._lock:
                self._readers.append(reader)

    def _read(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(SEND_TIMEOUT_S)
            key = _recv_exact(conn, _KEY_BYTES)
            if key is None or not hmac.compare_digest(key, self.key):
                return
            conn.settimeout(None)
            while (head := _recv_exact(conn, _FRAME.size)) is not None:
                rank, size = _FRAME.unpack(head)
                data = _recv_exact(conn, size)
                if data is None:
                    return
                self._write(rank, data)

    def _write(self, rank: int, data: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            text = self._partial.pop(rank, b"") + data
            whole, _, rest = text.rpartition(b"\n")
            if rest:
                self._partial[rank] = rest
            if whole:
                _print(whole + b"\n")

    def close(self) -> None:
        """Stop listening; wait briefly for what is under way to be read,
        then print each rank's unfinished line."""
        self._stopping.set()
        os.write(self._wake_w, b"x")
        self._acceptor.join(timeout=_DRAIN_S)
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        with self._lock:
            readers = list(self._readers)
        deadline = time.monotonic() + _DRAIN_S
        for reader in readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._closed = True
            for rank in sorted(self._partial):
                _print(self._partial[rank] + b"\n")
            self._partial.clear()


class OutputSender:
    """A task's side: sends its ranks' output to the run's server; stops
    (``live`` False) at the first error, and the caller keeps the rest."""

    def __init__(self, where: Where) -> None:
        host, port, key = where
        self.live = False
        try:
            self._sock = socket.create_connection((host, port), timeout=SEND_TIMEOUT_S)
            self._sock.sendall(key)
            self.live = True
        except OSError:
            self._sock = None

    def send(self, rank: int, data: bytes) -> bool:
        """Whether ``data`` reached the driver's side."""
        if not self.live or self._sock is None:
            return False
        try:
            self._sock.sendall(_FRAME.pack(rank, len(data)) + data)
            return True
        except OSError:
            self.close()
            return False

    def close(self) -> None:
        self.live = False
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


@contextlib.contextmanager
def streamed_output(side: Any) -> Iterator[Where | None]:
    """For one run on ``side``: where its tasks send their ranks' output
    (None: they keep it for the end, on a session whose executors cannot
    dial this process)."""
    if side.kind != "classic":
        yield None
        return
    from raydist.engine.node.launch import route_ip

    try:
        server = OutputServer(route_ip(side.driver_host()))
    except OSError:
        yield None
        return
    try:
        yield server.where
    finally:
        server.close()


def _recv_exact(conn: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        try:
            chunk = conn.recv(left)
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _print(data: bytes) -> None:
    out = sys.stdout  # looked up each time: a notebook or a test may have replaced it
    out.write(data.decode(errors="replace"))
    out.flush()
