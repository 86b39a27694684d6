"""Run one job in a child forked from a warm worker process.

The child starts with everything the worker imported (torch, the job's
modules) and nothing a previous job left behind, as a fresh process would.
It ends with ``os._exit``: no interpreter teardown. The child dies with the
worker that forked it.

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
from collections.abc import Callable
from typing import Any

#: Outcome kinds of :func:`run_forked`.
OK, ERROR, LOST, CANCELLED = "ok", "error", "lost", "cancelled"

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the worker's own cleanup still kills the child
        pass


def run_forked(
    job: Callable[[], Any],
    env: dict[str, str],
    *,
    still_wanted: Callable[[], bool],
    poll_s: float = 1.0,
) -> tuple[str, Any]:
    """Run ``job()`` in a forked child with ``env`` added to its environment.

    Returns (OK, pickled return value), (ERROR, pickled (error, traceback
    text)), (LOST, how the child ended) when it died without an outcome, or
    (CANCELLED, None) when ``still_wanted()`` turned false while it ran (the
    child is killed then).
    """
    from ray import cloudpickle

    before = set(sys.modules)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(read_fd)
            _die_with_parent()
            keep_destroyed_groups()
            os.environ.update(env)
            try:
                outcome: tuple[str, bytes] = (OK, cloudpickle.dumps(job()))
            except BaseException as e:  # noqa: BLE001 - the job's error goes back to the parent
                outcome = (ERROR, pickle_error(e))
            data = cloudpickle.dumps((outcome, sorted(set(sys.modules) - before)))
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([read_fd], [], [], poll_s)
            if not ready:
                if not still_wanted():
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return (CANCELLED, None)
                continue
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        if os.WIFSIGNALED(status):
            how = f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            how = f"exited with code {os.waitstatus_to_exitcode(status)}"
        return (LOST, how)
    (kind, payload), imported = cloudpickle.loads(b"".join(chunks))
    _learn_imports(imported)
    return (kind, payload)


def _learn_imports(names: list[str]) -> None:
    """Import here what the child imported lazily (torch loads ``torch._dynamo``
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


_kept_groups: list[Any] = []


def keep_destroyed_groups() -> None:
    """Make ``destroy_process_group`` keep the groups it destroys referenced
    until this process ends (see the module's docstring). For processes that
    end after the job: a forked child, or a Ray Train worker of a fresh run."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    c10d = dist.distributed_c10d
    original = c10d.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        world = getattr(c10d, "_world", None)
        if group is None or group is dist.group.WORLD:
            _kept_groups.extend(list(getattr(world, "pg_map", {}) or []) or [dist.group.WORLD])
        else:
            _kept_groups.append(group)
        original(group)

    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def pickle_error(error: BaseException) -> bytes:
    """The error and its traceback text, pickled; an error that cannot be
    pickled travels as a RuntimeError with its type and message."""
    import traceback

    from ray import cloudpickle

    text = "".join(traceback.format_exception(error))
    try:
        return cloudpickle.dumps((error, text))
    except Exception:  # noqa: BLE001
        return cloudpickle.dumps((RuntimeError(f"{type(error).__name__}: {error}"), text))
