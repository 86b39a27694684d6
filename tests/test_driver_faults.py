"""Faults of the driver and control plane that a code read found, each on the
real parts: a real `raydist serve` (real Spark local-cluster, real Ray), its
real SQLite store, real sockets."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raydist._proto import pb
from raydist.control.store import ClusterRow, Store
from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
from raydist.engine.ports import free_port
from raydist.errors import RPCError
from raydist.spec import ClusterSpec
from tests.control_server import Server

pytestmark = pytest.mark.integration

SERVICE = "raydist.v1.ClusterService"


def _health(address: str, service: str = SERVICE, timeout: float = 5) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                    timeout=timeout).status


def test_a_write_stuck_on_the_store_stalls_no_read_and_no_health_check(tmp_path: Path) -> None:
    # The manager's lock was held across SQLite, and reads (on the event loop)
    # took it: a create whose store write waited stalled GetCluster, List and
    # the health check with it.
    before = {p.pid for p in ray_processes()}
    srv = Server(tmp_path, free_port()).start()
    try:
        srv.wait_serving()
        blocker = sqlite3.connect(tmp_path / "state.db", timeout=1, isolation_level=None)
        created: list[object] = []
        try:
            blocker.execute("BEGIN EXCLUSIVE")  # every write now waits (SQLite's busy timeout)
            creating = threading.Thread(target=lambda: created.append(
                srv.client(timeout=120).create(ClusterSpec(name="held", workers=1, cpus_per_worker=1))),
                daemon=True)
            creating.start()
            time.sleep(2.0)  # the create holds whatever it holds, waiting on the store
            assert creating.is_alive(), "the create did not wait on the store: nothing was tested"
            client = srv.client(timeout=3, retries=0)
            for _ in range(3):
                t = time.monotonic()
                assert _health(srv.address, timeout=3) == health_pb2.HealthCheckResponse.SERVING
                assert client.list() == []
                with pytest.raises(RPCError, match="NOT_FOUND"):
                    client.get("other")
                assert time.monotonic() - t < 1.5, "a read waited on a write"
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        creating.join(60)
        assert created, "the create did not finish once the store was free"
        srv.client().delete("held", allow_missing=True)
    finally:
        assert srv.stop() == 0
    assert not wait_no_ray_processes(timeout=30, ignore=before)


def test_rows_the_current_rules_reject_or_cannot_read_fail_alone(tmp_path: Path) -> None:
    # One such row stopped `serve` before it served: it restarted in a loop.
    store = Store(tmp_path / "state.db")
    good = ClusterSpec(name="good", workers=1, cpus_per_worker=1).to_dict()
    store.put(ClusterRow(name="good", spec=good, state="RUNNING"))
    store.put(ClusterRow(name="oldrule", spec={**good, "name": "oldrule", "workers": -3}, state="RUNNING"))
    store.put(ClusterRow(name="garbled", spec=good, state="RUNNING"))
    with sqlite3.connect(tmp_path / "state.db") as db:
        db.execute("UPDATE clusters SET spec = '{not json' WHERE name = 'garbled'")
    srv = Server(tmp_path, free_port()).start()
    try:
        client = srv.client()
        by_name = {c.spec.name: c for c in client.list()}
        assert set(by_name) == {"good", "oldrule", "garbled"}
        assert by_name["good"].state == pb.FAILED and "restarted" in by_name["good"].message
        for bad in ("oldrule", "garbled"):
            assert by_name[bad].state == pb.FAILED
            assert "could not bring this cluster back" in by_name[bad].message
            assert f"raydist down {bad}" in by_name[bad].message
        assert "workers" in by_name["oldrule"].message  # the rule it breaks, named
        client.delete("garbled")  # a row that cannot be read can still be deleted
        assert client.get("garbled").state == pb.DELETED
    finally:
        assert srv.stop() == 0


def test_a_store_that_is_not_a_database_is_kept_aside_and_serve_serves(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_bytes(b"this is not SQLite" * 100)
    srv = Server(tmp_path, free_port()).start()
    try:
        assert srv.client().list() == []
        kept = list(tmp_path.glob("state.db.corrupt-*"))
        assert kept and kept[0].read_bytes().startswith(b"this is not SQLite")
        assert "could not be read" in (tmp_path / "test-server.log").read_text()
    finally:
        assert srv.stop() == 0


def test_events_are_kept_within_the_retention(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db", events_keep=30, events_max_age_s=3600)
    for i in range(500):
        store.add_event("c", "RUNNING", f"credentials given to caller {i}")
    kept = store.events("c")
    assert len(kept) <= 30 + 50  # pruned every 50 additions down to the newest 30
    assert kept[-1][3] == "credentials given to caller 499"
    store.prune("c")
    assert [e[3] for e in store.events("c")] == [f"credentials given to caller {i}" for i in range(470, 500)]
    with sqlite3.connect(tmp_path / "state.db") as db:
        db.execute("UPDATE events SET time = time - 7200 WHERE name = 'c'")
    store.add_event("c", "RUNNING", "now")
    store.prune("c")
    assert [e[3] for e in store.events("c")] == ["now"]  # older than the max age: gone


def _server_jvm(srv: Server) -> psutil.Process:
    assert srv.proc is not None
    for child in psutil.Process(srv.proc.pid).children(recursive=True):
        if child.name() == "java" and "SparkSubmit" in " ".join(child.cmdline()):
            return child
    raise AssertionError("the server's driver JVM was not found")


def test_a_dead_sparkcontext_is_noticed_rebuilt_and_its_clusters_come_back(tmp_path: Path) -> None:
    """A server whose SparkContext dies under it: about 65 s here, the
    server's own Spark started twice and its cluster launched twice."""
    # The control plane was never told: health stayed SERVING and every
    # create failed INTERNAL until someone restarted it.
    before = {p.pid for p in ray_processes()}
    srv = Server(tmp_path, free_port()).start()
    try:
        srv.wait_serving()
        client = srv.client()
        client.create(ClusterSpec(name="phoenix", workers=1, cpus_per_worker=1), restart_on_server_restart=True)
        client.create(ClusterSpec(name="mortal", workers=1, cpus_per_worker=1))
        first = client.wait("phoenix", timeout=180)
        assert first.state == pb.RUNNING, first.message
        assert client.wait("mortal", timeout=180).state == pb.RUNNING
        jvm = _server_jvm(srv)
        jvm.kill()
        deadline = time.monotonic() + 60
        while _health(srv.address) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "health stayed SERVING with a dead SparkContext"
            time.sleep(0.2)
        deadline = time.monotonic() + 300
        while (again := client.get("phoenix")).state != pb.RUNNING or again.address == first.address:
            assert time.monotonic() < deadline, f"phoenix did not come back: {again.message}"
            time.sleep(0.5)
        assert _health(srv.address) == health_pb2.HealthCheckResponse.SERVING
        mortal = client.get("mortal")
        assert mortal.state == pb.FAILED and "Spark died" in mortal.message
        assert _server_jvm(srv).pid != jvm.pid  # a new SparkContext, in a new JVM
        client.create(ClusterSpec(name="after", workers=1, cpus_per_worker=1))
        assert client.wait("after", timeout=180).state == pb.RUNNING  # creates work again
        client.delete("after")
        client.delete("phoenix")
    finally:
        assert srv.stop() == 0
    assert not wait_no_ray_processes(timeout=30, ignore=before)
