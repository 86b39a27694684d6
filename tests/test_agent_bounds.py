"""The data handoff's block agent against hostile senders, driven directly
over real sockets (no Ray: every refusal comes before a block is stored)."""

from __future__ import annotations

import json
import socket
import time

import pyarrow as pa
import pytest

from raydist.data import _agent
from raydist.data._agent import BlockAgent

pytestmark = pytest.mark.component


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> tuple[BlockAgent, int]:
    monkeypatch.setattr(_agent, "_HEADER_S", 1.0)
    a = BlockAgent()
    port = a.open("127.0.0.1")
    a.expect("job", "s3cret", max_bytes=4096)
    yield a, port
    assert a._server is not None
    a._server.close()


def _send(port: int, header: dict, body: bytes = b"", source: str = "127.0.0.1") -> bytes:
    """What the agent answers (b"": nothing, the connection closed or reset)
    to a sender that speaks its protocol: it proves ``header["secret"]`` (the
    right one or not) over the agent's nonce, and seals ``body`` with it."""
    secret = header.pop("secret")
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        try:
            nonce = json.loads(s.makefile("rb").readline())["nonce"]
            header["proof"] = _agent._proof(secret, nonce, header["job"], _agent._what(header))
            mac = _agent._mac(secret, nonce, "body")
            mac.update(body)
            s.sendall(json.dumps(header).encode() + b"\n" + body + mac.hexdigest().encode() + b"\n")
            s.shutdown(socket.SHUT_WR)
            return s.makefile("rb").read()
        except OSError:  # reset, a broken pipe, or already gone when we shut our side
            return b""


def _ipc(rows: int) -> bytes:
    table = pa.table({"x": list(range(rows))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_out_of_plan_and_oversize_parts_are_refused_before_they_are_stored(agent) -> None:
    a, port = agent
    assert _send(port, {"job": "job", "secret": "s3cret", "part": -1}, _ipc(3)) == b""
    assert _send(port, {"job": "job", "secret": "s3cret", "part": "0; drop"}, _ipc(3)) == b""
    assert _send(port, {"job": "job", "secret": "s3cret", "part": 0}, _ipc(10_000)) == b""  # ~80 KB > 4 KiB
    parts, errors = a.take("job")
    assert parts == {}
    assert len(errors) == 3
    assert "partition index" in errors[0] and "partition index" in errors[1]
    assert "RAYDIST_MAX_PART_BYTES" in errors[2]


def test_strangers_leave_no_trace_and_cannot_hold_every_connection(agent) -> None:
    a, port = agent
    # Without the secret: nothing recorded for the job.
    assert _send(port, {"job": "job", "secret": "guess", "part": 0}, _ipc(3)) == b""
    # A crowd that says nothing: beyond the cap each is closed at once.
    crowd = [socket.create_connection(("127.0.0.1", port)) for _ in range(_agent._MAX_CONNECTIONS + 20)]
    try:
        time.sleep(0.3)
        closed = 0
        for s in crowd:
            s.settimeout(0.05)
            try:
                closed += s.recv(1) == b""
            except TimeoutError:
                pass  # held: waits for its header
        assert closed >= 20
        # Past the header bound every silent one is dropped, and the agent serves again.
        time.sleep(1.5)
        assert _send(port, {"job": "job", "secret": "s3cret", "part": -5}) == b""
        assert len(a.take("job")[1]) == 1  # served (and refused for its index)
    finally:
        for s in crowd:
            s.close()


def test_a_header_sent_a_byte_at_a_time_loses_its_place_at_the_deadline(agent) -> None:
    a, port = agent  # the header deadline is 1 s here
    with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
        header = json.dumps({"job": "job", "secret": "s3cret", "part": 0}).encode()
        sent = 0
        try:
            for byte in header[:10]:  # a byte every 0.3 s: each read is quick, the whole header never comes
                slow.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.3)
            slow.settimeout(2)
            ended = slow.recv(1) == b""
        except (BrokenPipeError, ConnectionResetError):
            ended = True
        assert ended and sent < 10, f"the agent still held the connection after {sent} slow bytes"
    assert a.take("job") == ({}, [])  # a stranger until its header: no trace


def test_one_address_cannot_take_every_place(agent) -> None:
    a, port = agent
    crowd = [socket.create_connection(("127.0.0.1", port)) for _ in range(_agent._MAX_PER_SOURCE + 8)]
    try:
        time.sleep(0.2)
        said = []
        for s in crowd:  # a held one hears its nonce; one refused is closed at once, before a word
            s.settimeout(0.5)
            said.append(s.recv(100))
        assert said.count(b"") == 8 and all(b"nonce" in x for x in said if x)  # the address's share, no more
        # Another address (here 127.0.0.2, another host's tasks) is served at once.
        assert _send(port, {"job": "job", "secret": "s3cret", "part": -1}, source="127.0.0.2") == b""
        assert len(a.take("job")[1]) == 1  # judged (refused for its index), not left waiting
    finally:
        for s in crowd:
            s.close()


def test_the_first_copy_of_a_part_wins(agent, monkeypatch: pytest.MonkeyPatch) -> None:
    # A sender with the job's secret cannot replace a partition a Spark task
    # delivered: a later copy is read, answered with the rows kept, and dropped.
    # (The object store is not the point here: the table itself stands for its ref.)
    monkeypatch.setattr(_agent, "_put", lambda table: table)
    a, port = agent
    assert json.loads(_send(port, {"job": "job", "secret": "s3cret", "part": 0}, _ipc(3)))["rows"] == 3
    assert json.loads(_send(port, {"job": "job", "secret": "s3cret", "part": 0}, _ipc(5)))["rows"] == 3
    parts, errors = a.take("job")
    assert errors == []
    assert list(parts) == [0] and parts[0][1] == 3 and parts[0][0].column("x").to_pylist() == [0, 1, 2]


class _OutOfDescriptorsOnce:
    """A listening socket whose first accept fails as a process out of file
    descriptors fails (EMFILE); the real socket does the rest."""

    def __init__(self, real: socket.socket) -> None:
        self._real = real
        self.failed = 0

    def accept(self) -> tuple[socket.socket, object]:
        if not self.failed:
            self.failed += 1
            import errno

            raise OSError(errno.EMFILE, "Too many open files")
        return self._real.accept()

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


def test_the_agent_goes_on_accepting_after_it_ran_out_of_file_descriptors(monkeypatch) -> None:
    listeners: list[_OutOfDescriptorsOnce] = []
    real_create_server = socket.create_server

    def create_server(*args: object, **kwargs: object) -> _OutOfDescriptorsOnce:
        listeners.append(_OutOfDescriptorsOnce(real_create_server(*args, **kwargs)))
        return listeners[-1]

    monkeypatch.setattr(_agent.socket, "create_server", create_server)
    a = BlockAgent()
    port = a.open("127.0.0.1")
    a.expect("job", "s3cret", max_bytes=4096)
    try:
        # The agent's first accept fails; this sender must be served all the same.
        assert _send(port, {"job": "job", "secret": "s3cret", "part": -1}, _ipc(3)) == b""
        _, errors = a.take("job")
        assert listeners[0].failed == 1
        assert len(errors) == 1 and "partition index" in errors[0], errors
    finally:
        listeners[0].close()


class _Tap:
    """A TCP proxy in front of the agent: records what the sender says, and
    may change one byte of it on the way (an on-path host)."""

    def __init__(self, port: int, flip_at: int = -1) -> None:
        import threading

        self.heard = bytearray()
        self._port, self._flip_at = port, flip_at
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        import threading

        client, _ = self._server.accept()
        agent = socket.create_connection(("127.0.0.1", self._port))

        def pump(src: socket.socket, dst: socket.socket, record: bool) -> None:
            try:
                while chunk := src.recv(65536):
                    if record:
                        start = len(self.heard)
                        self.heard += chunk
                        if start <= self._flip_at < len(self.heard):
                            chunk = bytearray(chunk)
                            chunk[self._flip_at - start] ^= 0x01
                            chunk = bytes(chunk)
                    dst.sendall(chunk)
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        back = threading.Thread(target=pump, args=(agent, client, False), daemon=True)
        back.start()
        pump(client, agent, True)
        back.join(10)
        client.close()
        agent.close()
        self._server.close()


def _send_partition(tap: _Tap, rows: int) -> list:
    table = pa.table({"x": list(range(rows))})
    return list(_agent.send_partitions("job", "s3cret", {"here": ("127.0.0.1", tap.port)}, "127.0.0.1",
                                       table.schema.serialize().to_pybytes(), iter(table.to_batches())))


def test_the_jobs_secret_never_crosses_the_wire_and_a_changed_part_is_not_kept(agent, monkeypatch) -> None:
    monkeypatch.setattr(_agent, "_put", lambda table: table)
    a, port = agent
    tap = _Tap(port)
    sent = _send_partition(tap, 300)
    assert sent[0].to_pydict() == {"part": [0], "rows": [300]}
    assert b"s3cret" not in tap.heard  # proved over the agent's nonce, never said
    parts, errors = a.take("job")
    assert errors == [] and parts[0][1] == 300
    # The same part again, with one byte of its rows changed on the way.
    a.expect("job", "s3cret", max_bytes=1 << 20)
    changed = _Tap(port, flip_at=len(tap.heard) - 200)  # inside the last record batch's values
    with pytest.raises(RuntimeError, match="did not take partition 0"):
        _send_partition(changed, 300)
    parts, errors = a.take("job")
    assert parts == {} and any("changed on the way" in e for e in errors), errors
