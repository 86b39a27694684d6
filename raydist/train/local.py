"""Training processes on this machine, forked from one warm process.

Spark's distributors run ``local_mode=True`` on the driver: torchrun starts
``num_processes`` new Python processes there, and each imports torch before
the user's code runs. :class:`LocalRun` keeps one helper process (the
*forker*) that has imported torch already; each run forks one child per
rank from it, with torchrun's environment and the driver's current
environment, working directory and ``sys.path``. A child sees nothing an
earlier run left behind, as a new process would, and the function is
unpickled in the child, so edits to the user's modules between runs are
seen. The forker ends after ``keep_warm_s`` without a run, when the driver
ends (its stdin closes, and the kernel kills it with its parent), or at
:meth:`LocalRun.close`.

No Ray here: a local run needs no cluster.
"""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any

from raydist.errors import ClusterFailedError

__all__ = ["LocalRun"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!Q")


def _send(stream: IO[bytes], data: bytes) -> None:
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _recv(stream: IO[bytes]) -> bytes | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    data = stream.read(size)
    return data if len(data) == size else None


class LocalRun:
    """Runs jobs as ``world`` local processes, one run at a time.

    ``run(job, world)`` returns rank 0's value; the first rank's error is
    raised here with the rank and the child's traceback as a note, and the
    other ranks are killed. ``preload`` names modules the forker imports
    before the first run.
    """

    def __init__(self, *, keep_warm_s: float, preload: tuple[str, ...] = ("torch",)) -> None:
        self.keep_warm_s = keep_warm_s
        self.preload = preload
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies: IO[bytes] | None = None
        self._pump: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _start(self) -> None:
        read_fd, write_fd = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "raydist.train.local", str(write_fd), str(self.keep_warm_s), *self.preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            close_fds=True,
        )
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "rb")
        # The children's output goes to this process's sys.stdout (a notebook's
        # cell output too), as Spark's local mode streams torchrun's output.
        self._pump = threading.Thread(target=_copy_lines, args=(self._proc.stdout,), daemon=True,
                                      name="raydist-local-output")
        self._pump.start()

    def run(self, job: Callable[[], Any], world: int, env: Mapping[str, str] | None = None) -> Any:
        """``job()`` in ``world`` processes, each with this process's
        environment plus ``env``; rank 0's value."""
        from pyspark import cloudpickle

        from raydist.train._fork import rank0_or_raise

        request = cloudpickle.dumps(
            {"job": cloudpickle.dumps(job), "world": world, "env": {**os.environ, **(env or {})},
             "cwd": os.getcwd(), "sys_path": list(sys.path)}
        )
        with self._lock:
            reply = self._exchange(request)
            if reply is None and self._ended_idle():
                # It ended for idleness just as this run came: start another.
                reply = self._exchange(request)
            if reply is None:
                code = self._proc.wait() if self._proc is not None else None
                self.close()
                raise ClusterFailedError(f"the local training processes' parent ended (exit code {code})")
        return rank0_or_raise(cloudpickle.loads(reply), cloudpickle)

    def _exchange(self, request: bytes) -> bytes | None:
        """Send one run to the forker (started if needed); its reply, or None
        when the forker ended first."""
        if not self.alive:
            self.close()
            self._start()
        assert self._proc is not None and self._proc.stdin is not None and self._replies is not None
        try:
            _send(self._proc.stdin, request)
            return _recv(self._replies)
        except BrokenPipeError:
            return None
        except BaseException:
            self.close()  # an interrupted run: its children die with the forker
            raise

    def _ended_idle(self) -> bool:
        """Whether the forker ended by itself after ``keep_warm_s`` idle
        (exit code 0), having taken no run."""
        if self._proc is None:
            return False
        code = self._proc.wait()
        if code == 0:
            self.close()
        return code == 0

    def close(self) -> None:
        """End the forker and its children now."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if self._replies is not None:
            self._replies.close()
            self._replies = None
        if self._pump is not None:
            self._pump.join(5)
            self._pump = None


def _copy_lines(stream: IO[bytes] | None) -> None:
    if stream is None:
        return
    try:
        for line in iter(stream.readline, b""):
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()
    except (OSError, ValueError):  # closed under us at close()
        pass


# --------------------------------------------------------------- the forker


def _child_job(payload: bytes, env: dict[str, str], pickler: Any) -> Callable[[], Any]:
    def run() -> Any:
        os.environ.clear()
        os.environ.update(env)
        return pickler.loads(payload)()

    return run


def _serve(reply_fd: int, keep_warm_s: float) -> None:
    import select

    from pyspark import cloudpickle

    from raydist.engine.ports import free_port
    from raydist.train._fork import run_ranks

    stdin = sys.stdin.buffer
    first = True
    with os.fdopen(reply_fd, "wb") as replies:
        while True:
            # The first run is on its way; after a run, wait keep_warm_s.
            ready, _, _ = select.select([stdin], [], [], None if first else keep_warm_s)
            first = False
            if not ready:
                return  # idle for keep_warm_s: give the memory back
            data = _recv(stdin)
            if data is None:
                return  # the driver is gone or closed us
            request = cloudpickle.loads(data)
            os.chdir(request["cwd"])
            sys.path[:] = request["sys_path"]
            world = request["world"]
            common = {**request["env"], "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                      "NODE_RANK": "0", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": str(free_port("127.0.0.1"))}
            jobs = [
                _child_job(request["job"], {**common, "RANK": str(rank), "LOCAL_RANK": str(rank)}, cloudpickle)
                for rank in range(world)
            ]
            _send(replies, cloudpickle.dumps(run_ranks(jobs, pickler=cloudpickle)))


def _main(argv: list[str]) -> None:
    from raydist.engine.node.reaper import die_with_parent

    die_with_parent(signal.SIGKILL)
    reply_fd, keep_warm_s, *preload = argv
    import importlib

    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _serve(int(reply_fd), float(keep_warm_s))


if __name__ == "__main__":
    _main(sys.argv[1:])
