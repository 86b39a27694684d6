"""Free TCP ports that cannot clash with Ray's worker ports or the kernel's
ephemeral ports.

A port picked now is bound later, by another process (a GCS, a raylet). The
kernel hands ports from its ephemeral range to every outgoing connection in
the meantime, so a port from that range can be taken before the node binds
it (a head's GCS then fails to start). Ports are picked between Ray's worker
range and the ephemeral range when that gap is wide enough, outside the
window Ray Client's proxy takes its servers' ports from.

Two nodes starting at once on one host (two clusters' heads in one control
plane, two supervisors on one executor host) each check that a port is free
before either binds it, so each could be handed the same one. Every port
handed out is written to a small ledger shared by this user's processes on the
host (:func:`_ledger`) and not handed again for :data:`LEDGER_S` seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from raydist.engine.sizing import RAY_WORKER_PORTS

#: Where Ray Client's proxy puts each client's own server (ray.util.client.server.proxier).
RAY_CLIENT_SERVER_PORTS = range(23000, 24000)
#: How long a port handed out is kept from every other caller on the host:
#: time enough for the node it was picked for to bind it.
LEDGER_S = 180.0

#: Ports that processes on different hosts can agree on without talking (a
#: run's tasks finding task 0's listener, :mod:`raydist.engine.spark.meeting`):
#: above Ray Client's window, below Linux's default ephemeral range.
AGREED_PORTS = range(RAY_CLIENT_SERVER_PORTS.stop, 32768)

__all__ = ["AGREED_PORTS", "free_port", "listen_on_first_free", "preferred_or_free_port", "wait_for_port",
           "resolve_host", "gcs_host"]


def free_port(host: str = "127.0.0.1", avoid: set[int] | None = None) -> int:
    """A port that is free now on ``host`` and outside Ray's worker ports.

    The kernel picks it (bind to port 0), so concurrent callers in different
    processes get different ports; ``avoid`` keeps one caller from getting the
    same port twice before it binds them.
    """
    avoid = avoid if avoid is not None else set()  # the caller's set, even empty: it learns each port
    with _ledger() as handed:
        port = _pick(host, avoid | handed.keys())
        handed[port] = time.time()
    avoid.add(port)
    return port


def listen_on_first_free(host: str, candidates: list[int]) -> socket.socket:
    """A socket listening on the first of ``candidates`` that is free on
    ``host`` and not handed out lately by :func:`free_port` (a node picked it
    and is about to bind it); it is written to the ledger in turn."""
    with _ledger() as handed:
        for port in candidates:
            if port in handed:
                continue
            try:
                server = socket.create_server((host, port))
            except OSError:
                continue  # taken, by anyone
            handed[port] = time.time()
            return server
    raise OSError(f"none of the ports {candidates} is free on {host}")


def _pick(host: str, avoid: set[int]) -> int:
    quiet = _quiet_ports()
    for _ in range(200 if quiet else 0):
        port = random.choice(quiet)
        if port not in avoid and _free(host, port):
            return port
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in RAY_WORKER_PORTS and port not in avoid:
            return port
    raise OSError(f"no free port outside {RAY_WORKER_PORTS} on {host}")


def _free(host: str, port: int) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, port))
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _ledger() -> Iterator[dict[int, float]]:
    """The ports this user's processes on this host handed out in the last
    :data:`LEDGER_S` seconds (port: when), held under an exclusive lock and
    written back as the caller leaves them. Without a writable temp dir:
    an empty one, and no lock (each process then only avoids its own)."""
    path = Path(tempfile.gettempdir()) / f"raydist-ports-{os.getuid()}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield {}
        return
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        since = time.time() - LEDGER_S
        handed: dict[int, float] = {}
        for line in f.read().splitlines():
            port, _, when = line.partition(" ")
            try:
                if float(when) > since:
                    handed[int(port)] = float(when)
            except ValueError:
                continue  # a torn or foreign line: forgotten
        yield handed
        f.seek(0)
        f.truncate()
        f.write("".join(f"{port} {when:.1f}\n" for port, when in handed.items() if when > since))


def _quiet_ports() -> range:
    """Ports above Ray's worker range and outside the kernel's ephemeral
    range (``ip_local_port_range``); empty when no gap of 1,000 is left."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return range(0)
    gaps = []
    for gap in (range(max(RAY_WORKER_PORTS.stop, 1024), low), range(max(high + 1, RAY_WORKER_PORTS.stop), 65536)):
        # Ray Client's proxy takes its per-client servers' ports from a fixed
        # window, first free first: a node port picked there races it.
        gaps += [range(gap.start, min(gap.stop, RAY_CLIENT_SERVER_PORTS.start)),
                 range(max(gap.start, RAY_CLIENT_SERVER_PORTS.stop), gap.stop)]
    best = max(gaps, key=len)
    return best if len(best) >= 1000 else range(0)


def preferred_or_free_port(host: str, preferred: int | None, avoid: set[int] | None = None) -> int:
    """``preferred`` when it is free now on ``host`` (a fixed port a Service or
    firewall rule names), else any free port as :func:`free_port` picks it."""
    avoid = avoid if avoid is not None else set()
    if preferred and preferred not in avoid and _free(host, preferred):
        avoid.add(preferred)
        return preferred
    return free_port(host, avoid)


def wait_for_port(host: str, port: int, deadline: float, poll_s: float = 0.05) -> bool:
    """True once ``host:port`` accepts a TCP connection, False at the deadline
    (a ``time.monotonic()`` value)."""
    import time

    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(poll_s)
    return False


def resolve_host(host: str) -> str:
    """``host``'s IPv4 address, or ``host`` itself when it does not resolve
    (so a name and an IP of the same machine compare equal)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


@functools.cache
def _this_host() -> str | None:
    """This machine's outward IPv4 address (the route's source address; no
    packet is sent), or None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # any routed address (TEST-NET-3)
            return str(s.getsockname()[0])
        except OSError:
            return None


def gcs_host(host: str) -> str:
    """``host`` as it appears in the GCS address of a Ray connection made to
    it: its IPv4 address, a loopback one replaced by this machine's own, as
    Ray does when it connects (``ray.init("127.0.0.1:6379")`` is connected to
    ``<this host>:6379``)."""
    ip = resolve_host(host)
    if ip.startswith("127."):
        return _this_host() or ip
    return ip
