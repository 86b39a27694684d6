"""Where raydist keeps its state: ``RAYDIST_HOME`` (default ``~/.raydist``).

Read at call time, never at import time, so tests and servers can point
different processes at different homes.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["home", "private_file", "hold_home"]


def home() -> Path:
    """The raydist home directory, created with mode 0700 if missing."""
    path = Path(os.environ.get("RAYDIST_HOME") or Path.home() / ".raydist").expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def private_file(path: Path, content: str) -> None:
    """Write ``content`` to ``path`` readable by this user only (0600),
    without a window in which the file exists with wider permissions."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(content)
    os.replace(tmp, path)


def hold_home(path: Path) -> int:
    """Take the exclusive lock that makes one control plane the owner of the
    home ``path``; returns the lock's file descriptor (the lock lasts as long
    as it is open, and the kernel drops it when the process dies). Raises
    HomeInUseError, naming the other server, when another process holds it."""
    import fcntl

    from raydist.errors import HomeInUseError

    fd = os.open(path / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        other = ""
        try:
            import json

            info = json.loads((path / "server.json").read_text())
            other = f" (pid {info.get('pid')}, serving on {info.get('address')})"
        except (OSError, ValueError):
            pass
        raise HomeInUseError(str(path), other) from None
    return fd
