"""Where the tasks of one barrier stage meet without a round of Spark's barrier: at task 0.

The tasks of a run in Spark's tasks (:mod:`raydist.train.spark_tasks`) meet
to begin and to end. Before any rank starts, they must share a few facts: rank 0's
port, the ports each task's ranks listen on where peers dial each other,
whether a task's input was refused. While the ranks run, each task must
learn at once when a rank of another task fails: its own ranks would wait
for the dead one in a collective for ever. Spark's barrier could carry both
(``BarrierTaskContext.allGather``), but each round costs a whole second or
more: Spark's ``runBarrier`` looks at its reply once a second
(``Thread.sleep(1000)`` between looks, Spark 4.3), so even the first round
alone made every run a second longer.

Instead task 0 chairs the run (:class:`Chair`, one thread) and every task,
task 0 included, takes a :class:`Seat`: it dials task 0 with the run's key
and says what it brings. Once every task has arrived, each hears what all
brought, in task order. Then each says how its ranks ended; the first
failure (a task that hangs up, or never arrives) is told to every task at
once, and a task whose ranks all succeeded leaves as soon as it has said so.
Task 0 leaves once every task has spoken, so the chair lives as long as the
run.

No task can be told task 0's port without a round of the barrier, so it is
a port they can all work out: the first free one of a short list drawn from
the run's key (:func:`meeting_ports`), which task 0 binds and the others try
in turn. A task knows it has found the chair when the chair proves it knows
the key; the chair hears only tasks that know it. When Spark retries a
stage, its tasks carry the same key, and the chair of the attempt it gave up
on may linger a moment (its Python worker is killed seconds later): a chair
stops listening once its meeting is whole, and never seats a task twice, so
the tasks of a later attempt pass it by for their own.

A Connect cluster's head task announces where it listens the same way
(:mod:`raydist.engine.spark.connect`): its herald, task 0, chairs a meeting of
two, and the head's task brings the announcement.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import random
import select
import socket
import threading
import time
from typing import Any

from raydist.engine.ports import AGREED_PORTS, listen_on_first_free

__all__ = ["MEET_S", "Chair", "Seat", "meeting_ports"]

#: How long the tasks of a run wait for each other to arrive. A task's input
#: is staged before it arrives (a large partition takes a while); a task that
#: died before arriving fails the whole barrier stage in Spark anyway.
MEET_S = 900.0
#: How many ports a run's key names for its chair.
CANDIDATES = 16
_DONE, _FAILED, _STOP = b"done\n", b"failed\n", b"stop\n"


def meeting_ports(key: str) -> list[int]:
    """The ports task 0 tries, in order, for a run with ``key``: the same
    list on every host, different for every run."""
    return random.Random(key).sample(AGREED_PORTS, CANDIDATES)


def _proof(key: bytes) -> bytes:
    return hmac.new(key, b"raydist chair", hashlib.sha256).hexdigest().encode()


class Chair:
    """In task 0: waits for ``tasks`` tasks to arrive, tells each what all
    brought, hears how each task's ranks ended, and tells every task to stop
    its ranks once one failed."""

    def __init__(self, host: str, key: str, tasks: int, ports: list[int], meet_s: float = MEET_S) -> None:
        self._key = key.encode()
        self._tasks = tasks
        self._meet_s = meet_s
        self._server = listen_on_first_free(host, ports)
        self.port: int = self._server.getsockname()[1]
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="raydist-chair")
        self._thread.start()

    def _serve(self) -> None:
        links: dict[socket.socket, bytearray] = {}  # arrived or not yet
        who: dict[socket.socket, int] = {}  # a link's task, once it arrived
        brought: dict[int, Any] = {}
        spoke: set[int] = set()
        met = failed = False
        listening = True
        told: set[socket.socket] = set()
        deadline = time.monotonic() + self._meet_s
        try:
            while len(spoke) < self._tasks and not self._closing.is_set():
                if time.monotonic() > deadline and len(brought) < self._tasks:
                    failed = True  # a task never arrived: the run cannot end well
                    spoke.update(t for t in range(self._tasks) if t not in brought)
                if not met and not failed and len(brought) == self._tasks:
                    met = True
                    listening = False  # no task arrives after the meeting: one that dials now is another attempt's
                    self._server.close()
                    everyone = b"met " + json.dumps([brought[t] for t in range(self._tasks)]).encode() + b"\n"
                    for link in who:
                        with contextlib.suppress(OSError):
                            link.sendall(everyone)
                for link in [link for link in who if failed and link not in told]:
                    told.add(link)  # a task that arrives late is told too
                    with contextlib.suppress(OSError):
                        link.sendall(_STOP)
                ready, _, _ = select.select([self._server, *links] if listening else [*links], [], [], 0.5)
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
                    failed |= self._heard(sock, links[sock], who, brought, spoke)
        finally:
            for link in links:
                link.close()

    @staticmethod
    def _recv(sock: socket.socket) -> bytes | None:
        try:
            data = sock.recv(65536)
        except OSError:
            return None
        return data or None

    def _heard(self, sock: socket.socket, buf: bytearray, who: dict[socket.socket, int],
               brought: dict[int, Any], spoke: set[int]) -> bool:
        """Take the whole lines in ``buf``; whether one said a rank failed."""
        failed = False
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            if sock not in who:  # its first line: the key, its task and what it brings
                key, _, arrival = line.partition(b" ")
                task, _, brings = arrival.partition(b" ")
                if (not hmac.compare_digest(key, self._key) or not task.isdigit() or int(task) >= self._tasks
                        or int(task) in brought):
                    buf.clear()  # not one of this run's tasks, or a task of a later attempt of its stage: ignored
                    return False
                try:
                    brought[int(task)] = json.loads(brings or b"null")
                except ValueError:
                    buf.clear()
                    return False
                who[sock] = int(task)
                with contextlib.suppress(OSError):
                    sock.sendall(b"here " + _proof(self._key) + b"\n")
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


class Seat:
    """In every task: its line to task 0's :class:`Chair`, taken with
    :meth:`join`; ``everyone`` is what every task brought, in task order."""

    def __init__(self, sock: socket.socket, everyone: list[Any], rest: bytes) -> None:
        self._sock = sock
        self.everyone = everyone
        self.stopped = _STOP in rest  # a stop that came with the meeting's last line

    @classmethod
    def join(cls, host: str, ports: list[int], key: str, task: int, brings: Any,
             within_s: float = MEET_S) -> Seat:
        """Find the chair on ``host`` (the first of ``ports`` where it proves
        it knows ``key``, tried until ``within_s``), say what this task
        brings, and wait for every other task to arrive.

        Raises ``ConnectionError`` when no chair is found in time, or the
        chair stops the run before it begins (a task never arrived, or left).
        """
        deadline = time.monotonic() + within_s
        pause = 0.02
        hello = f"{key} {task} {json.dumps(brings)}\n".encode()
        while True:
            for port in ports:
                found = _knock(host, port, hello, _proof(key.encode()))
                if found is not None:
                    sock, rest = found
                    return cls._met(sock, rest, deadline)
            if time.monotonic() > deadline:
                raise ConnectionError(f"no task 0 of this run answered at {host} on ports {ports} "
                                      f"within {within_s:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    @classmethod
    def _met(cls, sock: socket.socket, rest: bytes, deadline: float) -> Seat:
        sock.settimeout(max(deadline - time.monotonic(), 0) + 30)  # the chair says stop at its own deadline
        buf = bytearray(rest)
        try:
            while True:
                while b"\n" in buf:
                    line, _, tail = bytes(buf).partition(b"\n")
                    buf[:] = tail
                    if line.startswith(b"met "):
                        sock.settimeout(None)
                        return cls(sock, json.loads(line[4:]), bytes(buf))
                    if line + b"\n" == _STOP:
                        raise ConnectionError("task 0 stopped the run before it began: a task never arrived, "
                                              "or left before the others did")
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("task 0 hung up before every task arrived")
                buf += data
        except BaseException:
            sock.close()
            raise

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


def _knock(host: str, port: int, hello: bytes, proof: bytes) -> tuple[socket.socket, bytes] | None:
    """A line to the chair at ``host:port`` and what followed its proof;
    None when nothing there answers as this run's chair would."""
    try:
        sock = socket.create_connection((host, port), timeout=1.0)
    except OSError:
        return None
    try:
        sock.settimeout(2.0)
        sock.sendall(hello)
        buf = b""
        while b"\n" not in buf:
            data = sock.recv(4096)
            if not data:
                raise OSError("hung up")
            buf += data
        line, _, rest = buf.partition(b"\n")
        if hmac.compare_digest(line, b"here " + proof):
            return sock, rest
    except OSError:
        pass
    sock.close()
    return None
