"""The process limits a driver of many nodes needs raised.

Each node costs the driver an open socket (its link), and a cluster of a
thousand nodes, with Spark's and Ray's own files, passes the usual soft limit
of 1,024 open files. The soft limit is raised to the hard one once per
process; what the hard limit allows is the kernel's (and the admin's) to say.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["raise_open_files"]

log = logging.getLogger(__name__)

_done = threading.Event()


def raise_open_files() -> int:
    """Raise this process's soft open-file limit to its hard limit (once);
    returns the soft limit now in force (-1 where the platform has none)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20  # the kernel's usual nr_open
    if _done.is_set() or soft >= hard:
        _done.set()
        return soft
    _done.set()
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.info("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft
    log.debug("open-file limit raised from %d to %d", soft, hard)
    return hard
