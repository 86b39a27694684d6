"""What RAYDIST_HOME holds is this user's alone, and a stale server.json
names no process to stop."""

from __future__ import annotations

import gc
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from raydist.control.store import ClusterRow, Store
from raydist.errors import StoreUnavailableError

pytestmark = pytest.mark.unit


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_existing_home_open_to_others_is_narrowed(tmp_path: Path, monkeypatch, caplog) -> None:
    from raydist.paths import home

    shared = tmp_path / "home"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("RAYDIST_HOME", str(shared))
    with caplog.at_level("WARNING"):
        assert home() == shared
    assert _mode(shared) == 0o700 and str(shared) in caplog.text


def test_the_state_database_and_its_journal_files_are_private(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # as most users have it: new files 0644
    try:
        fresh = Store(tmp_path / "state.db")
        fresh.put(ClusterRow(name="a", spec={"env": {"WANDB_API_KEY": "x"}}, state="RUNNING"))
        files = [tmp_path / n for n in ("state.db", "state.db-wal", "state.db-shm")]
        assert all(f.exists() for f in files)
        assert [_mode(f) for f in files] == [0o600] * 3
        # One a wider umask left before: narrowed when the store opens it.
        (tmp_path / "old").mkdir()
        older = tmp_path / "old" / "state.db"
        Store(older).put(ClusterRow(name="b", spec={}, state="RUNNING"))
        for f in older.parent.iterdir():
            f.chmod(0o644)
        again = Store(older)
        assert again.get("b") is not None
        assert {f.name: _mode(f) for f in older.parent.iterdir()} == {f.name: 0o600 for f in older.parent.iterdir()}
    finally:
        os.umask(old_umask)


def test_a_store_locked_by_another_process_is_refused_and_left_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = Store(path)
    first.put(ClusterRow(name="kept", spec={"workers": 2}, state="RUNNING"))
    first.add_event("kept", "RUNNING", "before the lock")
    del first  # its connection closes with it
    gc.collect()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")  # as a sqlite3 shell or a backup tool leaves it
    holder.execute("BEGIN EXCLUSIVE")  # ... mid-write: no one else may read it now
    holder.execute("UPDATE clusters SET message = 'mid-write'")
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            Store.open(path, busy_timeout_s=0.2)
        assert caught.value.path == str(path) and "locked" in caught.value.reason
        assert str(path) in str(caught.value) and "left untouched" in str(caught.value)
    finally:
        holder.rollback()
        holder.close()
    assert list(tmp_path.glob("state.db.corrupt-*")) == []  # nothing moved aside
    again = Store.open(path)
    assert again.get("kept").spec == {"workers": 2}
    assert [e[3] for e in again.events("kept")] == ["before the lock"]


def test_a_store_that_is_not_sqlite_is_kept_aside_and_a_new_one_starts(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"not SQLite at all " * 200)
    fresh = Store.open(path)
    assert fresh.list() == []
    kept = list(tmp_path.glob("state.db.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b"not SQLite at all")


def test_a_node_temp_dir_another_made_first_is_refused_not_used(tmp_path: Path) -> None:
    # /tmp is shared: a name made before the node (a symlink to a place of
    # ours, or a directory open to all) must not become the node's.
    import pytest

    from raydist.paths import open_private_log, private_dir

    fresh = tmp_path / "raydist-ab12-w0"
    private_dir(fresh)
    private_dir(fresh)  # the node's own, again (a restarted node): fine
    assert _mode(fresh) == 0o700
    target = tmp_path / "elsewhere"
    target.mkdir()
    trap = tmp_path / "raydist-ab12-w1"
    trap.symlink_to(target)
    with pytest.raises(PermissionError, match="raydist-ab12-w1"):
        private_dir(trap)
    wide = tmp_path / "raydist-ab12-w2"
    wide.mkdir()
    wide.chmod(0o777)
    private_dir(wide)  # this user's own: narrowed
    assert _mode(wide) == 0o700
    # The node's log file: created 0600, a symlink there refused.
    with open_private_log(fresh / "raydist-w0.log") as f:
        f.write("started\n")
    assert _mode(fresh / "raydist-w0.log") == 0o600
    (fresh / "raydist-w9.log").symlink_to(tmp_path / "victim")
    with pytest.raises(OSError):
        open_private_log(fresh / "raydist-w9.log")
    assert not (tmp_path / "victim").exists() and list(target.iterdir()) == []


def test_the_client_says_when_the_control_token_would_go_in_clear_off_this_host(caplog) -> None:
    from raydist.control.client import Client

    with caplog.at_level("WARNING", logger="raydist.control.client"):
        Client("127.0.0.1:1", token="tok-local-secret").close()
        assert caplog.text == ""  # this host: nothing to say
        Client("192.0.2.7:50051", token="tok-remote-secret").close()  # TEST-NET-1: never dialled here
    assert "192.0.2.7:50051" in caplog.text and "RAYDIST_TLS_CA" in caplog.text
    assert "tok-" not in caplog.text


def test_a_store_another_process_is_writing_is_refused_at_open_not_at_its_first_write(tmp_path: Path) -> None:
    """In WAL mode (the store's own) another writer's lock leaves reads free:
    the store must still refuse to open, naming the file, rather than open
    and fail at its first write (a server whose Spark already started)."""
    path = tmp_path / "state.db"
    Store(path).put(ClusterRow(name="kept", spec={"workers": 2}, state="RUNNING"))
    gc.collect()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("BEGIN IMMEDIATE")  # another server on this home, mid-write
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            Store.open(path, busy_timeout_s=0.2)
        assert caught.value.path == str(path) and "locked" in caught.value.reason
    finally:
        holder.rollback()
        holder.close()
    assert Store.open(path).get("kept").spec == {"workers": 2}
