"""A node's Ray logs: read where they live, carried over its link, kept at down.

Ray writes a node's logs under its temp dir, on the executor's host, and
raydist removes that dir when the node ends. So the supervisor reads them
(:func:`read_logs`) when the driver asks over the link (``raydist logs NAME
--node N``), and the driver asks each node once more at ``down``, before the
dirs go, keeping what it gets under ``RAYDIST_HOME/logs/<cluster>/``
(:func:`keep`), the oldest runs dropped first past :data:`KEEP_BYTES`.

On the link the bytes travel base64-encoded in chunks well under the line
limit (:data:`raydist.engine.link.wire.MAX_LINE`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raydist.spec import NodeStatus

log = logging.getLogger(__name__)

__all__ = ["CHUNK", "KEEP_BYTES", "NODE_BYTES", "LogFile", "KeptFile", "check_grep", "collect",
           "grep_lines", "keep", "keep_run", "kept_runs", "last_words", "pick", "read_kept", "read_logs"]

#: Raw bytes per link message (base64 makes them 4/3 as many characters).
CHUNK = 24 * 1024
#: What one node sends at most, newest files first, unless asked for less.
NODE_BYTES = 1 << 20
#: What ``RAYDIST_HOME/logs`` keeps of collected runs; the oldest go first.
KEEP_BYTES = 200 << 20
#: What a teardown collects from all of a cluster's nodes together, and at
#: least from each (a thousand nodes then give 64 KiB each, not 1 GiB in all).
TEARDOWN_BYTES = 64 << 20
MIN_NODE_BYTES = 64 << 10
#: Nodes asked for their logs at once at teardown.
IN_FLIGHT = 32

LogFile = tuple[str, int, bytes]  # name, the file's size, the bytes sent (a tail, or from an offset)


def _files(temp_dir: str) -> list[Path]:
    """The node's log files, newest first: Ray's session logs and raydist's
    own record of ``ray start``'s output."""
    root = Path(temp_dir)
    found = [p for p in (root / "session_latest" / "logs").glob("*") if p.is_file()]
    found += [p for p in root.glob("raydist-*.log") if p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


#: A line Ray's C++ processes log at ERROR or FATAL: ``[time E pid tid] file:line: ...``.
_SEVERE = re.compile(r"^\[[^\]]* [EF] \d+ \d+\]")


#: A frame of a C++ backtrace (``/path/raylet(+0x263cb7) [0x5581e86a0cb7]``): where, not why.
_FRAME = re.compile(r"\(\+0x[0-9a-f]+\)|\[0x[0-9a-f]+\]")


def last_words(temp_dir: str, process: str, lines: int = 3) -> list[str]:
    """What Ray's ``process`` (``raylet``, ``gcs_server``) said last before it
    died, for the error a user reads: the last ``lines`` ERROR and FATAL
    lines of its log (a failed check says why there), then the last
    ``lines`` of its stderr, a backtrace's frames left out (they say where
    it crashed, never why, and would crowd out what does)."""
    logs = Path(temp_dir) / "session_latest" / "logs"
    said: list[str] = []
    for suffix, keep in ((".out", _SEVERE.match), (".err", lambda line: bool(line.strip()))):
        try:
            with (logs / f"{process}{suffix}").open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - (64 << 10)))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        said += [line.strip()[:300] for line in text.splitlines() if keep(line) and not _FRAME.search(line)][-lines:]
    return said


def read_logs(temp_dir: str, *, max_bytes: int = NODE_BYTES, name: str = "", offset: int = 0) -> list[LogFile]:
    """The node's log files, newest first (just ``name`` when given), up to
    ``max_bytes`` in all: every file is listed, small ones whole, and what is
    left is shared evenly among the big ones, each giving its tail. With
    ``offset`` each file is read from that byte on instead of its tail."""
    found = []
    for path in _files(temp_dir):
        if name and path.name != name:
            continue
        try:
            found.append((path, path.stat().st_size))
        except OSError:
            continue
    # Smallest first, each takes what it needs up to an even share of what is left.
    share: dict[Path, int] = {}
    left = max(0, max_bytes)
    for i, (path, size) in enumerate(sorted(found, key=lambda f: f[1])):
        want = size - min(offset, size) if offset else size
        share[path] = min(want, left // (len(found) - i))
        left -= share[path]
    out: list[LogFile] = []
    for path, size in found:
        start = min(offset, size) if offset else size - share[path]
        try:
            with path.open("rb") as f:
                f.seek(start)
                data = f.read(share[path])
        except OSError:
            continue
        out.append((path.name, size, data))
    return out


def keep(root: Path, cluster: str, by_node: Mapping[str, list[LogFile]], *, limit: int = KEEP_BYTES) -> Path:
    """Write each node's files under ``root/<cluster>/<time>/<node>/``; then
    drop the oldest runs, any cluster's, until ``root`` holds ``limit`` bytes
    or less (this run is kept whole). Returns this run's directory."""
    run = root / cluster / time.strftime("%Y%m%d-%H%M%S")
    for node, files in by_node.items():
        where = run / node
        if where.resolve().parent != run.resolve():  # "../x", "/x", "a/b", "." climb out or in
            log.warning("cluster %s: not keeping the logs of a node whose key is not a plain name", cluster)
            continue
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, _, data in files:
            base = os.path.basename(name)
            if base not in ("", ".", ".."):
                (where / base).write_bytes(data)
    runs = sorted((d for c in root.iterdir() if c.is_dir() for d in c.iterdir() if d.is_dir()),
                  key=lambda d: d.stat().st_mtime)
    total = sum(_size(d) for d in runs)
    for old in runs:
        if total <= limit or old == run:
            continue
        total -= _size(old)
        shutil.rmtree(old, ignore_errors=True)
    return run


def collect(links: Mapping[str, Any], timeout: float, *, total_bytes: int = TEARDOWN_BYTES,
            in_flight: int = IN_FLIGHT) -> dict[str, list[LogFile]]:
    """Ask every linked node for its logs, at most ``in_flight`` at a time and
    ``total_bytes`` in all (shared evenly, at most :data:`NODE_BYTES` and at
    least :data:`MIN_NODE_BYTES` a node); what answered within ``timeout``
    seconds in all, by node key (a node that did not is left out). No thread
    per node: the requests travel on the links, the answers come back there."""
    deadline = time.monotonic() + timeout
    each = max(MIN_NODE_BYTES, min(NODE_BYTES, total_bytes // max(1, len(links))))
    queue = list(links.items())
    waiting: list[tuple[str, Any]] = []
    got: dict[str, list[LogFile]] = {}
    while (queue or waiting) and time.monotonic() < deadline:
        while queue and len(waiting) < in_flight:
            key, link = queue.pop(0)
            waiting.append((key, link.ask_logs(max_bytes=each)))
        key, req = waiting.pop(0)
        try:
            got[key] = req.wait(deadline - time.monotonic())
        except (TimeoutError, OSError):
            pass
    for _, req in waiting:
        req.forget()
    return got


def keep_run(root: Path, cluster: str, links: Mapping[str, Any], timeout: float = 5.0) -> Path | None:
    """At teardown: every live node's logs (:func:`collect`) kept under
    ``root`` (:func:`keep`); the run's directory, or None when no node
    answered or nothing could be written."""
    got = collect({k: link for k, link in links.items() if not link.closed.is_set()}, timeout=timeout)
    if not got:
        return None
    try:
        return keep(root, cluster, got)
    except OSError as exc:
        log.warning("cluster %s: could not keep its nodes' logs: %s", cluster, exc)
        return None


def pick(cluster: str, nodes: Sequence[NodeStatus], links: Mapping[str, Any], node: str) -> Any:
    """The link of the node ``node`` names: its index in ``nodes``, its key,
    or a prefix (4+ characters) of its Ray node id. ClusterNotReadyError
    listing the nodes when none (or more than one) matches a live link."""
    from raydist.errors import ClusterNotReadyError

    match = [n for i, n in enumerate(nodes)
             if node in (str(i), n.key) or (len(node) >= 4 and n.ray_node_id.startswith(node))]
    link = links.get(match[0].key) if len(match) == 1 else None
    if link is None or link.closed.is_set():
        known = ", ".join(f"{i}={n.key}" for i, n in enumerate(nodes))
        raise ClusterNotReadyError(f"cluster {cluster!r} has no running node {node!r} (its nodes: {known})")
    return link


#: One kept file: (its node, its name, its size, the bytes given).
KeptFile = tuple[str, str, int, bytes]
#: What a ``grep`` pattern may be: a plain substring, never a regular
#: expression (a caller's pattern must not be able to stall the server).
GREP_MAX = 200


def kept_runs(root: Path, cluster: str) -> list[str]:
    """The runs whose logs a teardown kept for ``cluster``, oldest first
    (each named by when it was kept, ``YYYYmmdd-HHMMSS``)."""
    where = root / cluster
    if not where.is_dir():
        return []
    return sorted(d.name for d in where.iterdir() if d.is_dir())


def check_grep(text: str) -> str:
    """``text`` if it may be a ``grep`` (at most :data:`GREP_MAX` characters,
    one line); else SpecError naming ``grep``."""
    from raydist.errors import SpecError

    if len(text) > GREP_MAX or "\n" in text:
        raise SpecError("grep", text[:40], f"a piece of text of at most {GREP_MAX} characters, on one line")
    return text


def grep_lines(data: bytes, text: str) -> bytes:
    """The lines of ``data`` that contain ``text`` (every line when empty)."""
    if not text:
        return data
    needle = text.encode()
    return b"".join(line for line in data.splitlines(keepends=True) if needle in line)


def read_kept(root: Path, cluster: str, *, run: str = "last", node: str = "", grep: str = "",
              max_bytes: int = NODE_BYTES) -> tuple[str, list[KeptFile]]:
    """What a teardown kept of ``cluster``'s nodes' logs: the run ``run``
    names (``last``, or its name as :func:`kept_runs` gives it), one node's
    files or every node's, newest first, only the lines containing ``grep``,
    at most ``max_bytes`` in all (each file's tail where it must be cut).
    Returns (the run's name, its files, each named by its node and its own
    name). SpecError naming ``run``, ``node`` or ``grep`` and what exists;
    ClusterNotReadyError when nothing was kept."""
    from raydist.errors import ClusterNotReadyError, SpecError

    check_grep(grep)
    runs = kept_runs(root, cluster)
    if not runs:
        raise ClusterNotReadyError(f"cluster {cluster!r} has no kept logs: a teardown keeps its nodes' logs "
                                   f"(under {root}/{cluster}/), and none has run or kept any yet")
    chosen = runs[-1] if run in ("", "last") else run
    if chosen not in runs:
        raise SpecError("run", run, f"'last' or one of the kept runs: {', '.join(reversed(runs[-10:]))}")
    where = root / cluster / chosen
    nodes = sorted(d.name for d in where.iterdir() if d.is_dir())
    if node and node not in nodes:
        raise SpecError("node", node, f"one of the run's nodes: {', '.join(nodes)}")
    files = sorted(((f, f.stat()) for n in ([node] if node else nodes) for f in (where / n).iterdir()
                    if f.is_file()), key=lambda pair: pair[1].st_mtime, reverse=True)
    out: list[KeptFile] = []
    left = max_bytes
    for f, info in files:
        data = grep_lines(f.read_bytes(), grep)
        if grep and not data:
            continue
        data = data[-left:] if left > 0 else b""
        left -= len(data)
        out.append((f.parent.name, f.name, info.st_size, data))
    return chosen, out


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
