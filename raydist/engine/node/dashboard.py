"""Ray's dashboard on a running head, started and stopped on demand.

A head started without the dashboard (``--include-dashboard=false``, what
raydist's clusters do unless asked: it starts about 2 s sooner) still runs
Ray's dashboard process, with one module and no web frontend. Turning the
dashboard on later means replacing that process with one that loads every
module on the same host and port, with the same environment and session;
turning it off puts the small one back. ``ray start --block`` counts a
dashboard that ended on SIGTERM as an expected exit and keeps its node, and
the supervisor, a subreaper, ends the replacement with the node.

Runs in the head's supervisor, which owns the node's processes.
"""

from __future__ import annotations

import subprocess
import time

import psutil

from raydist.engine.nodelogs import last_words
from raydist.engine.ports import wait_for_port

__all__ = ["DASHBOARD_START_S", "switch"]

#: How long a dashboard may take to answer on its port (it imports aiohttp,
#: every module, and asks the GCS for the cluster's state).
DASHBOARD_START_S = 60.0
#: What Ray's ``start_api_server`` adds for a head without the dashboard.
_SMALL = ("--modules-to-load=UsageStatsHead", "--disable-frontend")


def _find() -> psutil.Process | None:
    """This node's Ray dashboard process, among this process's descendants."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(arg.endswith("dashboard/dashboard.py") for arg in proc.cmdline()):
                return proc
        except psutil.Error:
            continue
    return None


def _option(argv: list[str], name: str) -> str:
    prefix = f"--{name}="
    return next((arg[len(prefix):] for arg in argv if arg.startswith(prefix)), "")


def switch(*, full: bool, temp_dir: str = "") -> str:
    """Run this node's Ray dashboard with every module and its web frontend
    (``full``) or only what a head without one runs; returns its URL ("" for
    the small one, which serves no HTTP).
    Nothing is restarted when it already runs as asked. RuntimeError, with
    what the dashboard said, when it cannot be found or does not start."""
    old = _find()
    if old is None:
        raise RuntimeError("this node runs no Ray dashboard process (is it the head?)")
    argv = old.cmdline()
    host, port = _option(argv, "host"), _option(argv, "port")
    url = f"http://{host}:{port}"
    if full == (not any(arg in _SMALL for arg in argv)):
        return url if full else ""
    env, cwd = old.environ(), old.cwd()
    new_argv = [arg for arg in argv if arg not in _SMALL] + ([] if full else list(_SMALL))
    old.terminate()  # Ray's dashboard exits 15 on SIGTERM: an exit `ray start --block` expects
    try:
        old.wait(timeout=10)
    except psutil.TimeoutExpired:
        old.kill()
        old.wait(timeout=5)
    proc = subprocess.Popen(new_argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    if not full:  # the small one serves no HTTP: it is up when it has not failed at once
        time.sleep(1.0)
        if proc.poll() is not None:
            raise RuntimeError(f"Ray's dashboard (without its modules) exited with code {proc.returncode}: "
                               + " | ".join(last_words(temp_dir, "dashboard")))
        return ""
    deadline = time.monotonic() + DASHBOARD_START_S
    while not wait_for_port(host, int(port), min(deadline, time.monotonic() + 1.0)):
        if proc.poll() is not None or time.monotonic() >= deadline:
            said = " | ".join(last_words(temp_dir, "dashboard")) if temp_dir else ""
            if proc.poll() is None:
                proc.kill()
            raise RuntimeError(f"Ray's dashboard did not answer on {host}:{port} within {DASHBOARD_START_S:g} s"
                               + (f": {said}" if said else ""))
    return url
