"""The moving parts of the Spark <-> Ray Data handoff.

``BlockAgent`` is a Ray actor, one per Ray node of a cluster (named, detached:
it lives as long as the cluster). It listens on its node's address; a Spark
task on the same host (or, failing that, any host) streams its partition to it
as Arrow IPC over TCP, and the agent puts the table into its node's object
store. The agent owns those blocks, so they outlive the Spark task that sent
them; once the driver has taken their references, Ray's reference counting
frees them when the Dataset is gone. The way back works the same in reverse.

Nothing here writes a file: the bytes go from the Spark task's Arrow batches
through a socket into the object store.

The functions at the bottom run inside Spark tasks; they import no Ray (only
pyarrow, and the engine's light ``launch`` module, as a worker node's task does).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from raydist.backoff import Backoff
from raydist.engine.link.admission import Places
from raydist.engine.link.wire import read_line

__all__ = ["BlockAgent", "send_partitions", "fetch_blocks", "AGENT_NAMESPACE"]

AGENT_NAMESPACE = "raydist"
log = logging.getLogger(__name__)
_HEADER_MAX = 4096
#: Connections served at once; one more is closed at once (a Spark task's
#: send then fails and Spark retries it), so strangers cannot pile up threads.
_MAX_CONNECTIONS = 64
#: Of those, how many one address may hold (a host's Spark tasks send from
#: one address; a stranger's address cannot take every place).
_MAX_PER_SOURCE = 32
#: How long a connection may take to say which job it is for, in all (a
#: deadline: a byte now and then does not keep a place).
_HEADER_S = 10.0
#: Partition indexes a job may name (a bound, not the plan: the driver
#: keeps only the parts its Spark tasks reported).
_MAX_PART = 1 << 24
#: The most bytes one partition may send (RAYDIST_MAX_PART_BYTES).
MAX_PART_BYTES = 8 << 30


class _Prefixed:
    """A binary reader of ``head`` and then ``rest`` (what followed the header
    in the same reads, then the rest of the stream)."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head = head
        self._rest = rest

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n is None or n < 0:
                data, self._head = self._head + self._rest.read(), b""
                return data
            data, self._head = self._head[:n], self._head[n:]
            if len(data) < n:  # a reader expects n bytes unless the stream ends
                data += self._rest.read(n - len(data))
            return data
        return self._rest.read(n)

    def readable(self) -> bool:
        return True


def _read_header(conn: socket.socket, deadline: float) -> tuple[bytes, bytes]:
    """The header line ``conn`` sends before ``deadline`` (monotonic), and
    what came after it in the same reads. LineTooLong for a line too long;
    TimeoutError when the deadline passes first, however the bytes trickle."""
    return read_line(conn, deadline, limit=_HEADER_MAX)


def _proof(secret: str, nonce: str, job: str, what: str) -> str:
    """A sender's proof that it holds ``job``'s secret, for this connection
    (the agent's ``nonce``) and what it asks (``part=3``, ``block=5``): the
    secret itself never crosses the wire."""
    return hmac.new(secret.encode(), f"header\0{nonce}\0{job}\0{what}".encode(), hashlib.sha256).hexdigest()


def _mac(secret: str, nonce: str, label: str) -> Any:
    """A running MAC of what one end sends on this connection (``label``:
    ``body`` one way, ``block`` the other), its trailer once the stream ends."""
    return hmac.new(secret.encode(), f"{label}\0{nonce}".encode(), hashlib.sha256)


def _reply_mac(secret: str, nonce: str, rows: int) -> str:
    return hmac.new(secret.encode(), f"reply\0{nonce}\0{rows}".encode(), hashlib.sha256).hexdigest()


def _what(header: Mapping[str, Any]) -> str:
    return f"block={header['block']}" if "block" in header else f"part={header.get('part')}"


class _Hashed:
    """A binary reader that feeds what it reads to ``mac``."""

    def __init__(self, raw: Any, mac: Any) -> None:
        self._raw, self._mac = raw, mac
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._mac.update(data)
        return data

    def readable(self) -> bool:
        return True


class _HashingWriter:
    """A binary writer that feeds what it writes to ``mac``."""

    def __init__(self, raw: Any, mac: Any) -> None:
        self._raw, self._mac = raw, mac
        self._written = 0
        self.closed = False

    def write(self, data: Any) -> int:
        data = bytes(data)
        self._mac.update(data)
        self._raw.write(data)
        self._written += len(data)
        return len(data)

    def flush(self) -> None:
        self._raw.flush()

    def tell(self) -> int:
        return self._written

    def writable(self) -> bool:
        return True


def _read_trailer(raw: Any, what: str) -> str:
    """The MAC line after an Arrow stream (64 hex digits)."""
    line = b""
    while not line.endswith(b"\n") and len(line) <= 65:
        chunk = raw.read(1)
        if not chunk:
            break
        line += chunk
    if len(line) != 65:
        raise ValueError(f"{what} ended without its MAC")
    return line[:-1].decode("ascii", "replace")


def _check_trailer(mac: Any, raw: Any, what: str) -> None:
    given = _read_trailer(raw, what)
    if not hmac.compare_digest(given, mac.hexdigest()):
        raise ValueError(f"{what} was changed on the way (its MAC does not hold)")


class _Bounded:
    """A binary reader that raises once more than ``limit`` bytes are read."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw, self._left = raw, limit
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:  # to the end, a chunk at a time (never one buffer of the bound's size)
            chunks = []
            while chunk := self.read(1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        data = self._raw.read(min(n, self._left + 1))
        self._left -= len(data)
        if self._left < 0:
            raise ValueError("the partition is larger than the agent takes (RAYDIST_MAX_PART_BYTES)")
        return data

    def readable(self) -> bool:
        return True


class BlockAgent:
    """One node's receiver and sender of Arrow blocks (a Ray actor)."""

    def __init__(self) -> None:
        self._server: socket.socket | None = None
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, Any]] = {}
        self._places = Places(_MAX_CONNECTIONS, _MAX_PER_SOURCE)

    def open(self, host: str) -> int:
        """Listen on ``host`` (this node's address); returns the port. Idempotent."""
        with self._lock:
            if self._server is None:
                self._server = socket.create_server((host, 0), backlog=128)
                threading.Thread(target=self._accept, daemon=True, name="raydist-block-agent").start()
            return int(self._server.getsockname()[1])

    def expect(self, job: str, secret: str, max_bytes: int = 0) -> None:
        """Accept partitions for ``job`` from connections that know ``secret``,
        each of at most ``max_bytes`` (0: ``MAX_PART_BYTES``)."""
        with self._lock:
            self._jobs[job] = {"secret": secret, "parts": {}, "errors": [], "offer": {},
                               "max_bytes": max_bytes or MAX_PART_BYTES}

    def offer(self, job: str, secret: str, blocks: Mapping[int, Any]) -> None:
        """Serve ``blocks`` (index -> ObjectRef, held here until :meth:`drop`) for ``job``."""
        with self._lock:
            self._jobs[job] = {"secret": secret, "parts": {}, "errors": [], "offer": dict(blocks)}

    def take(self, job: str) -> tuple[dict[int, tuple[Any, int]], list[str]]:
        """The blocks received for ``job`` (part -> (ref, rows)) and the errors;
        the agent forgets them (the caller's references keep them alive)."""
        with self._lock:
            state = self._jobs.pop(job, {"parts": {}, "errors": []})
        return state["parts"], state["errors"]

    def drop(self, job: str) -> None:
        with self._lock:
            self._jobs.pop(job, None)

    # ------------------------------------------------------------------ serving

    def _accept(self) -> None:
        assert self._server is not None
        pause = Backoff(0.05, 1.0)
        while True:
            try:
                conn, peer = self._server.accept()
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EINVAL):
                    return  # the listener was closed: nothing more to accept
                # Out of file descriptors, a connection aborted before it was
                # taken...: a listener nobody accepts on would hang every
                # sender, so wait a little and go on.
                wait = pause.next()
                log.warning("the block agent could not accept a connection (%s); retrying in %.2f s",
                            exc.strerror or exc, wait)
                time.sleep(wait)
                continue
            pause.reset()
            source = str(peer[0]) if isinstance(peer, tuple) else ""
            if not self._places.take(source):
                conn.close()  # full: refused at once, no thread
                continue
            threading.Thread(target=self._serve, args=(conn, source), daemon=True).start()

    def _serve(self, conn: socket.socket, source: str = "") -> None:
        try:
            self._serve_one(conn)
        finally:
            conn.close()
            self._places.give_back(source)

    def _serve_one(self, conn: socket.socket) -> None:
        import pyarrow as pa

        job = ""
        try:
            nonce = secrets.token_hex(16)
            conn.settimeout(_HEADER_S)
            conn.sendall(json.dumps({"nonce": nonce}).encode() + b"\n")  # what the sender proves its secret over
            line, after = _read_header(conn, time.monotonic() + _HEADER_S)
            header = json.loads(line)
            if not isinstance(header, dict):
                raise ValueError("a header that is not a JSON object")
            job = str(header.get("job", ""))
            with self._lock:
                state = self._jobs.get(job)
            if state is None or not hmac.compare_digest(
                    str(header.get("proof", "")).encode(), _proof(state["secret"], nonce, job, _what(header)).encode()):
                job = ""  # a stranger: no trace in the job
                return
            conn.settimeout(600)
            if "block" in header:  # the way back: send one block to a Spark task
                import ray

                table = ray.get(state["offer"][int(header["block"])])
                mac = _mac(state["secret"], nonce, "block")
                with conn.makefile("wb") as out:
                    with pa.ipc.new_stream(_HashingWriter(out, mac), table.schema) as writer:
                        writer.write_table(table)
                    out.write(mac.hexdigest().encode() + b"\n")
                return
            part = header.get("part")
            if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < _MAX_PART:
                raise ValueError(f"a partition index from 0 to {_MAX_PART - 1} (got {str(part)[:20]})")
            stream = _Prefixed(after, conn.makefile("rb"))
            mac = _mac(state["secret"], nonce, "body")
            table = pa.ipc.open_stream(_Bounded(_Hashed(stream, mac), state["max_bytes"])).read_all()
            _check_trailer(mac, stream, f"partition {part}")  # before a row of it is kept
            with self._lock:
                earlier = state["parts"].get(part)
            if earlier is None:
                ref = _put(table)  # this actor owns the block: it outlives the Spark task
                with self._lock:
                    # The first copy of a part wins: a retried task's copy, or
                    # anyone else's, replaces nothing (its sender hears the rows kept).
                    earlier = state["parts"].setdefault(part, (ref, table.num_rows))
            rows = earlier[1]
            conn.sendall(json.dumps({"rows": rows, "mac": _reply_mac(state["secret"], nonce, rows)}).encode() + b"\n")
        except Exception as exc:  # noqa: BLE001 - reported to the driver with the job
            with self._lock:
                if job in self._jobs:
                    self._jobs[job]["errors"].append(f"{type(exc).__name__}: {exc}"[:500])


@contextlib.contextmanager
def connect(host: str, port: int, job: str, secret: str, **what: int) -> Iterator[tuple[socket.socket, str]]:
    """A connection to the agent at ``host:port`` for ``job``, its header
    said (``part=`` to send one, ``block=`` to fetch one): the socket and the
    agent's nonce for this connection."""
    with socket.create_connection((host, port), timeout=600) as sock:
        sock.settimeout(_HEADER_S)
        line = b""
        while not line.endswith(b"\n") and len(line) < 256:
            chunk = sock.recv(1)
            if not chunk:
                raise ConnectionError(f"the block agent at {host}:{port} closed before it said its nonce")
            line += chunk
        nonce = str(json.loads(line)["nonce"])
        header = {"job": job, **what}
        header["proof"] = _proof(secret, nonce, job, _what(header))
        sock.sendall(json.dumps(header).encode() + b"\n")
        sock.settimeout(600)
        yield sock, nonce


def _put(table: Any) -> Any:
    """Put a received partition into this node's object store (owned by the agent)."""
    import ray

    return ray.put(table)


# ---------------------------------------------------------------- in Spark tasks


def _agent_for(agents: Mapping[str, tuple[str, int]], driver_host: str) -> tuple[str, int]:
    """This host's agent when one runs here, else any (the bytes then cross the network)."""
    from raydist.engine.node.launch import route_ip  # the address Ray nodes on this host took

    mine = route_ip(driver_host)
    if mine in agents:
        return agents[mine]
    return sorted(agents.values())[hash(mine) % len(agents)]


def send_partitions(job: str, secret: str, agents: Mapping[str, tuple[str, int]], driver_host: str,
                    schema_ipc: bytes, batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: stream this partition to a block agent; yields
    one row (partition index, rows) for the driver."""
    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx is not None else 0
    host, port = _agent_for(agents, driver_host)
    with connect(host, port, job, secret, part=part) as (sock, nonce):
        out = sock.makefile("wb")
        mac = _mac(secret, nonce, "body")
        body = _HashingWriter(out, mac)
        writer = None
        sent = 0
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_stream(body, batch.schema)
            writer.write_batch(batch)
            sent += batch.num_rows
        if writer is None:  # an empty partition still says what its columns are
            writer = pa.ipc.new_stream(body, pa.ipc.read_schema(pa.py_buffer(schema_ipc)))
        writer.close()
        out.write(mac.hexdigest().encode() + b"\n")
        out.flush()
        sock.shutdown(socket.SHUT_WR)
        reply = sock.makefile("rb").readline(_HEADER_MAX)
    if not reply:
        raise RuntimeError(f"the Ray node at {host}:{port} did not take partition {part}; see the driver's error")
    answer = json.loads(reply)
    kept = int(answer["rows"])
    if not hmac.compare_digest(str(answer.get("mac", "")), _reply_mac(secret, nonce, kept)):
        raise RuntimeError(f"the answer for partition {part} from {host}:{port} was changed on the way")
    if kept != sent:
        # Another sender's copy of this partition got there first.
        raise RuntimeError(f"the Ray node at {host}:{port} holds {kept} rows for partition {part}, "
                           f"which has {sent}: a copy from another sender got there first")
    yield pa.RecordBatch.from_pydict({"part": [part], "rows": [sent]},
                                     schema=pa.schema([("part", pa.int32()), ("rows", pa.int64())]))


def fetch_blocks(job: str, secret: str, holders: Mapping[int, tuple[str, int]],
                 batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body for the way back: for each block index in the
    input, stream that block from the agent that holds it."""
    import pyarrow as pa

    for batch in batches:
        for index in batch.column(0).to_pylist():
            host, port = holders[int(index)]
            with connect(host, port, job, secret, block=int(index)) as (sock, nonce):
                sock.shutdown(socket.SHUT_WR)
                raw = sock.makefile("rb")
                mac = _mac(secret, nonce, "block")
                got = list(pa.ipc.open_stream(_Hashed(raw, mac)))
                _check_trailer(mac, raw, f"block {index}")  # before a row of it goes to Spark
            yield from got
