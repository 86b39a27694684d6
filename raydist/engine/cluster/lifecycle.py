"""A cluster's life: start, resize, failure and teardown.

:class:`ClusterLifecycle` owns what a cluster is made of (its Spark jobs, its
head, its worker slots, its node channel) and the lock that guards them; it
starts them (:meth:`~ClusterLifecycle.launch`), changes their number
(:meth:`~ClusterLifecycle.resize`), ends them on a fault (``_fail``, the one
way) or by request (:meth:`~ClusterLifecycle.down`), and keeps the state and
events. What moves the state is :mod:`raydist.engine.cluster.states`; what the
nodes say is routed by :mod:`raydist.engine.cluster.router`; the user's handle
is :class:`raydist.engine.cluster.RayCluster`.

NB: workers are submitted while the head is still starting; a worker's
supervisor waits for the head's GCS port. Spark's scheduling of the tasks and
the head's start-up overlap, which is most of raydist's lead over starting
them one after the other.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self

from raydist.engine import nodelogs
from raydist.engine.auth import RayToken, load_or_create_token
from raydist.engine.cluster.head import Head
from raydist.engine.cluster.node_jobs import WorkerJobs
from raydist.engine.cluster.outbox import Outbox
from raydist.engine.cluster.scaler import Scaler, elastic
from raydist.engine.cluster.slot import WorkerPool, WorkerSlot
from raydist.engine.cluster.states import from_nodes, teardown_state
from raydist.engine.connection import process_ray
from raydist.engine.link.channel import NodeChannel, NodeLink
from raydist.engine.link.keys import NodeKeys, relay_key
from raydist.engine.link.relay import RelayDialer
from raydist.engine.node.demand import DemandParts
from raydist.engine.node.launch import HEAD_KEY, HEAD_PORTS, node_plans, route_ip
from raydist.engine.node.procs import wait_processes_gone
from raydist.engine.ports import preferred_or_free_port
from raydist.engine.spark import session as spark_side
from raydist.engine.spark.sides import side_of
from raydist.engine.threads import spawn
from raydist.errors import ClusterFailedError, NodeStartTimeoutError
from raydist.paths import logs_dir
from raydist.spec import ClusterSpec, State

if TYPE_CHECKING:

    from pyspark.sql import SparkSession

__all__ = ["ClusterLifecycle", "EventListener"]

log = logging.getLogger("raydist.engine.cluster")

EventListener = Callable[[str, str], None]


class ClusterLifecycle:
    """A Ray cluster's parts and their life; see :class:`~raydist.engine.cluster.RayCluster`."""

    def __init__(
        self,
        spec: ClusterSpec,
        spark: SparkSession,
        *,
        token: RayToken | None = None,
        on_event: EventListener | None = None,
        head_ports: Mapping[str, int] | None = None,
        head_in_task: bool | None = None,
        link_ports: tuple[int, int] | None = None,
    ) -> None:
        self.spec = spec
        self._head_ports = dict(head_ports or {})
        self._link_ports = link_ports
        self._spark = spark
        self._token = token or load_or_create_token()
        self._outbox = Outbox(on_event, f"raydist-{spec.name}") if on_event is not None else None
        self._uid = secrets.token_hex(4)
        self._group = f"raydist-{spec.name}-{self._uid}"
        self._temp_root = os.path.join("/tmp", f"raydist-{self._uid}")
        self._node_keys = NodeKeys()  # the link's secret: it stays in this process
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._launching = threading.RLock()  # held by launch(); down() on its failure path re-enters
        self._state = State.CREATING
        self._message = "starting"
        self._created = time.time()
        self._updated = self._created
        self._events: deque[tuple[float, str]] = deque(maxlen=200)
        # An elastic cluster starts min_workers nodes and follows Ray's demand (engine/cluster/scaler.py).
        self._pool = WorkerPool(spec.required_workers if elastic(spec) else spec.desired_workers)
        self._node_jobs = WorkerJobs(spark, group=self._group, cluster=spec.name, temp_root=self._temp_root,
                                     stopping=self._stopping, on_lost=self._on_worker_lost, record=self._record,
                                     issue=self._node_keys.issue)
        self._scaler = Scaler(self._pool, start=self._node_jobs.start, cancel=self._node_jobs.cancel,
                              record=self._record)
        self._cpus = 0  # CPUs per worker node, once launched
        self._demand = DemandParts()  # an elastic head's readings, put back together
        # A Connect client may be a laptop the executors cannot reach: its
        # head runs in a Spark task, like the workers, and the node links end
        # there (engine/link/relay.py); this process only ever dials out.
        relay = side_of(spark).kind == "connect"
        self._head = Head(in_task=bool(head_in_task), relay=relay)
        self._channel: NodeChannel | None = None
        self._dialer: RelayDialer | None = None
        self.address = ""
        self.client_address = ""
        self.dashboard_url = ""
        self._deadline = time.monotonic() + spec.start_timeout_s

    # What the nodes say arrives through these (raydist.engine.cluster.router).
    def _on_link(self, event: str, link: NodeLink) -> None:
        raise NotImplementedError

    def _on_worker_lost(self, slot: WorkerSlot, reason: str) -> bool:
        raise NotImplementedError

    def _on_head_job_end(self, reason: str) -> None:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return self.spec.name

    def launch(self) -> Self:
        """Start the head and submit the workers' Spark jobs; returns at once.
        :meth:`wait_head` and :meth:`wait_ready` wait for them (``start`` is
        both). Raises CapacityError, with nothing started, when Spark can
        never fit the cluster."""
        spec = self.spec
        cap = spark_side.capacity(self._spark)
        cpus = spec.cpus_per_worker or cap.cores_per_executor
        spark_side.check_fits(spec, cap, head_in_task=self._head.in_task, cpus=cpus)
        self._deadline = time.monotonic() + spec.start_timeout_s
        # down() waits for a launch in progress, and a launch after down()
        # starts nothing: a delete while the head starts leaves no node behind.
        with self._launching:
            if self._stopping.is_set():
                raise ClusterFailedError(f"cluster {self.name!r} was torn down while it started")
            try:
                self._launch(cap, cpus)
            except BaseException:
                self.down()
                raise
        return self

    def wait_head(self) -> None:
        """After :meth:`launch`: block until the head is up, so that clients
        can connect while the workers still start (their work waits for the
        workers' resources). Tears the cluster down and raises
        ClusterFailedError when the head does not start."""
        with self._changed:
            while not self._head.up and not self._state.terminal and time.monotonic() < self._deadline:
                if self._head.gone():
                    break
                self._changed.wait(0.5)
            up = self._head.up
        if not up:
            self.wait_ready()  # raises what went wrong, after teardown

    def wait_ready(self) -> None:
        """After :meth:`launch`: block until ``min_workers`` are up. On
        failure or timeout the cluster is torn down and the error raised."""
        try:
            self._wait_ready(self._deadline)
        except BaseException:
            self.down()
            raise

    def down(self, timeout: float = 60.0) -> None:
        """Tear the cluster down; returns once its Ray processes are gone.

        Idempotent. Stops every node through its supervisor at once, cancels
        the cluster's Spark jobs, and waits for the supervisors to report that
        their process trees are gone.
        """
        with self._lock:
            begin = teardown_state(self._state)
            if begin is None:
                return
            failed = begin == State.FAILED
        # This process lets go of the cluster before its nodes stop: Ray's
        # core worker would otherwise dial the dead GCS, then end the process.
        process_ray().cluster_gone(self, self.address)
        with self._lock:
            self._stopping.set()
            if not failed:
                self._set_state(State.DELETING, "tearing down")
        with self._launching:
            pass  # a launch in progress finishes first; what it started is torn down below
        deadline = time.monotonic() + timeout
        channel = self._channel
        if channel is not None:
            # Before the nodes stop and their temp dirs go.
            if (kept := nodelogs.keep_run(logs_dir(), self.name, channel.links())) is not None:
                self._record(f"nodes' logs kept in {kept} (raydist logs NAME --run {kept.name})")
            # The whole cluster goes, this process disconnected already: no
            # node has anything left to drain, so none waits for Ray's
            # graceful stop (the Spark slots come back at once).
            channel.stop_all(hard=True)
        self._head.wait_stopped(deadline)
        if channel is not None:
            for link in channel.links().values():
                link.closed.wait(max(0.0, deadline - time.monotonic()))
        side_of(self._spark).cancel(group=self._group)
        self._node_jobs.close(deadline)
        thread = self._head.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.1, deadline - time.monotonic()))
        if channel is not None:
            channel.close()
        if self._dialer is not None:
            self._dialer.close()
        if wait_processes_gone(f"raydist-{self._uid}", deadline):
            log.warning("cluster %s: some local Ray processes outlived the teardown deadline", self.name)
        shutil.rmtree(self._temp_root, ignore_errors=True)
        for slot in self._pool.every():
            shutil.rmtree(self._node_jobs.temp_dir(slot), ignore_errors=True)
        with self._lock:
            for slot in self._pool.every():
                slot.up = False
            self._head.up = False
            if failed:
                self._record(f"torn down after failure: {self._message}")
            else:
                self._set_state(State.DELETED, "deleted")
        if self._outbox is not None:
            self._outbox.close()

    def resize(self, workers: int | None = None, *, min_workers: int | None = None,
               max_workers: int | None = None, idle_timeout_s: float | None = None) -> None:
        """Change the cluster's size while it runs: ``workers`` for a fixed
        size, or the elastic bounds and idle timeout. Nodes are added or
        removed at once (removal prefers nodes that are not up yet, then the
        newest); Spark's capacity is checked first (CapacityError)."""
        changes: dict[str, Any] = {k: v for k, v in (("workers", workers), ("min_workers", min_workers),
                                                       ("max_workers", max_workers),
                                                       ("idle_timeout_s", idle_timeout_s)) if v is not None}
        if workers is None and ("min_workers" in changes or "max_workers" in changes):
            changes.setdefault("min_workers", self.spec.required_workers)
            changes.setdefault("max_workers", self.spec.desired_workers)
            changes["workers"] = None
        spec = self.spec.replace(**changes)
        cap = spark_side.capacity(self._spark)
        spark_side.check_fits(spec, cap, head_in_task=self._head.in_task, cpus=self._cpus)
        with self._lock:
            if self._stopping.is_set() or self._state.terminal:
                raise ClusterFailedError(f"cluster {self.name!r} is {self._state.value}: it cannot be resized")
            self.spec = spec
            active = len(self._pool.active())
            target = spec.desired_workers if not elastic(spec) else min(max(active, spec.required_workers),
                                                                         spec.desired_workers)
            self._scale(target, "resized by request")

    def _scale(self, target: int, reason: str, prefer: tuple[str, ...] = ()) -> None:
        """Run ``target`` worker nodes (called with the lock held)."""
        self._scaler.scale(target, reason, prefer)
        self._refresh_state()

    def _launch(self, cap: spark_side.SparkCapacity, cpus: int) -> None:
        spec = self.spec
        driver_ip = route_ip(side_of(self._spark).driver_host())
        # Behind a relay nothing dials this process: its channel listens on
        # loopback only and adopts the connections it dials out.
        self._channel = NodeChannel("127.0.0.1" if self._head.relay else driver_ip, self._node_keys,
                                    self._on_link, ports=None if self._head.relay else self._link_ports)
        if self._head.in_task:
            head_ip, ports = "", dict(self._head_ports)  # the head's task picks its host's ports
        else:
            head_ip, taken = driver_ip, set()
            ports = {name: preferred_or_free_port(head_ip, self._head_ports.get(name), taken)
                     for name in HEAD_PORTS}
            self._set_addresses(head_ip, ports)
        head, self._node_jobs.plan = node_plans(
            spec, cap, cpus, head_ip=head_ip, ports=ports, channel=(driver_ip, self._channel.port),
            head_node_secret=self._node_keys.issue(HEAD_KEY), secret_env=self._token.env(), temp_dir=self._temp_root,
        )
        self._record("submitting the head's Spark task" if self._head.in_task else f"starting head at {self.address}")
        self._head.start(dataclasses.replace(head, relay=self._head.relay), spark=self._spark, group=self._group,
                         cluster=self.name, head_cpus=spec.head_cpus, head_gpus=spec.head_gpus,
                         on_job_end=self._on_head_job_end)
        try:
            self._node_jobs.profile = spark_side.resource_profile(self._spark, cpus, spec.gpus_per_worker)
        except Exception as exc:  # noqa: BLE001 - stage-level scheduling is optional
            log.info("no stage-level scheduling (%s); using the default task resources", exc)
        if self._head.relay:
            self._dial_relay()  # the workers' plans name the relay: they wait for it
        self._cpus = cpus
        with self._lock:
            for slot in self._pool.active():
                self._node_jobs.start(slot)  # once a slot: one resized in before launch is started already
        self._node_jobs.begin()
        if elastic(spec) and len(self._pool.active()) < spec.desired_workers:
            self._node_jobs.prestart(cap.executors)  # nodes added later skip Spark's Python worker start

    def _dial_relay(self) -> None:
        """Wait for the head's task to say where its relay and GCS listen,
        then link to the relay. The workers' supervisors connect there too,
        and start their nodes as soon as the GCS listens."""
        address, gcs = self._head.wait_relay(self._deadline)
        if not address:
            raise ClusterFailedError(self._message if self._state == State.FAILED else
                                     f"the head's Spark task did not start within {self.spec.start_timeout_s:g} s")
        host, port = address.rsplit(":", 1)
        assert self._node_jobs.plan is not None
        self._node_jobs.plan = dataclasses.replace(self._node_jobs.plan, channel=(host, int(port)), gcs_address=gcs)
        assert self._channel is not None
        self._dialer = RelayDialer((host, int(port)), relay_key(self._node_keys.issue(HEAD_KEY)), self._channel.adopt)
        self._record(f"node links through the head's relay at {address}")

    def _set_addresses(self, head_ip: str, ports: Mapping[str, int]) -> None:
        self.address = f"{head_ip}:{ports['gcs']}"
        self.client_address = f"ray://{head_ip}:{ports['client']}"
        self.dashboard_url = f"http://{head_ip}:{ports['dashboard']}" if self.spec.dashboard else ""

    def _wait_ready(self, deadline: float) -> None:
        with self._changed:
            while self._state == State.CREATING:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if self._head.gone() and not self._head.up:
                    break
                self._changed.wait(min(left, 0.5))
            if self._state in (State.RUNNING, State.DEGRADED):
                return
            if self._stopping.is_set() and self._state != State.FAILED:
                raise ClusterFailedError(f"cluster {self.name!r} was torn down while it started")
            if not self._head.up:
                # Why, when it is known (its supervisor's exit code, its Spark
                # task's error), then what `ray start` said.
                why = f" ({self._message})" if self._state == State.FAILED else ""
                raise ClusterFailedError(
                    f"the Ray head of {self.name!r} did not start{why}:\n  " + "\n  ".join(self._head.tail())
                )
            if self._state == State.FAILED:
                raise ClusterFailedError(self._message)
            pending = {
                s.key: s.log_tail() or ["no Spark task started for this node (no free task slot?)"]
                for s in self._pool.active()
                if not s.up
            }
            raise NodeStartTimeoutError(
                expected=self.spec.required_workers,
                started=sum(s.up for s in self._pool.active()),
                timeout=self.spec.start_timeout_s,
                pending=pending,
            )

    def _fail(self, message: str) -> None:
        """The one way a fault ends the cluster (called with the lock held):
        FAILED, saying why, then torn down off this thread (the caller may be
        a thread the teardown waits for, such as the node link's)."""
        self._set_state(State.FAILED, message)
        spawn(self.down, name=f"raydist-{self.name}-failed")

    def _refresh_state(self, reason: str = "") -> None:
        """Derive RUNNING/DEGRADED from the nodes (called with the lock held)."""
        if reason:
            self._record(reason)
        active = self._pool.active()
        moved = from_nodes(self._state, head_up=self._head.up, up=sum(s.up for s in active), active=len(active),
                           required=self.spec.required_workers, reason=reason)
        if moved is not None:
            self._set_state(*moved)

    def _set_state(self, state: State, message: str) -> None:
        changed = state != self._state
        self._state = state
        self._message = message
        self._updated = time.time()
        if changed:
            self._record(f"{state.value}: {message}")
        self._changed.notify_all()

    def _record(self, message: str) -> None:
        with self._lock:
            self._events.append((time.time(), message))
            self._changed.notify_all()
            state = self._state.value
        log.info("cluster %s: %s", self.name, message)
        if self._outbox is not None:
            self._outbox.put(state, message)  # delivered off this cluster's lock (see engine.outbox)
