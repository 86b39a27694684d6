"""The control plane's cluster states when calls race a starting cluster:
each ends in one true state. The engine here is a stand-in whose
constructor waits until the test lets it go (a slow Spark), so that a delete,
a create or a restart lands in the window; the manager, its store (SQLite)
and its threads are the real ones."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from raydist.control import manager as manager_module
from raydist.control.manager import ClusterManager
from raydist.control.store import Store
from raydist.spec import ClusterSpec, ClusterStatus, State, spec_to_proto
from tests.probe import until

pytestmark = pytest.mark.unit


class _Engine:
    """A cluster engine that takes as long to build as the test says."""

    made: list[_Engine] = []
    gate = threading.Event()

    def __init__(self, spec: ClusterSpec, spark: object, **kwargs: object) -> None:
        self.spec = spec
        self.started = threading.Event()
        self.downs = 0
        _Engine.made.append(self)
        assert _Engine.gate.wait(10), "the test never let the engine go"

    def start(self) -> None:
        self.started.set()

    def down(self) -> None:
        self.downs += 1

    def status(self) -> ClusterStatus:
        return ClusterStatus(name=self.spec.name, state=State.RUNNING, ready_workers=1, desired_workers=1)

    def node_counters(self) -> object:  # pragma: no cover - not read here
        return None


class _Spark:
    """The server's session, as far as the manager uses it here."""

    def stop(self) -> None:
        pass


@pytest.fixture
def manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ClusterManager:
    from raydist.engine.spark import session as spark_side

    _Engine.made = []
    _Engine.gate = threading.Event()
    monkeypatch.setattr(manager_module, "RayCluster", _Engine)
    monkeypatch.setattr(spark_side, "capacity", lambda spark: type("Cap", (), {"cores_per_executor": 1})())
    monkeypatch.setattr(spark_side, "check_fits", lambda *args, **kw: None)
    return ClusterManager(Store(tmp_path / "state.db"), _Spark, lambda name: None)


def _spec(name: str = "c") -> object:
    return spec_to_proto(ClusterSpec(name=name, workers=1))


def _state(manager: ClusterManager, name: str = "c") -> str:
    return manager._store.get(name).state  # what a restarted server reads back


def test_a_delete_while_the_engine_is_built_wins(manager: ClusterManager) -> None:
    manager.create(_spec(), "")
    assert until(lambda: len(_Engine.made) == 1)  # its constructor waits on Spark now
    manager.delete("c", allow_missing=False)
    assert _state(manager) == State.DELETED.value
    _Engine.gate.set()  # Spark answers: the engine is built after the delete
    time.sleep(0.3)
    assert not _Engine.made[0].started.is_set(), "a deleted cluster started"
    assert _state(manager) == State.DELETED.value and "c" not in manager._engines


def test_a_create_over_a_failed_cluster_takes_the_old_engine_down_first(manager: ClusterManager) -> None:
    _Engine.gate.set()
    manager.create(_spec(), "")
    assert until(lambda: _state(manager) == State.RUNNING.value)  # started, and its state written
    old = _Engine.made[0]
    row = manager._store.get("c")
    row.state = State.FAILED.value  # its head died: FAILED, its engine still holds what is left
    manager._store.put(row)
    manager.create(_spec(), "")
    assert until(lambda: len(_Engine.made) == 2 and _Engine.made[1].started.is_set())
    assert old.downs == 1 and manager._engines["c"] is _Engine.made[1]


def test_a_restart_does_not_bring_back_a_cluster_being_deleted(tmp_path: Path, manager: ClusterManager) -> None:
    _Engine.gate.set()
    manager.create(_spec(), "")
    assert until(lambda: _state(manager) == State.RUNNING.value)  # started, and its state written
    row = manager._store.get("c")
    row.state, row.restart = State.DELETING.value, True  # the last server died mid-delete
    manager._store.put(row)
    again = ClusterManager(Store(tmp_path / "state.db"), _Spark, lambda name: None)
    assert again.reconcile() == []
    assert again._store.get("c").state == State.DELETED.value


def test_shutdown_waits_for_a_delete_in_flight(manager: ClusterManager, monkeypatch) -> None:
    _Engine.gate.set()
    manager.create(_spec(), "")
    assert until(lambda: _state(manager) == State.RUNNING.value)  # started, and its state written
    tearing = threading.Event()
    release = threading.Event()

    def slow_down() -> None:
        tearing.set()
        release.wait(10)

    monkeypatch.setattr(_Engine.made[0], "down", slow_down)
    deleting = threading.Thread(target=manager.delete, args=("c", False))
    deleting.start()
    assert tearing.wait(10)
    threading.Timer(0.3, release.set).start()
    manager.shutdown()
    assert _state(manager) == State.DELETED.value  # not DELETING for the next server to find
    deleting.join(10)


def test_a_tenants_quota_bounds_its_live_clusters_and_their_workers(manager: ClusterManager) -> None:
    from raydist.control.tenants import Quota
    from raydist.errors import QuotaExceededError

    _Engine.gate.set()
    quota = Quota(max_clusters=2, max_workers=5)

    def create(name: str, workers: int, **kw: object) -> object:
        return manager.create(spec_to_proto(ClusterSpec(name=name, workers=workers)), "", quota=quota, **kw)

    create("a.team", 2)
    with pytest.raises(QuotaExceededError, match="max_workers = 5") as over:
        create("b.team", 4)  # 2 + 4 > 5
    assert over.value.tenant == "team" and "[tenants.team]" in str(over.value)
    with pytest.raises(QuotaExceededError):
        create("b.team", 4, validate_only=True)  # every check a create makes
    create("b.team", 3)
    with pytest.raises(QuotaExceededError, match="max_clusters = 2"):
        create("c.team", 1)
    create("c.other", 5)  # another tenant's quota is its own
    assert until(lambda: len([e for e in _Engine.made if e.started.is_set()]) == 3)
    manager.delete("a.team", allow_missing=False)
    create("c.team", 2)  # a deleted cluster frees its place
    # Growing a cluster counts too.
    assert until(lambda: manager._engines.get("c.team") is not None)
    with pytest.raises(QuotaExceededError, match="max_workers"):
        manager.update(spec_to_proto(ClusterSpec(name="c.team", min_workers=1, max_workers=3)), ["max_workers"],
                       quota=quota)  # b.team's 3 + 3 > 5


def test_deleted_clusters_are_forgotten_after_their_retention(manager: ClusterManager) -> None:
    import sqlite3

    _Engine.gate.set()
    for name in ("old", "recent", "live"):
        manager.create(_spec(name), "")
    assert until(lambda: len([e for e in _Engine.made if e.started.is_set()]) == 3)
    manager.delete("old", allow_missing=False)
    manager.delete("recent", allow_missing=False)
    with sqlite3.connect(manager._store.path) as db:  # "old" was deleted two days ago
        db.execute("UPDATE clusters SET updated = updated - 2 * 86400 WHERE name = 'old'")
    assert manager.prune_deleted(86400) == ["old"]
    assert manager._store.get("old") is None and manager._store.events("old") == []
    assert [c.spec.name for c in manager.list(0, "")[0]] == ["live", "recent"]
    manager.create(_spec("old"), "")  # the name is free again
    assert until(lambda: _state(manager, "old") == State.RUNNING.value)


def test_past_its_quota_a_tenant_is_told_so_before_spark_is_asked(manager: ClusterManager, monkeypatch) -> None:
    """The quota's answer, not Spark's: a create past a tenant's quota never
    reaches Spark (whose capacity may say no for its own passing reasons)."""
    from raydist.control.tenants import Quota
    from raydist.engine.spark import session as spark_side
    from raydist.errors import CapacityError, QuotaExceededError

    def no_room(*args: object, **kw: object) -> None:
        raise CapacityError("2 workers x 1 CPU", "0 executors of 2 (one was just lost)")

    monkeypatch.setattr(spark_side, "check_fits", no_room)
    with pytest.raises(QuotaExceededError, match="max_workers = 1"):
        manager.create(spec_to_proto(ClusterSpec(name="big.team", workers=2)), "", quota=Quota(max_workers=1))
    with pytest.raises(CapacityError):  # within its quota, Spark's answer
        manager.create(spec_to_proto(ClusterSpec(name="small.team", workers=1)), "", quota=Quota(max_workers=1))
