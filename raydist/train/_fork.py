"""Run a job in children forked from a warm process.

A child starts with everything its parent imported (torch, the job's
modules) and nothing a previous job left behind, as a fresh process would.
It ends with ``os._exit``: no interpreter teardown. The child dies with the
process that forked it.

Three parents use this: a warm Ray Train worker (one child per job, see
:mod:`raydist.train.warm_run`), the driver's local runner (one child per
rank, see :mod:`raydist.train.local`) and a Spark barrier task (one child
per rank of the task, see :mod:`raydist.train.spark_tasks`).

A torch deadlock the child steps around: a DDP model freed after
``destroy_process_group()`` (as when a training function returns) frees the
gloo process group inside the model's destructor, which joins gloo's threads
while holding the GIL, and a gloo thread still releasing its last work waits
for the GIL. It hangs a few runs in a hundred here, at the function's return,
under torchrun too. The child keeps every process group it destroys
referenced until ``os._exit``, so none is freed while the GIL is held.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from raydist.engine.node.reaper import die_with_parent

#: Outcome kinds of :func:`run_forked` and :func:`run_ranks`.
OK, ERROR, LOST, CANCELLED = "ok", "error", "lost", "cancelled"

@dataclass
class Child:
    """A forked child running one job; its outcome arrives on ``fd``."""

    pid: int
    fd: int
    chunks: list[bytes] = field(default_factory=list)
    done: bool = False

    def read(self) -> bool:
        """Read what is ready; True once the child closed its end."""
        chunk = os.read(self.fd, 1 << 20)
        if chunk:
            self.chunks.append(chunk)
            return False
        os.close(self.fd)
        self.done = True
        return True

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not self.done:
            os.close(self.fd)
            self.done = True
        os.waitpid(self.pid, 0)

    def outcome(self, pickler: Any = None) -> tuple[str, Any, list[str]]:
        """(kind, payload, modules the child imported) once it has ended."""
        _, status = os.waitpid(self.pid, 0)
        if not self.chunks:
            if os.WIFSIGNALED(status):
                how = f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
            else:
                how = f"exited with code {os.waitstatus_to_exitcode(status)}"
            return (LOST, how, [])
        (kind, payload), imported = (pickler or default_pickler()).loads(b"".join(self.chunks))
        return (kind, payload, imported)


def default_pickler() -> Any:
    """Ray's cloudpickle: what a Ray worker already has loaded."""
    from ray import cloudpickle

    return cloudpickle


def fork_job(
    job: Callable[[], Any], env: dict[str, str], *, before: set[str] | None = None, pickler: Any = None,
    output_fd: int | None = None,
) -> Child:
    """Fork a child that runs ``job()`` with ``env`` added to its environment
    and sends back its outcome: (OK, pickled value) or (ERROR, pickled
    (error, traceback text)), pickled with ``pickler`` (a cloudpickle module;
    Ray's by default). ``output_fd``: where the child's stdout and stderr go
    (the parent's by default)."""
    cloudpickle = pickler or default_pickler()

    known = set(sys.modules) if before is None else before
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(read_fd)
            if output_fd is not None:
                os.dup2(output_fd, 1)
                os.dup2(output_fd, 2)
            run_child(job, env, cloudpickle, write_fd, known)
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    return Child(pid, read_fd)


def run_child(job: Callable[[], Any], env: dict[str, str], cloudpickle: Any, write_fd: int, known: set[str]) -> None:
    """A child's life once it runs (forked, or a fresh interpreter): tied to
    its parent's, ``job()`` run with ``env`` added, its outcome and the
    modules it imported beyond ``known`` written to ``write_fd``."""
    die_with_parent(signal.SIGKILL)
    keep_destroyed_groups()
    os.environ.update(env)
    try:
        outcome: tuple[str, bytes] = (OK, cloudpickle.dumps(job()))
    except BaseException as e:  # noqa: BLE001 - the job's error goes back to the parent
        outcome = (ERROR, pickle_error(e, cloudpickle))
    data = cloudpickle.dumps((outcome, sorted(set(sys.modules) - known)))
    with os.fdopen(write_fd, "wb") as out:
        out.write(data)


#: Runtimes whose threads and locks a forked child inherits dead once this
#: process has imported them (TensorFlow's executor hangs in the child).
FORK_UNSAFE = ("tensorflow", "jax")


def fork_unsafe() -> list[str]:
    """What this process imported that makes forking it unsafe."""
    return [name for name in FORK_UNSAFE if name in sys.modules]


def spawn_job(payload: bytes, env: dict[str, str], *, pickler: str, output_fd: int | None = None) -> Child:
    """:func:`fork_job` in a fresh interpreter, for a parent that cannot be
    forked safely (:func:`fork_unsafe`): ``payload`` is the job pickled with
    the cloudpickle module named ``pickler``; the outcome comes back the
    same way. Slower to start (the job imports what it needs anew)."""
    import subprocess

    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raydist.train._fresh_rank", str(write_fd), pickler],
            stdin=subprocess.PIPE, stdout=output_fd, stderr=output_fd, pass_fds=(write_fd,),
            env={**os.environ, **env},
        )
    finally:
        os.close(write_fd)
    assert proc.stdin is not None
    with proc.stdin:
        proc.stdin.write(payload)
    return Child(proc.pid, read_fd)


def run_forked(
    job: Callable[[], Any],
    env: dict[str, str],
    *,
    still_wanted: Callable[[], bool],
    poll_s: float = 1.0,
) -> tuple[str, Any]:
    """Run ``job()`` in one forked child.

    Returns (OK, pickled return value), (ERROR, pickled (error, traceback
    text)), (LOST, how the child ended) when it died without an outcome, or
    (CANCELLED, None) when ``still_wanted()`` turned false while it ran (the
    child is killed then).
    """
    child = fork_job(job, env)
    while not child.done:
        ready, _, _ = select.select([child.fd], [], [], poll_s)
        if ready:
            child.read()
        elif not still_wanted():
            child.kill()
            return (CANCELLED, None)
    kind, payload, imported = child.outcome()
    learn_imports(imported)
    return (kind, payload)


class Ranks:
    """Children forked one per rank of a run (in rank order), and what each
    has said so far: what a parent that runs several ranks at once watches."""

    def __init__(self, children: Sequence[Child], pickler: Any = None) -> None:
        self.children = list(children)
        self._pickler = pickler
        self.outcomes: dict[int, tuple[str, Any]] = {}  # index -> (kind, payload)
        self.ended: dict[int, float] = {}  # index -> when its outcome came
        self.imported: set[str] = set()  # what the children imported that this process has not

    @property
    def done(self) -> bool:
        return all(c.done for c in self.children)

    @property
    def failed(self) -> bool:
        """Whether a rank failed (an error, or death without an outcome)."""
        return any(kind != OK for kind, _ in self.outcomes.values())

    def fds(self) -> list[int]:
        """The pipes of the children still running, to wait on."""
        return [c.fd for c in self.children if not c.done]

    def read(self, ready: Collection[int]) -> None:
        """Read the pipes among ``ready``; note each child that ended."""
        for index, child in enumerate(self.children):
            if child.fd in ready and not child.done and child.read():
                kind, payload, names = child.outcome(self._pickler)
                self.outcomes[index], self.ended[index] = (kind, payload), time.time()
                self.imported.update(names)

    def kill_rest(self) -> None:
        """End every child still running (they would wait for a failed one
        forever in a collective)."""
        for child in self.children:
            if not child.done:
                child.kill()

    def results(self) -> list[tuple[str, Any]]:
        """Each rank's (kind, payload); a killed rank says CANCELLED."""
        return [self.outcomes.get(index, (CANCELLED, None)) for index in range(len(self.children))]


def run_ranks(jobs: Sequence[Callable[[], Any]], *, pickler: Any = None) -> list[tuple[str, Any]]:
    """Run each job (one per rank) in a forked child of its own, all at once.
    The first child that fails (an error, or death without an outcome) has
    the others killed. Returns each rank's (kind, payload)."""
    before = set(sys.modules)
    ranks = Ranks([fork_job(job, {}, before=before, pickler=pickler) for job in jobs], pickler)
    try:
        while not ranks.done:
            ready, _, _ = select.select(ranks.fds(), [], [])
            ranks.read(ready)
            if ranks.failed:
                ranks.kill_rest()
    except BaseException:
        ranks.kill_rest()
        raise
    learn_imports(sorted(ranks.imported))
    return ranks.results()


def rank0_or_raise(outcomes: Sequence[tuple[str, Any]], pickler: Any, *, order: Sequence[int] = ()) -> Any:
    """Rank 0's value from each rank's (kind, payload), in rank order; or
    the first failure, raised: a rank's error as itself, with the rank and
    its traceback as a note, a rank that died without an outcome as a
    ClusterFailedError. ``order``: the ranks in the order they ended (the
    first failure is the cause; the ones after may be its effects)."""
    from raydist.errors import ClusterFailedError

    for rank in [*order, *range(len(outcomes))]:
        kind, payload = outcomes[rank]
        if kind == ERROR:
            error, text = pickler.loads(payload)
            error.add_note(f"raised by training process rank {rank}; its traceback:\n{text}")
            raise error
        if kind == LOST:
            raise ClusterFailedError(f"training process rank {rank} {payload}")
    kind, payload = outcomes[0]
    if kind != OK:
        raise ClusterFailedError("the training run was cancelled")
    return pickler.loads(payload)


def learn_imports(names: Sequence[str]) -> None:
    """Import here what a child imported lazily (torch loads ``torch._dynamo``
    inside ``DistributedDataParallel()``, seconds of work), so the next child
    starts with it. Only submodules of packages this process already has:
    nothing new runs here at top level."""
    import importlib

    for name in names:
        if name.partition(".")[0] in sys.modules and name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a module that will not import here stays lazy
                continue


def keep_destroyed_groups() -> None:
    """Make ``destroy_process_group`` keep the groups it destroys referenced
    until this process ends (see the module's docstring). For processes that
    end after the job: a forked child, or a Ray Train worker of a fresh run.
    The kept groups live on the replacement function itself, so they last
    exactly as long as this process uses it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    c10d = dist.distributed_c10d
    original = c10d.destroy_process_group
    if getattr(original, "kept_groups", None) is not None:
        return  # already in place (a child of a worker that set it up)
    kept: list[Any] = []

    def destroy_process_group(group: Any = None) -> None:
        world = getattr(c10d, "_world", None)
        if group is None or group is dist.group.WORLD:
            kept.extend(list(getattr(world, "pg_map", {}) or []) or [dist.group.WORLD])
        else:
            kept.append(group)
        original(group)

    destroy_process_group.kept_groups = kept  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def pickle_error(error: BaseException, pickler: Any = None) -> bytes:
    """The error and its traceback text, pickled; an error that cannot be
    pickled travels as a RuntimeError with its type and message."""
    import traceback

    cloudpickle = pickler or default_pickler()

    text = "".join(traceback.format_exception(error))
    try:
        return cloudpickle.dumps((error, text))
    except Exception:  # noqa: BLE001
        return cloudpickle.dumps((RuntimeError(f"{type(error).__name__}: {error}"), text))
