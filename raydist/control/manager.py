"""Many named clusters on the control plane's SparkSession, or on a tenant's
own Spark application (:mod:`raydist.control.sparkhost`), with durable state:
the manager starts and tears down ``RayCluster`` objects off the event loop,
writes every state change and event to the store, and keeps each cluster's
proto ready (:mod:`raydist.control.protos`) so that reads never touch SQLite."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from raydist.control.protos import ClusterProtos, ts
from raydist.control.reach import ClusterReach
from raydist.control.recovery import ClusterRecovery
from raydist.control.sparkhost import SparkHost
from raydist.control.store import ClusterRow, Store
from raydist.control.tenants import Quota, owner_of
from raydist.engine.auth import RayToken
from raydist.engine.cluster import RayCluster
from raydist.engine.cluster.slot import NodeCounters
from raydist.errors import (
    ClusterExistsError,
    ClusterNotFoundError,
    ClusterNotReadyError,
    QuotaExceededError,
    SpecError,
)
from raydist.spec import ClusterSpec, State, check_name, spec_from_proto, spec_to_proto

__all__ = ["ClusterManager", "ts"]

#: The spec fields UpdateCluster changes on a running cluster.
_UPDATABLE = ("workers", "min_workers", "max_workers", "idle_timeout_s")

log = logging.getLogger(__name__)


#: How soon a cluster's node changes reach its cached status (state changes: at once).
_SYNC_S = 0.1
#: How long shutdown waits for each delete in flight.
_DELETE_WAIT_S = 60.0



class ClusterManager(ClusterReach, ClusterRecovery):
    """The control plane's clusters: engine objects, store rows, cached protos."""

    def __init__(self, store: Store, spark_factory: Callable[[], Any], on_change: Callable[[str], None], *,
                 head_ports: Mapping[str, int] | None = None, head_in_task: bool = True,
                 link_ports: tuple[int, int] | None = None,
                 tenant_sparks: Mapping[str, Callable[[], Any]] | None = None) -> None:
        from raydist._proto import pb

        self._pb = pb
        self._store = store
        self.spark_host = SparkHost(spark_factory)
        #: Tenants with a Spark application of their own (``spark_remote``):
        #: their clusters run there, never on the control plane's.
        self.tenant_hosts = {tenant: SparkHost(factory, f"tenant {tenant}'s Spark application")
                             for tenant, factory in (tenant_sparks or {}).items()}
        self._on_change = on_change
        # Writers' lock (store rows, engines, cache entries); never taken by a
        # read, so no read waits on SQLite or a cluster's lock.
        self._lock = threading.RLock()
        self._engines: dict[str, RayCluster] = {}
        # Creates whose engine is not registered yet (name -> their row's
        # created time): a delete or a newer create in between cancels them.
        self._starting: dict[str, float] = {}
        self._deleting: dict[str, threading.Event] = {}  # deletes in flight (set when done), waited for at shutdown
        self._protos = ClusterProtos(pb, on_change)
        self._cache = self._protos.by_name  # read without a lock (see ClusterProtos)
        self._dirty: set[str] = set()  # clusters to sync soon
        self._dirty_cond = threading.Condition()
        self._syncer: threading.Thread | None = None
        self._head_ports = dict(head_ports or {})
        self._heads_in_tasks = head_in_task
        self._link_ports = link_ports

    def host_of(self, name: str) -> SparkHost:
        """The Spark that the cluster the engine calls ``name`` runs on: its
        owner's own application, else the control plane's."""
        return self.tenant_hosts.get(owner_of(name), self.spark_host)

    def hosts(self) -> list[SparkHost]:
        """Every Spark this control plane holds, its own first."""
        return [self.spark_host, *self.tenant_hosts.values()]

    def _head_in_task(self, name: str) -> bool:
        # A tenant's own application is a Connect server: no driver here to hold a head.
        return self._heads_in_tasks or owner_of(name) in self.tenant_hosts

    # reads (from memory) ----------------------------------------------------

    def get(self, name: str) -> Any:
        check_name(name, full=True)
        msg = self._cache.get(name)  # never the writers' lock: reads answer while a write waits on SQLite
        if msg is None:
            raise ClusterNotFoundError(name)
        return msg

    def _check_quota(self, name: str, workers: int, quota: Quota) -> None:
        """Whether ``name``'s owner may have one more live cluster of (at
        most) ``workers`` workers, ``name`` not counted as it is now. Called
        with the writers' lock held: two creates cannot both take the last place."""
        pb = self._pb
        owner = owner_of(name)
        live = [msg for other, msg in dict(self._cache).items()
                if other != name and owner_of(other) == owner and msg.state not in (pb.DELETED, pb.FAILED)]
        if len(live) + 1 > quota.max_clusters:
            raise QuotaExceededError(owner, "max_clusters", quota.max_clusters,
                                     f"it has {len(live)} live clusters")
        held = sum(int(msg.spec.max_workers) for msg in live)
        if held + workers > quota.max_workers:
            raise QuotaExceededError(owner, "max_workers", quota.max_workers,
                                     f"its other clusters may grow to {held} workers, and this one asks for {workers}")

    def update(self, spec_msg: Any, paths: list[str], who: str = "", quota: Quota | None = None) -> Any:
        """UpdateCluster (AIP-134): change the fields ``paths`` names (of
        ``_UPDATABLE``) of a running cluster to ``spec_msg``'s values."""
        name = check_name(spec_msg.name, "spec.name", full=True)
        if not paths:
            raise SpecError("update_mask", [], f"name the fields to change: {', '.join(_UPDATABLE)}")
        changes: dict[str, Any] = {}
        for path in paths:  # the whole mask first, then the values it names
            if path not in _UPDATABLE:
                raise SpecError("update_mask", path, f"the fields a running cluster takes are {', '.join(_UPDATABLE)}")
        for path in paths:
            if path != "idle_timeout_s" and not spec_msg.HasField(path):
                raise SpecError(path, None, f"update_mask names {path}: give it a value in spec")
            changes[path] = getattr(spec_msg, path)
        with self._lock:
            row = self._store.get(name)
            if row is None or row.state == State.DELETED.value:
                raise ClusterNotFoundError(name)
            engine = self._engines.get(name)
            if quota is not None and ("workers" in changes or "max_workers" in changes):
                ceiling = int(ClusterSpec.from_dict(row.spec).max_workers or 0)  # the most it may grow to
                if "max_workers" in changes:
                    ceiling = int(changes["max_workers"])
                elif "workers" in changes:
                    ceiling = max(ceiling, int(changes["workers"]))
                self._check_quota(name, ceiling, quota)
        if engine is None or row.state not in (State.RUNNING.value, State.DEGRADED.value, State.CREATING.value):
            raise ClusterNotReadyError(f"cluster {name!r} is {row.state}: only a live cluster can be resized")
        engine.resize(**changes)
        with self._lock:
            row = self._store.get(name)
            if row is not None:
                row.spec = engine.spec.to_dict()
                self._store.put(row)
                if who:
                    said = ", ".join(f"{k}={v}" for k, v in changes.items())
                    self._store.add_event(name, row.state, f"{said}, asked by {who}")
        self._sync(name)
        return self.get(name)

    def list(self, page_size: int, page_token: str, visible: Callable[[str], bool] = lambda _name: True,
             full_name: Callable[[str], str] = lambda name: name) -> tuple[list[Any], str]:
        """A page of the clusters ``visible`` lets through, by name, after
        ``page_token`` (the last name of the page before, which
        ``full_name`` makes the engine's), and the next page's token (""
        after the last)."""
        if page_size < 0 or page_size > 1000:
            raise SpecError("page_size", page_size, "expected 0 (default 100) to 1000")
        if page_token:
            page_token = check_name(full_name(page_token), "page_token", full=True)
        size = page_size or 100
        cache = dict(self._cache)  # a snapshot, without the writers' lock
        names = sorted(n for n in cache if n > page_token and visible(n))
        page = [cache[n] for n in names[:size]]
        token = names[size - 1] if len(names) > size else ""
        return page, token

    def count(self, visible: Callable[[str], bool] = lambda _name: True) -> int:
        return sum(1 for name in dict(self._cache) if visible(name))

    def states(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for msg in list(dict(self._cache).values()):
            name = self._pb.State.Name(msg.state)
            out[name] = out.get(name, 0) + 1
        return out

    def node_counters(self) -> dict[str, NodeCounters]:
        """Each running cluster's worker-node history (for the metrics)."""
        engines = dict(self._engines)
        return {name: engine.node_counters() for name, engine in engines.items()}

    # writes ----------------------------------------------------------------

    def create(self, spec_msg: Any, request_id: str, *, validate_only: bool = False, who: str = "",
               quota: Quota | None = None) -> Any:
        """Create a cluster from its proto; returns it in CREATING at once.
        ``validate_only``: every check a create makes, nothing created.
        ``who`` asked (recorded in the cluster's first event); ``quota``: its
        owner's (QuotaExceededError past it; None: no limit)."""
        spec = spec_from_proto(spec_msg)
        if len(request_id) > 128 or not request_id.isascii() or not request_id.isprintable():
            raise SpecError("request_id", request_id[:40], "expected at most 128 printable ASCII characters")
        if spec.spark_conf:
            raise SpecError(
                "spark_conf", sorted(spec.spark_conf),
                "the control plane's SparkSession runs already: give Spark settings to `raydist serve` "
                "(--spark-conf or [spark.conf] in raydist.toml)",
            )
        restart = bool(spec_msg.restart_on_server_restart)
        existing = self._store.get(spec.name)
        retry = (
            existing is not None
            and bool(request_id)
            and existing.request_id == request_id
            and existing.state not in (State.DELETED.value, State.FAILED.value)
        )
        if quota is not None and not retry:
            # Past its quota, a tenant is told so before anything asks Spark:
            # the answer does not depend on what Spark has now, and an
            # over-quota create costs the control plane no call to it.
            # (Checked again below, under the lock, with the row written.)
            with self._lock:
                self._check_quota(spec.name, int(spec.max_workers or 0), quota)
        if not retry:
            # A cluster Spark can never fit is RESOURCE_EXHAUSTED now, not a
            # FAILED state later (the first create waits for Spark to start).
            # Only a retry of a live create skips the check (it was done).
            from raydist.engine.spark import session as spark_side

            cap = spark_side.capacity(self.host_of(spec.name).session)
            spark_side.check_fits(spec, cap, head_in_task=self._head_in_task(spec.name))
        with self._lock:
            row = self._store.get(spec.name)
            if row is not None and row.state not in (State.DELETED.value, State.FAILED.value):
                if request_id and row.request_id == request_id:
                    return self._cache[spec.name]
                if row.spec == spec.to_dict():
                    detail = "it is already running with this spec; use another name or delete it first"
                else:
                    detail = "with another spec; delete it first or pick another name"
                raise ClusterExistsError(spec.name, detail)
            if quota is not None:
                self._check_quota(spec.name, int(spec.max_workers or 0), quota)
            if validate_only:
                return self._pb.Cluster(spec=spec_to_proto(spec), desired_workers=spec.desired_workers,
                                        message="valid; nothing created (validate_only)")
            row = ClusterRow(name=spec.name, spec=spec.to_dict(), state=State.CREATING.value, message="accepted",
                             desired_workers=spec.desired_workers, request_id=request_id, restart=restart,
                             owner=owner_of(spec.name))
            # A FAILED cluster's engine may still hold processes: the new one
            # starts after it is down, never beside it.
            failed_engine = self._engines.pop(spec.name, None)
            self._store.put(row)
            self._store.add_event(spec.name, row.state, f"accepted from {who}" if who else "accepted")
            self._refresh(row)
            self._starting[spec.name] = row.created
        threading.Thread(target=self._start, args=(spec, row, failed_engine), name=f"raydist-create-{spec.name}",
                         daemon=True).start()
        return self.get(spec.name)

    def _start(self, spec: ClusterSpec, row: ClusterRow, before: RayCluster | None = None) -> None:
        """Start ``row``'s engine (after ``before``, the engine it replaces, is
        down). A delete that came first wins: the engine is registered only
        while the row is still this create's, and never starts otherwise."""
        if before is not None:
            try:
                before.down()
            except Exception:  # noqa: BLE001 - the new cluster starts all the same
                log.exception("tearing down the failed %s before its new start", spec.name)

        def on_event(state: str, message: str) -> None:
            self._store.add_event(spec.name, state, message)
            cached = self._cache.get(spec.name)
            if cached is None or self._pb.State.Name(cached.state) != state:
                self._sync(spec.name)  # a new state is seen with its event
            else:
                self._sync_soon(spec.name)  # node changes: a thousand nodes starting are not a thousand syncs

        try:
            # A token of its own: a user of one cluster cannot reach another.
            engine = RayCluster(spec, self.host_of(spec.name).session, token=RayToken.generate(), on_event=on_event,
                                head_ports=self._head_ports, head_in_task=self._head_in_task(spec.name),
                                link_ports=self._link_ports)
            with self._lock:
                if self._starting.get(spec.name) != row.created:
                    log.info("cluster %s was deleted or replaced before it started; not starting it", spec.name)
                    return
                del self._starting[spec.name]
                self._engines[spec.name] = engine
            engine.start()
        except Exception as exc:  # noqa: BLE001 - the reason goes to the store and the watchers
            log.warning("cluster %s failed to start: %s", spec.name, exc)
            with self._lock:
                if self._starting.get(spec.name) == row.created:
                    del self._starting[spec.name]
            self._fail(spec.name, str(exc), engine_of=row.created)
            return
        self._sync(spec.name)

    def _sync_soon(self, name: str) -> None:
        """Sync ``name`` within :data:`_SYNC_S` (many calls, one sync)."""
        with self._dirty_cond:
            self._dirty.add(name)
            if self._syncer is None:
                self._syncer = threading.Thread(target=self._sync_dirty, name="raydist-sync", daemon=True)
                self._syncer.start()
            self._dirty_cond.notify()

    def _sync_dirty(self) -> None:
        while True:
            with self._dirty_cond:
                while not self._dirty:
                    self._dirty_cond.wait()
            time.sleep(_SYNC_S)
            with self._dirty_cond:
                names, self._dirty = self._dirty, set()
            for name in names:
                try:
                    self._sync(name)
                except Exception:  # noqa: BLE001 - the next change syncs it again
                    log.exception("syncing cluster %s", name)

    def _sync(self, name: str) -> None:
        """Copy an engine's observed status into the store and the cache."""
        with self._lock:
            engine = self._engines.get(name)
            row = self._store.get(name)
            if engine is None or row is None:
                return
            st = engine.status()
            row.state = st.state.value
            row.message = st.message
            row.ready_workers = st.ready_workers
            row.desired_workers = st.desired_workers
            self._protos.observed(name, st.idle_workers, st.nodes)
            row.address, row.client_address, row.dashboard_url = st.address, st.client_address, st.dashboard_url
            self._store.put(row)
            self._refresh(row)

    def delete(self, name: str, allow_missing: bool, who: str = "") -> Any:
        """Tear cluster ``name`` down; ``who`` asked (recorded in its events)."""
        check_name(name, full=True)
        with self._lock:
            row = self._store.get(name)
            if row is None or row.state == State.DELETED.value:
                if allow_missing or row is not None:
                    return self._cache.get(name) or self._pb.Cluster(
                        spec=self._pb.ClusterSpec(name=name), state=self._pb.DELETED
                    )
                raise ClusterNotFoundError(name)
            engine = self._engines.pop(name, None)
            self._starting.pop(name, None)  # a start not registered yet never starts
            done = self._deleting[name] = threading.Event()
            row.state = State.DELETING.value
            row.message = "tearing down"
            self._store.put(row)
            self._store.add_event(name, row.state, f"tearing down, asked by {who}" if who else row.message)
            self._refresh(row)
        try:
            if engine is not None:
                engine.down()
        finally:
            with self._lock:
                row = self._store.get(name) or row
                row.state, row.message, row.ready_workers = State.DELETED.value, "deleted", 0
                row.address = row.client_address = row.dashboard_url = ""
                self._store.put(row)
                self._store.add_event(name, row.state, row.message)
                self._refresh(row)
                if self._deleting.get(name) is done:
                    del self._deleting[name]
                done.set()
        return self.get(name)

    def prune_deleted(self, max_age_s: float) -> list[str]:
        """Forget clusters DELETED more than ``max_age_s`` ago (row, events,
        cached proto): a List or a name's reuse never walks years of them."""
        gone = []
        with self._lock:
            for name in self._store.deleted_before(time.time() - max_age_s):
                if name in self._engines or name in self._starting:
                    continue  # created again meanwhile
                self._store.forget(name)
                self._protos.forget(name)
                gone.append(name)
        return gone

    def events_after(self, name: str, after_id: int) -> list[tuple[int, float, str, str]]:
        return self._store.events(name, after_id)

    def last_event_id(self, name: str) -> int:
        return self._store.last_event_id(name)

    # restart and shutdown ---------------------------------------------------

    def _fail(self, name: str, message: str, engine_of: float | None = None) -> None:
        """Mark ``name`` FAILED with ``message``; ``engine_of``: only if its row
        is still the one created then (not one a later create made)."""
        with self._lock:
            current = self._store.get(name)
            if engine_of is not None and (current is None or current.created != engine_of):
                return
            self._engines.pop(name, None)
            if current is not None and current.state not in (State.DELETED.value, State.DELETING.value):
                current.state = State.FAILED.value
                current.message = message[:2000]
                self._store.put(current)
                self._store.add_event(name, current.state, current.message)
                self._refresh(current)

    def _ended(self, row: ClusterRow, *, back: str, failed: str, refresh: bool = True) -> bool:
        """A cluster whose processes are gone though nobody deleted it:
        CREATING with ``back`` when its spec asks to come back (True), else
        FAILED with ``failed``; written to the store with its event."""
        if row.restart:
            row.state, row.message = State.CREATING.value, back
        else:
            row.state, row.message = State.FAILED.value, failed
        row.ready_workers = 0
        row.address = row.client_address = row.dashboard_url = ""
        self._store.put(row)
        self._store.add_event(row.name, row.state, row.message)
        if refresh:
            self._refresh(row)
        return row.restart

    def shutdown(self) -> None:
        """Stop every cluster's processes. A cluster whose spec asks to come
        back stays CREATING in the store (the next server starts it again);
        the others are FAILED with the reason, not DELETED: nobody deleted
        them."""
        with self._lock:
            engines, self._engines = dict(self._engines), {}
            self._starting.clear()  # starts not registered yet never start
            deleting = list(self._deleting.values())
        for done in deleting:  # a delete in flight ends DELETED, not left DELETING for the next server
            done.wait(_DELETE_WAIT_S)
        for name, engine in engines.items():
            try:
                engine.down()
            except Exception:  # noqa: BLE001 - tear down as much as possible
                log.exception("tearing down %s", name)
            with self._lock:
                row = self._store.get(name)
                if row is None or row.state in (State.DELETED.value, State.DELETING.value):
                    continue
                self._ended(row, back="stopped with the control plane; starts again with it",
                            failed="the control plane stopped, and its clusters with it")
        # A Spark start still in progress finishes first (it holds the lock),
        # then stops: a SparkContext left running keeps this process alive.
        for host in self.hosts():
            spark = host.lose("the control plane is stopping")
            if spark is not None:
                try:
                    spark.stop()
                except Exception:  # noqa: BLE001 - the other sessions stop all the same
                    log.exception("stopping %s", host.label)

    def _refresh(self, row: ClusterRow) -> None:
        with self._lock:
            self._protos.refresh(row)
