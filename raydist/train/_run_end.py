"""How the tasks of a run in Spark's tasks agree that it has ended.

Each task must learn at once when a rank of another task fails: its own
ranks would wait for the dead one in a collective for ever. Spark's barrier
could carry that (``BarrierTaskContext.allGather`` every so often), but each
such round costs a whole second or more: Spark's ``runBarrier`` looks at its
reply once a second (``Thread.sleep(1000)`` between looks, Spark 4.3), so a
run that agreed by rounds waited 1-2 s after its last rank ended.

Instead task 0 listens (:class:`EndListener`, one thread), and every task,
task 0 included, dials it once (:class:`EndLink`) with the run's key and
says how its ranks ended. The first failure (or a task that hangs up, or
never checks in) is told to every task at once; a task whose ranks all
succeeded leaves as soon as it has said so. Task 0 leaves once every task
has spoken, so the listener lives as long as the run.
"""

from __future__ import annotations

import contextlib
import hmac
import select
import socket
import threading
import time

__all__ = ["CHECK_IN_S", "EndLink", "EndListener"]

#: How long the listener waits for every task to dial it; a task that has
#: not by then counts as failed (its ranks never started, or cannot say).
CHECK_IN_S = 60.0
_DONE, _FAILED, _STOP = b"done\n", b"failed\n", b"stop\n"


class EndListener:
    """In task 0: hears how each of ``tasks`` tasks' ranks ended, and tells
    every task to stop its ranks once one failed."""

    def __init__(self, host: str, key: str, tasks: int) -> None:
        self._key = key.encode()
        self._tasks = tasks
        self._server = socket.create_server((host, 0))
        self.port: int = self._server.getsockname()[1]
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="raydist-run-end")
        self._thread.start()

    def _serve(self) -> None:
        links: dict[socket.socket, bytearray] = {}  # checked-in or not yet
        who: dict[socket.socket, int] = {}  # a link's task, once it checked in
        spoke: set[int] = set()
        failed = False
        told: set[socket.socket] = set()
        deadline = time.monotonic() + CHECK_IN_S
        try:
            while len(spoke) < self._tasks and not self._closing.is_set():
                if time.monotonic() > deadline and len(who) < self._tasks:
                    failed = True  # a task never checked in: the run cannot end well
                    spoke.update(t for t in range(self._tasks) if t not in who.values())
                for link in [link for link in who if failed and link not in told]:
                    told.add(link)  # a task that checks in late is told too
                    with contextlib.suppress(OSError):
                        link.sendall(_STOP)
                ready, _, _ = select.select([self._server, *links], [], [], 0.5)
                for sock in ready:
                    if sock is self._server:
                        link, _ = self._server.accept()
                        links[link] = bytearray()
                        continue
                    data = self._recv(sock)
                    if data is None:  # hung up
                        del links[sock]
                        told.discard(sock)
                        if sock in who:
                            task = who.pop(sock)
                            if task not in spoke:
                                spoke.add(task)
                                failed = True
                        sock.close()
                        continue
                    links[sock] += data
                    failed |= self._heard(sock, links[sock], who, spoke)
        finally:
            for link in links:
                link.close()

    @staticmethod
    def _recv(sock: socket.socket) -> bytes | None:
        try:
            data = sock.recv(4096)
        except OSError:
            return None
        return data or None

    def _heard(self, sock: socket.socket, buf: bytearray, who: dict[socket.socket, int], spoke: set[int]) -> bool:
        """Take the whole lines in ``buf``; whether one said a rank failed."""
        failed = False
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            if sock not in who:  # its first line: the key and its task
                key, _, task = line.partition(b" ")
                if not hmac.compare_digest(key, self._key) or not task.isdigit():
                    buf.clear()  # not one of this run's tasks: ignored
                    return False
                who[sock] = int(task)
                continue
            if who[sock] not in spoke:
                spoke.add(who[sock])
                failed |= line + b"\n" != _DONE
        return failed

    def close(self, wait: bool = True) -> None:
        """Once every task has spoken (``wait``), or at once."""
        if not wait:
            self._closing.set()
        self._thread.join()
        self._server.close()


class EndLink:
    """In every task: its line to task 0's :class:`EndListener`."""

    def __init__(self, host: str, port: int, key: str, task: int, timeout_s: float = 30.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._sock.settimeout(None)
        self._sock.sendall(f"{key} {task}\n".encode())
        self.stopped = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> None:
        """After select said it is readable: a stop, or task 0 gone (both stop this task's ranks)."""
        try:
            data = self._sock.recv(64)
        except OSError:
            data = b""
        if not data or _STOP in data:
            self.stopped = True

    def say(self, ok: bool) -> None:
        """How this task's ranks ended."""
        with contextlib.suppress(OSError):
            self._sock.sendall(_DONE if ok else _FAILED)

    def close(self) -> None:
        self._sock.close()
