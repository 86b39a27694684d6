"""Durable control-plane state: clusters and their events in SQLite (WAL).

Synchronous and narrow on purpose; the server calls it through
``asyncio.to_thread``. Each call opens no long transactions, so a reader never
waits on the cluster engine.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.paths import narrow

__all__ = ["Store", "ClusterRow"]

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


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # Rows hold specs (their env values included): this user's only.
        # SQLite gives the -wal and -shm files the database file's mode.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            narrow(each, 0o600)
        self._local = threading.local()
        with self._db() as db:
            db.executescript(_SCHEMA)
            columns = {r["name"] for r in db.execute("PRAGMA table_info(clusters)")}
            if "owner" not in columns:  # a state.db from before tenants: its clusters are the admin's
                db.execute("ALTER TABLE clusters ADD COLUMN owner TEXT NOT NULL DEFAULT ''")

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
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
        with self._db() as db:
            r = db.execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
        return self._row(r) if r else None

    def list(self, after: str = "", limit: int = 100) -> list[ClusterRow]:
        with self._db() as db:
            rows = db.execute(
                "SELECT * FROM clusters WHERE name > ? ORDER BY name LIMIT ?", (after, limit)
            ).fetchall()
        return [self._row(r) for r in rows]

    def delete(self, name: str) -> None:
        with self._db() as db:
            db.execute("DELETE FROM clusters WHERE name = ?", (name,))

    def add_event(self, name: str, state: str, message: str) -> int:
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO events(name, time, state, message) VALUES (?,?,?,?)", (name, time.time(), state, message)
            )
        return int(cur.lastrowid or 0)

    def events(self, name: str, after_id: int = 0) -> list[tuple[int, float, str, str]]:
        with self._db() as db:
            rows = db.execute(
                "SELECT id, time, state, message FROM events WHERE name = ? AND id > ? ORDER BY id", (name, after_id)
            ).fetchall()
        return [(r["id"], r["time"], r["state"], r["message"]) for r in rows]
