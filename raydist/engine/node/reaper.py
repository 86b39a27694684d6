"""What keeps a node's processes from outliving it, for the supervisor.

The supervisor is a child subreaper, so every process its node starts stays
its descendant, and it ends them all (:func:`kill_descendants`). For the case
where the supervisor itself is SIGKILLed: ``ray start`` dies with it
(:func:`die_with_parent`), and a forked sentinel (:func:`start_sentinel`) ends
whatever is left of its session. :func:`core_died` notices a node whose GCS
or raylet is gone while ``ray start`` still waits.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import time

import psutil

__all__ = ["KILL_GRACE_S", "become_subreaper", "core_died", "die_with_parent", "kill_descendants", "start_sentinel",
           "started_at", "watched_alive"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: How long Ray's processes get between SIGTERM and SIGKILL when a node stops.
KILL_GRACE_S = 1.5


def become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: children may escape on parent death
        pass


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when the process that
    forked or spawned it dies; the one way raydist ties a child's life to its
    parent's.

    In ``ray start``'s child (SIGTERM, the default): ``ray start --block``
    then stops its node as on a normal shutdown (the raylet leaves the GCS at
    once, so the cluster sees the node gone), and Ray's own processes
    fate-share with it; the sentinel kills what is left. A forked training
    rank takes SIGKILL (:mod:`raydist.train._fork`): it has nothing to hand
    over."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's own cleanup still ends the child
        pass


def start_sentinel(temp_dir: str) -> int:
    """Fork a watcher that outlives a SIGKILLed supervisor by a moment.

    The supervisor normally ends its tree itself; nothing of it runs after a
    SIGKILL, though, and a process Ray's own fate-sharing misses (one a task
    started and left behind) would live on. The sentinel holds the read end
    of a pipe only the supervisor can write to; when the supervisor exits
    for any reason the read returns. If the supervisor's session still has
    processes then, the supervisor did not clean up: the sentinel kills them
    all and removes the node's temp dir. Call before any thread starts;
    returns the pipe's write end, which must stay open.
    """
    read_end, write_end = os.pipe()  # not inherited by ray start (PEP 446)
    if os.fork() != 0:
        os.close(read_end)
        return write_end
    try:
        os.close(write_end)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # the supervisor's own teardown
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        while os.read(read_end, 1):
            pass
        _end_session(os.getsid(0), grace_s=KILL_GRACE_S * 2)
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
    finally:
        os._exit(0)


def _session(sid: int) -> list[psutil.Process]:
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _end_session(sid: int, grace_s: float) -> None:
    """Give ``ray start`` (SIGTERMed by its PDEATHSIG) ``grace_s`` to stop its
    node, then SIGKILL every process left in the session."""
    deadline = time.monotonic() + grace_s
    while _session(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    for _ in range(3):
        found = _session(sid)
        if not found:
            return
        _signal_each(found, kill=True)
        psutil.wait_procs(found, timeout=2)


#: The processes a Ray node is nothing without: one of them gone is the node gone,
#: even while ``ray start`` still waits for it (it may, for a minute, at start-up).
_CORE = ("gcs_server", "raylet")


def core_died(seen: dict[int, tuple[psutil.Process, str]]) -> str:
    """Track this node's core Ray processes in ``seen``; the name of one that
    was seen and has died since, else ""."""
    for pid, (proc, name) in list(seen.items()):
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            pass
        del seen[pid]
        return name
    try:
        for child in psutil.Process().children(recursive=True):
            if child.pid not in seen and child.name() in _CORE:
                seen[child.pid] = (child, child.name())
    except psutil.Error:
        pass
    return ""


def started_at(pid: int) -> float:
    """When process ``pid`` started, by a clock nothing sets: seconds since
    boot (Linux's ``/proc/PID/stat``), so ``(pid, started_at(pid))`` names one
    process for its whole life, in any process that reads it.

    Not psutil's ``create_time()``: that adds the boot time, which Linux
    gives in whole seconds and derives from the wall clock, so a clock step
    or NTP's slewing makes two readings of one live process differ by a
    second, and a watcher would take it for dead (psutil's own process
    identity uses the since-boot time for this reason). Where there is no
    ``/proc``, psutil's ``create_time()``. Raises psutil.NoSuchProcess for a
    process that is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    except OSError:
        return psutil.Process(pid).create_time()
    # Field 22, starttime in clock ticks; the fields after the command's ")"
    # start at field 3 (a command may hold spaces and parentheses).
    return int(stat.rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")


def watched_alive(pid: int, started: float) -> bool:
    """Whether the process ``(pid, started_at(pid))`` named still runs (not
    a zombie, not a new process given its pid)."""
    try:
        return started_at(pid) == started and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_each(procs: list[psutil.Process], *, kill: bool) -> None:
    """SIGKILL (or SIGTERM) each of ``procs``; one already gone is no error."""
    for proc in procs:
        try:
            proc.kill() if kill else proc.terminate()
        except psutil.Error:
            pass


def kill_descendants(grace_s: float = KILL_GRACE_S) -> int:
    """SIGTERM every descendant, SIGKILL what is left after ``grace_s``, reap
    them all; repeat for anything that appeared meanwhile. Returns how many
    processes were ended."""
    me = psutil.Process()
    ended = 0
    for _ in range(5):
        procs = me.children(recursive=True)
        if not procs:
            break
        _signal_each(procs, kill=False)
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        _signal_each(alive, kill=True)
        psutil.wait_procs(alive, timeout=5)
        ended += len(procs)
        grace_s = 0.5
    # Reap any zombie children left behind (we are their subreaper).
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return ended
