"""Finding Ray processes on this host, for teardown checks and leak counts."""

from __future__ import annotations

import os
import time

import psutil

__all__ = ["ray_processes", "wait_no_ray_processes", "wait_processes_gone"]

#: Ray processes recognised by their command line or, for the ones Ray
#: renames (``ray::IDLE``, ``ray::DashboardAgent``), their title.
RAY_MARKERS = (
    "raylet",
    "gcs_server",
    "ray::",
    "raydist.engine.node.supervisor",
    "ray/dashboard",
    "ray.util.client.server",
    "ray/_private/log_monitor",
    "ray/autoscaler/_private/monitor",
)


#: When set, only processes started under the same value of this variable
#: count as this caller's: two runs on one host (two test suites at once) then
#: each check their own leftovers, not each other's. Children inherit it
#: through Spark's executors, Ray's raylets and every subprocess.
SCOPE_VARIABLE = "RAYDIST_PROCESS_SCOPE"


def _in_scope(proc: psutil.Process, scope: str | None) -> bool:
    if scope is None:
        return True
    try:
        return proc.environ().get(SCOPE_VARIABLE) == scope
    except psutil.Error:  # gone, or another user's
        return False


def ray_processes() -> list[psutil.Process]:
    """Live Ray processes on this host (zombies excluded), within this
    process's scope (``RAYDIST_PROCESS_SCOPE``) when it has one."""
    scope = os.environ.get(SCOPE_VARIABLE)
    found = []
    for proc in psutil.process_iter(["cmdline", "name", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(proc.info["cmdline"] or ()) or (proc.info["name"] or "")
        except psutil.Error:
            continue
        if any(m in text for m in RAY_MARKERS) and _in_scope(proc, scope):
            found.append(proc)
    return found


def wait_no_ray_processes(timeout: float = 20.0, ignore: set[int] | None = None) -> list[psutil.Process]:
    """Wait until no Ray process (outside ``ignore``) is alive; return what is left."""
    ignore = ignore or set()
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in ray_processes() if p.pid not in ignore]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def wait_processes_gone(marker: str, deadline: float) -> list[psutil.Process]:
    """Wait (until ``deadline``, a ``time.monotonic()`` value) until no process
    on this host has ``marker`` in its command line; return those left."""
    scope = os.environ.get(SCOPE_VARIABLE)
    while True:
        left = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            try:
                if proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                        marker in part for part in proc.info["cmdline"] or ()) and _in_scope(proc, scope):
                    left.append(proc)
            except psutil.Error:
                continue
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
