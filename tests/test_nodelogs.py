"""What a node sends of its logs, and what the control plane keeps of them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from raydist.engine.nodelogs import keep, kept_runs, last_words, read_kept, read_logs

pytestmark = pytest.mark.unit


def _node(tmp_path: Path, sizes: dict[str, int]) -> str:
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    for i, (name, size) in enumerate(sizes.items()):
        path = logs / name
        path.write_bytes(bytes((j % 26) + 65 for j in range(size)))
        os.utime(path, (time.time() - 100 + i, time.time() - 100 + i))  # later in the dict = newer
    return str(tmp_path)


def test_every_file_is_listed_small_ones_whole_and_the_total_bounded(tmp_path: Path) -> None:
    temp = _node(tmp_path, {"huge.log": 500_000, "raylet.out": 3_000, "raylet.err": 0, "worker.err": 200_000})
    files = read_logs(temp, max_bytes=100_000)
    assert [f[0] for f in files] == ["worker.err", "raylet.err", "raylet.out", "huge.log"]  # newest first
    by_name = {name: (size, data) for name, size, data in files}
    assert len(by_name["raylet.out"][1]) == 3_000 and by_name["raylet.err"][1] == b""  # small ones whole
    assert sum(len(d) for _, _, d in files) <= 100_000
    # The big ones share what is left evenly, each its tail.
    assert len(by_name["huge.log"][1]) == len(by_name["worker.err"][1]) == (100_000 - 3_000) // 2
    whole = (tmp_path / "session_latest" / "logs" / "huge.log").read_bytes()
    assert by_name["huge.log"] == (500_000, whole[-len(by_name["huge.log"][1]):])


def test_one_file_from_an_offset(tmp_path: Path) -> None:
    temp = _node(tmp_path, {"raylet.out": 1_000, "other.log": 50})
    (name, size, data), = read_logs(temp, name="raylet.out", offset=990)
    whole = (tmp_path / "session_latest" / "logs" / "raylet.out").read_bytes()
    assert (name, size, data) == ("raylet.out", 1_000, whole[990:])
    assert read_logs(temp, name="raylet.out", offset=5_000)[0][2] == b""  # past the end: nothing new
    assert read_logs(temp, name="missing.log") == []


def test_kept_runs_beyond_the_limit_go_oldest_first(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    first = keep(root, "a", {"w0": [("raylet.out", 600, b"x" * 600)]}, limit=1_000)
    os.utime(first, (time.time() - 60, time.time() - 60))
    time.sleep(1.1)  # a run's directory is named by the second
    second = keep(root, "b", {"head": [("gcs_server.out", 600, b"y" * 600)]}, limit=1_000)
    assert not first.exists() and (second / "head" / "gcs_server.out").read_bytes() == b"y" * 600


def test_a_node_key_or_file_name_that_climbs_out_writes_nothing_outside_its_run(tmp_path: Path) -> None:
    # The keys come from peers' hellos: a hostile one must not name a path.
    root = tmp_path / "home" / "logs"
    root.mkdir(parents=True)
    run = keep(root, "c", {
        "../../x": [("raylet.out", 3, b"bad")],
        "/tmp/x": [("raylet.out", 3, b"bad")],
        "w0/../..": [("raylet.out", 3, b"bad")],
        ".": [("raylet.out", 3, b"bad")],
        "w1": [("../../../evil", 3, b"ok!"), ("..", 3, b"bad"), ("", 3, b"bad")],
    })
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [str((run / "w1" / "evil").relative_to(tmp_path))]
    assert (run / "w1" / "evil").read_bytes() == b"ok!"


class _AnsweringLink:
    """A node that answers a log request after ``delay`` s, counting how many are asked at once."""

    in_flight = 0
    most = 0

    def __init__(self, key: str, delay: float) -> None:
        import threading

        from raydist.engine.link.nodelink import NodeLink

        self.link = NodeLink(key=key, _post=self._post)
        self.delay = delay
        self.asked: list[int] = []
        self._threading = threading

    def _post(self, link, data: bytes) -> bool:  # noqa: ANN001
        import json

        msg = json.loads(data)
        self.asked.append(int(msg["max_bytes"]))
        cls = type(self)
        cls.in_flight += 1
        cls.most = max(cls.most, cls.in_flight)

        def answer() -> None:
            import time

            time.sleep(self.delay)
            cls.in_flight -= 1
            link._on_logs({"req": msg["req"], "name": "raylet.out", "size": 3, "data": "YWJj"})
            link._on_logs({"req": msg["req"], "done": True})

        self._threading.Thread(target=answer, daemon=True).start()
        return True


def test_teardown_log_collection_is_bounded_in_parallel_and_in_total() -> None:
    # Every teardown asked every node at once, a thread each, up to 1 MiB each.
    from raydist.engine.nodelogs import MIN_NODE_BYTES, collect

    nodes = {f"w{i}": _AnsweringLink(f"w{i}", 0.01) for i in range(200)}
    got = collect({k: n.link for k, n in nodes.items()}, timeout=30, total_bytes=1 << 20, in_flight=16)
    assert set(got) == set(nodes)
    assert _AnsweringLink.most <= 16
    assert all(n.asked == [MIN_NODE_BYTES] for n in nodes.values())  # 1 MiB / 200 < 64 KiB: the floor
    slow = {f"w{i}": _AnsweringLink(f"w{i}", 5.0) for i in range(3)}
    t = __import__("time").monotonic()
    assert collect({k: n.link for k, n in slow.items()}, timeout=1.0) == {}  # bounded in time, too
    assert __import__("time").monotonic() - t < 2.0


def test_a_kept_run_is_read_back_by_run_node_and_text(tmp_path: Path) -> None:
    from raydist.errors import ClusterNotReadyError, SpecError

    root = tmp_path / "logs"
    root.mkdir()
    with pytest.raises(ClusterNotReadyError, match="no kept logs"):
        read_kept(root, "c")
    old = keep(root, "c", {"head": [("gcs_server.out", 9, b"old line\n")]})
    time.sleep(1.1)  # a run's directory is named by the second
    new = keep(root, "c", {"head": [("gcs_server.out", 20, b"gcs up\nerror: boom\n")],
                           "w0": [("raylet.out", 30, b"raylet up\nerror: lost\nbye\n")]})
    assert kept_runs(root, "c") == [old.name, new.name]
    run, files = read_kept(root, "c")  # the last run, every node
    assert run == new.name and {(n, f) for n, f, _, _ in files} == {("head", "gcs_server.out"), ("w0", "raylet.out")}
    run, files = read_kept(root, "c", run=old.name)
    assert [d for _, _, _, d in files] == [b"old line\n"]
    _, files = read_kept(root, "c", grep="error:")
    assert sorted(d for _, _, _, d in files) == [b"error: boom\n", b"error: lost\n"]
    _, files = read_kept(root, "c", node="w0", grep="error:")
    assert [(n, d) for n, _, _, d in files] == [("w0", b"error: lost\n")]
    assert read_kept(root, "c", grep="nowhere")[1] == []
    _, files = read_kept(root, "c", node="w0", max_bytes=4)
    assert [d for _, _, _, d in files] == [b"bye\n"]  # the tail
    for bad, field in ((dict(run="19990101-000000"), "run"), (dict(node="w9"), "node"),
                       (dict(grep="x" * 201), "grep"), (dict(grep="a\nb"), "grep")):
        with pytest.raises(SpecError) as caught:
            read_kept(root, "c", **bad)
        assert caught.value.field == field, bad
    with pytest.raises(SpecError) as caught:
        read_kept(root, "c", run="nope")
    assert new.name in str(caught.value) and old.name in str(caught.value)  # it names what exists


def test_a_dead_core_process_leaves_its_last_error_lines(tmp_path: Path) -> None:
    """What goes into "the head node stopped: Ray's raylet exited": its log's
    ERROR and FATAL lines (never INFO), then its stderr without a
    backtrace's frames (a crash's last three lines were all frames: where,
    not why)."""
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text(
        "[2026-12-07 00:00:00,001 I 10 10] main.cc:1: starting\n"
        "[2026-12-07 00:00:00,002 E 10 10] grpc_server.cc:80: Failed to bind port 24123\n"
        "[2026-12-07 00:00:00,003 I 10 10] main.cc:2: still here\n")
    assert last_words(str(tmp_path), "raylet") == [
        "[2026-12-07 00:00:00,002 E 10 10] grpc_server.cc:80: Failed to bind port 24123"]
    (logs / "raylet.err").write_text(
        "\n*** SIGABRT received\nCheck failed: bound\n"
        "/venv/ray/core/src/ray/raylet/raylet(+0x263cb7) [0x5581e86a0cb7]\n"
        "/lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x85) [0x7f8ac3445305] __libc_start_main\n")
    assert last_words(str(tmp_path), "raylet") == [
        "[2026-12-07 00:00:00,002 E 10 10] grpc_server.cc:80: Failed to bind port 24123",
        "*** SIGABRT received", "Check failed: bound"]
    assert last_words(str(tmp_path), "gcs_server") == []
