"""Durable control-plane state: clusters and their events in SQLite (WAL).

Synchronous and narrow on purpose; the server calls it through
``asyncio.to_thread``. Each call opens no long transactions, so a reader never
waits on the cluster engine.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.errors import StoreUnavailableError
from raydist.paths import narrow

__all__ = ["Store", "ClusterRow"]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS clusters (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    ready_workers INTEGER NOT NULL DEFAULT 0,
    desired_workers INTEGER NOT NULL DEFAULT 0,
    address TEXT NOT NULL DEFAULT '',
    client_address TEXT NOT NULL DEFAULT '',
    dashboard_url TEXT NOT NULL DEFAULT '',
    request_id TEXT NOT NULL DEFAULT '',
    restart INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    owner TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    time REAL NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_name ON events(name, id);
"""


@dataclass
class ClusterRow:
    name: str
    spec: dict[str, Any]
    state: str
    message: str = ""
    ready_workers: int = 0
    desired_workers: int = 0
    address: str = ""
    client_address: str = ""
    dashboard_url: str = ""
    request_id: str = ""
    restart: bool = False
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    #: The tenant the cluster belongs to ("": the control plane's admin).
    owner: str = ""


#: Events kept per cluster, and for how long (``raydist serve``'s
#: ``events_keep`` and ``events_max_age_s`` change them).
EVENTS_KEEP = 1000
EVENTS_MAX_AGE_S = 7 * 24 * 3600.0
#: SQLite's words for a file that is not a store at all (the only ones for
#: which it is moved aside; every other error leaves it where it is).
_NOT_A_STORE = frozenset({"SQLITE_NOTADB", "SQLITE_CORRUPT"})
#: A cluster's events are pruned after this many more were added.
_PRUNE_EVERY = 50


class Store:
    """Clusters and their events. ``events_keep`` and ``events_max_age_s``
    bound each cluster's events: older ones are dropped as new ones come."""

    @classmethod
    def open(cls, path: Path, **options: Any) -> Store:
        """The store at ``path``. A file that is not a SQLite database (a
        disk fault, a truncated copy) is kept aside, named in the log, and a
        new store started: a control plane that cannot read its past still
        serves (its clusters' processes died with the last one anyway). A
        store that cannot be opened *now* (locked, disk full, I/O error) is
        never moved: :class:`~raydist.errors.StoreUnavailableError` names it."""
        try:
            return cls(path, **options)
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", "") not in _NOT_A_STORE:
                raise StoreUnavailableError(str(path), str(exc)) from exc
            kept = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                if each.exists():
                    each.rename(kept.with_name(kept.name + each.name[len(path.name):]))
            log.error("the control plane's store %s could not be read (%s); kept it as %s and started a new one",
                      path, exc, kept)
            return cls(path, **options)

    def __init__(self, path: Path, *, events_keep: int = EVENTS_KEEP,
                 events_max_age_s: float = EVENTS_MAX_AGE_S, busy_timeout_s: float = 30.0) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self.events_keep = events_keep
        self.events_max_age_s = events_max_age_s
        self._added: dict[str, int] = {}  # events added per cluster since its last prune
        path.parent.mkdir(parents=True, exist_ok=True)
        # Rows hold specs (their env values included): this user's only.
        # SQLite gives the -wal and -shm files the database file's mode.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            narrow(each, 0o600)
        self._local = threading.local()
        self._prune_lock = threading.Lock()
        with self._db() as db:
            db.executescript(_SCHEMA)
            columns = {r["name"] for r in db.execute("PRAGMA table_info(clusters)")}
            if "owner" not in columns:  # a state.db from before tenants: its clusters are the admin's
                db.execute("ALTER TABLE clusters ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
            # Writable now, too: in WAL mode another process's write lock
            # leaves reads free, so without this a store another writer holds
            # opened, and the first write (after Spark started) failed.
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        yield conn

    @staticmethod
    def _row(r: sqlite3.Row) -> ClusterRow:
        d = dict(r)
        d["spec"] = json.loads(d["spec"])
        d["restart"] = bool(d["restart"])
        return ClusterRow(**d)

    def put(self, row: ClusterRow) -> None:
        row.updated = time.time()
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO clusters (name, spec, state, message, ready_workers, desired_workers, "
                "address, client_address, dashboard_url, request_id, restart, created, updated, owner) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (row.name, json.dumps(row.spec), row.state, row.message, row.ready_workers, row.desired_workers,
                 row.address, row.client_address, row.dashboard_url, row.request_id, int(row.restart),
                 row.created, row.updated, row.owner),
            )

    def get(self, name: str) -> ClusterRow | None:
        """The row of ``name``; a row that cannot be read comes back FAILED,
        with no spec, so that it can still be seen and deleted."""
        with self._db() as db:
            r = db.execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
        if r is None:
            return None
        try:
            return self._row(r)
        except Exception as exc:  # noqa: BLE001 - see Store.scan
            return ClusterRow(name=name, spec={}, state="FAILED", message=f"this row cannot be read: {exc}"[:300])

    def list(self, after: str = "", limit: int = 100) -> list[ClusterRow]:
        with self._db() as db:
            rows = db.execute(
                "SELECT * FROM clusters WHERE name > ? ORDER BY name LIMIT ?", (after, limit)
            ).fetchall()
        return [self._row(r) for r in rows]

    def delete(self, name: str) -> None:
        with self._db() as db:
            db.execute("DELETE FROM clusters WHERE name = ?", (name,))

    def deleted_before(self, when: float) -> list[str]:
        """Clusters DELETED and unchanged since before ``when`` (epoch seconds)."""
        with self._db() as db:
            rows = db.execute("SELECT name FROM clusters WHERE state = 'DELETED' AND updated < ? ORDER BY name",
                              (when,)).fetchall()
        return [r["name"] for r in rows]

    def forget(self, name: str) -> None:
        """Drop ``name``'s row and its events."""
        with self._db() as db:
            db.execute("DELETE FROM events WHERE name = ?", (name,))
            db.execute("DELETE FROM clusters WHERE name = ?", (name,))

    def scan(self) -> Iterator[tuple[str, ClusterRow | None, str]]:
        """Every cluster row as (name, row, "") or, for a row that cannot be
        read (its spec is not JSON, a column holds nonsense), (name, None, why)."""
        with self._db() as db:
            raw = db.execute("SELECT * FROM clusters ORDER BY name").fetchall()
        for r in raw:
            try:
                yield str(r["name"]), self._row(r), ""
            except Exception as exc:  # noqa: BLE001 - one bad row is reported, the rest still read
                yield str(r["name"]), None, f"{type(exc).__name__}: {exc}"[:300]

    def mark_failed(self, name: str, message: str) -> None:
        """Set a row that cannot be read to FAILED with ``message`` (its other columns stay as they are)."""
        with self._db() as db:
            db.execute("UPDATE clusters SET state = 'FAILED', message = ?, updated = ? WHERE name = ?",
                       (message, time.time(), name))

    def add_event(self, name: str, state: str, message: str) -> int:
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO events(name, time, state, message) VALUES (?,?,?,?)", (name, time.time(), state, message)
            )
        with self._prune_lock:
            added = self._added[name] = self._added.get(name, 0) + 1
        if added >= _PRUNE_EVERY:
            self.prune(name)
        return int(cur.lastrowid or 0)

    def prune(self, name: str) -> None:
        """Drop ``name``'s events past the newest ``events_keep`` or older than ``events_max_age_s``."""
        with self._prune_lock:
            self._added[name] = 0
        with self._db() as db:
            db.execute(
                "DELETE FROM events WHERE name = ? AND (time < ? OR id <= (SELECT id FROM events WHERE name = ? "
                "ORDER BY id DESC LIMIT 1 OFFSET ?))",
                (name, time.time() - self.events_max_age_s, name, self.events_keep))

    def last_event_id(self, name: str) -> int:
        with self._db() as db:
            r = db.execute("SELECT MAX(id) AS id FROM events WHERE name = ?", (name,)).fetchone()
        return int(r["id"] or 0)

    def events(self, name: str, after_id: int = 0, limit: int = 0) -> list[tuple[int, float, str, str]]:
        """``name``'s events after ``after_id``, oldest first (the newest ``limit`` when given)."""
        with self._db() as db:
            if limit:
                rows = db.execute(
                    "SELECT * FROM (SELECT id, time, state, message FROM events WHERE name = ? AND id > ? "
                    "ORDER BY id DESC LIMIT ?) ORDER BY id", (name, after_id, limit)).fetchall()
            else:
                rows = db.execute(
                    "SELECT id, time, state, message FROM events WHERE name = ? AND id > ? ORDER BY id",
                    (name, after_id)).fetchall()
        return [(r["id"], r["time"], r["state"], r["message"]) for r in rows]
