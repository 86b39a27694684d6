"""Where raydist keeps its state: ``RAYDIST_HOME`` (default ``~/.raydist``).

Read at call time, never at import time, so tests and servers can point
different processes at different homes.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["home", "home_served", "narrow", "open_private_log", "private_dir", "private_file", "read_private",
           "hold_home"]

log = logging.getLogger(__name__)


def home() -> Path:
    """The raydist home directory, created with mode 0700 if missing; one of
    this user's that others could enter (it holds tokens and the state
    database) is narrowed to 0700, with a warning naming it."""
    path = Path(os.environ.get("RAYDIST_HOME") or Path.home() / ".raydist").expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    narrow(path, 0o700)
    return path


def narrow(path: Path, mode: int) -> None:
    """Take from ``path`` (this user's) any permission beyond ``mode`` for
    the group and others, with a warning naming it; another user's is left."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & (stat.S_IRWXG | stat.S_IRWXO) & ~mode:
        log.warning("%s was open to others (mode %o); narrowed it to %o", path, stat.S_IMODE(st.st_mode), mode)
        os.chmod(path, mode)


def private_dir(path: str | Path) -> None:
    """Make ``path`` a directory of this user's only (0700), or accept one
    that is already exactly that. In a shared directory such as /tmp, a
    name another user made first (a directory of theirs, or a symlink to
    somewhere of ours) is refused with PermissionError naming the path and
    what is wrong, never written into."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} exists and is not a plain directory (a symlink?): remove it and start again")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to this user: remove it and start again")
    narrow(Path(path), 0o700)


def open_private_log(path: str | Path) -> Any:
    """Open ``path`` to append text, created 0600; a symlink there is
    refused (OSError), not followed to a file of someone else's choosing."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8")


def home_served(path: Path) -> bool:
    """Whether a control plane holds the home ``path`` now (its lock, which
    the kernel drops when that process dies: a pid in server.json may be
    stale, and name another process by now)."""
    import fcntl

    try:
        fd = os.open(path / "server.lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def logs_dir() -> Path:
    """``RAYDIST_HOME/logs``: what raydist keeps off the terminal (the driver
    JVM's console output of an embedded SparkSession), created if missing."""
    path = home() / "logs"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def verbose() -> bool:
    """``RAYDIST_VERBOSE=1``: Spark's and Ray's console output stays on the
    terminal instead of going to :func:`logs_dir`."""
    return os.environ.get("RAYDIST_VERBOSE", "") not in ("", "0", "false")


def private_file(path: Path, content: str) -> None:
    """Write ``content`` to ``path`` readable by this user only (0600),
    without a window in which the file exists with wider permissions."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(content)
    os.replace(tmp, path)


def read_private(path: Path) -> str | None:
    """The stripped content of a secret file, or None when it is missing or
    empty. A file that others can read (a volume's group ownership applied by
    Kubernetes' ``fsGroup``, a careless copy) is narrowed back to 0600 first,
    with a warning naming the file, never its content."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s was readable by others (mode %o); narrowed it to 0600", path, stat.S_IMODE(mode))
        os.chmod(path, 0o600)
    value = path.read_text().strip()
    return value or None


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
