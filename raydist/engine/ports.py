"""Free TCP ports that cannot clash with Ray's own worker port range."""

from __future__ import annotations

import socket

from raydist.engine.sizing import RAY_WORKER_PORTS

__all__ = ["free_port", "preferred_or_free_port", "wait_for_port"]


def free_port(host: str = "127.0.0.1", avoid: set[int] | None = None) -> int:
    """A port that is free now on ``host`` and outside Ray's worker ports.

    The kernel picks it (bind to port 0), so concurrent callers in different
    processes get different ports; ``avoid`` keeps one caller from getting the
    same port twice before it binds them.
    """
    avoid = avoid if avoid is not None else set()  # the caller's set, even empty: it learns each port
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in RAY_WORKER_PORTS and port not in avoid:
            avoid.add(port)
            return port
    raise OSError(f"no free port outside {RAY_WORKER_PORTS} on {host}")


def preferred_or_free_port(host: str, preferred: int | None, avoid: set[int] | None = None) -> int:
    """``preferred`` when it is free now on ``host`` (a fixed port a Service or
    firewall rule names), else any free port as :func:`free_port` picks it."""
    avoid = avoid if avoid is not None else set()
    if preferred and preferred not in avoid:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, preferred))
        except OSError:
            pass
        else:
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
