"""RayCluster: one Ray cluster on one SparkSession.

The head runs on the driver; each worker node is one long-running Spark task,
submitted as its own Spark job (decision 2 of the design: a lost executor then
costs one node, which is submitted again, instead of failing a barrier job).
All jobs of a cluster share a job group, so teardown is one cancel.

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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from raydist.engine import nodelogs
from raydist.engine import spark as spark_side
from raydist.engine.auth import RayToken, load_or_create_token
from raydist.engine.channel import NodeChannel, NodeLink
from raydist.engine.connection import process_ray
from raydist.engine.demand import DemandParts
from raydist.engine.head import Head
from raydist.engine.launch import HEAD_KEY, HEAD_PORTS, node_plans, route_ip
from raydist.engine.linkauth import NodeKeys, relay_key
from raydist.engine.outbox import Outbox
from raydist.engine.ports import gcs_host, preferred_or_free_port
from raydist.engine.procs import wait_processes_gone
from raydist.engine.relay import RelayDialer
from raydist.engine.scaler import Scaler, elastic
from raydist.engine.sides import side_of
from raydist.engine.slot import NodeCounters, WorkerPool, WorkerSlot
from raydist.engine.spark_jobs import WorkerJobs
from raydist.engine.sparkside import missing_raydist
from raydist.engine.threads import spawn
from raydist.errors import ClusterFailedError, ClusterNotReadyError, NodeStartTimeoutError, SpecError
from raydist.jobs import Jobs
from raydist.paths import logs_dir
from raydist.spec import ClusterSpec, ClusterStatus, State

if TYPE_CHECKING:

    from pyspark.sql import SparkSession

__all__ = ["HEAD_PORTS", "RayCluster"]

log = logging.getLogger(__name__)

EventListener = Callable[[str, str], None]


#: Ray Client connections tried before giving up, and the errors of its
#: proxy worth another try (it lost the server process it started).
_CLIENT_TRIES = 3
_CLIENT_SERVER_FLAKES = ("Starting Ray client server failed", "ZombieProcess")


class RayCluster:
    """A Ray cluster whose head is this driver and whose workers are Spark tasks.

    Use :func:`raydist.up` rather than constructing it directly. The handle is a
    context manager: leaving the ``with`` block tears the cluster down.
    ``head_ports`` pins head ports by name (``gcs``, ``client``,
    ``dashboard``) when they are free, so a Service or firewall rule can name
    them; the others are free ports. ``head_in_task`` runs the head in a Spark
    task of its own instead of on the driver (the control plane does: no
    tenant code then runs in its process tree, where its secrets are); by
    default it does on a Spark Connect session only.

    Attributes:
        spec: the desired cluster.
        address: the GCS address (``host:port``) for ``ray.init``.
        client_address: the Ray Client address (``ray://host:port``).
        dashboard_url: the Ray dashboard (also the Ray Jobs API); empty
            unless the spec asks for a dashboard.
    """

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
        self._link_keys = NodeKeys()  # the link's secret: it stays in this process
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._launching = threading.RLock()  # held by launch(); down() on its failure path re-enters
        self._state = State.CREATING
        self._message = "starting"
        self._created = time.time()
        self._updated = self._created
        self._events: deque[tuple[float, str]] = deque(maxlen=200)
        # An elastic cluster starts min_workers nodes and follows Ray's demand (engine/scaler.py).
        self._pool = WorkerPool(spec.required_workers if elastic(spec) else spec.desired_workers)
        self._jobs = WorkerJobs(spark, group=self._group, cluster=spec.name, temp_root=self._temp_root,
                                stopping=self._stopping, on_lost=self._on_worker_lost, record=self._record,
                                issue=self._link_keys.issue)
        self._scaler = Scaler(self._pool, start=self._jobs.start, cancel=self._jobs.cancel, record=self._record)
        self._cpus = 0  # CPUs per worker node, once launched
        self._demand = DemandParts()  # an elastic head's readings, put back together
        # A Connect client may be a laptop the executors cannot reach: its
        # head runs in a Spark task, like the workers, and the node links end
        # there (engine/relay.py); this process only ever dials out.
        relay = side_of(spark).kind == "connect"
        self._head = Head(in_task=bool(head_in_task), relay=relay)
        self._channel: NodeChannel | None = None
        self._dialer: RelayDialer | None = None
        self.address = ""
        self.client_address = ""
        self.dashboard_url = ""
        self._deadline = time.monotonic() + spec.start_timeout_s

    # ------------------------------------------------------------------ API

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def token(self) -> RayToken:
        """The cluster's Ray auth token (its repr hides the value)."""
        return self._token

    @property
    def state(self) -> State:
        return self._state

    @property
    def spark(self) -> SparkSession:
        """The SparkSession whose executors host the worker nodes."""
        return self._spark

    @property
    def job_group(self) -> str:
        """The Spark job group of the cluster's worker jobs."""
        return self._group

    @property
    def head_holds_slot(self) -> bool:
        """Whether the head runs in a Spark task (Connect) rather than on the driver."""
        return self._head.in_task

    def env(self) -> dict[str, str]:
        """Environment for a subprocess that should use this cluster
        (``RAY_ADDRESS`` and the auth token)."""
        return {"RAY_ADDRESS": self.address, **self._token.env()}

    def jobs(self) -> Jobs:
        """This cluster's Ray jobs (it needs ``dashboard=True``)."""
        return Jobs(self.name, self.dashboard_url, self._token.reveal())

    def submit(self, entrypoint: str | Sequence[str], **options: Any) -> str:
        """Submit a Ray job (``Jobs.submit``: working_dir, pip, env); returns its id."""
        return self.jobs().submit(entrypoint, **options)

    def export_env(self) -> None:
        """Make this cluster this process's default Ray cluster, as
        ``ray.util.spark.setup_ray_cluster`` does: ``RAY_ADDRESS`` and the
        token go into ``os.environ``, so ``ray.init()``, ``ray.init(address)``,
        ``ray.init(client_address)`` and subprocesses started later all reach
        it with no other call. The newest cluster still up is the default;
        when the last goes, the environment is what it was before
        (:mod:`raydist.engine.connection`)."""
        process_ray().make_default(self, self.env())

    def connect(self, **init_kwargs: Any) -> Any:
        """``ray.init`` against this cluster from this process, with its
        token (nothing to do when connected to it already). ``down()``
        disconnects first. From a host that runs none of the cluster's nodes
        (a Spark Connect client off the cluster) the connection goes through
        Ray Client: a direct Ray driver needs a node on its own host, and the
        nodes would dial it."""
        if self._node_on_this_host():
            return process_ray().connect(self.address, self._token, **init_kwargs)
        for _ in range(_CLIENT_TRIES - 1):
            try:
                return process_ray().connect(self.address, self._token, target=self.client_address, **init_kwargs)
            except ConnectionAbortedError as exc:
                # Ray Client's proxy sometimes loses the server process it just
                # started for this client; the next attempt starts another.
                if not any(f in str(exc) for f in _CLIENT_SERVER_FLAKES):
                    raise
                log.info("Ray Client's server did not start (%s); trying again", str(exc)[:120])
        return process_ray().connect(self.address, self._token, target=self.client_address, **init_kwargs)

    def _node_on_this_host(self) -> bool:
        if not self._head.in_task:
            return True  # the head runs here
        links = self._channel.links().values() if self._channel is not None else ()
        here = gcs_host("127.0.0.1")  # this host, as Ray names it
        return any(link.node_ip and gcs_host(link.node_ip) == here for link in links)

    def start(self) -> RayCluster:
        """Start the head and the workers; return once ``min_workers`` are up.

        Raises CapacityError (nothing started) when Spark can never fit the
        cluster, NodeStartTimeoutError naming the nodes that did not come up,
        or ClusterFailedError when the head fails. On any error the cluster is
        torn down before the exception propagates.
        """
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> RayCluster:
        """Start the head and submit the workers' Spark jobs; returns at once.
        :meth:`wait_head` and :meth:`wait_ready` wait for them (``start`` is
        both). Raises CapacityError, with nothing started, when Spark can
        never fit the cluster."""
        spec = self.spec
        cap = spark_side.capacity(self._spark)
        cpus = spec.cpus_per_worker or cap.cores_per_executor
        spark_side.check_fits(spec, cap, cpus, max(1, spec.head_cpus) if self._head.in_task else 0)
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

    def status(self) -> ClusterStatus:
        """The observed state: RUNNING, DEGRADED (with the reason)..."""
        with self._lock:
            nodes = [self._head.status(self.spec.head_cpus, self.spec.head_gpus)]
            active = self._pool.active()
            nodes += [slot.status() for slot in active]
            return ClusterStatus(
                name=self.name,
                state=self._state,
                ready_workers=sum(s.up for s in active),
                desired_workers=len(active),
                idle_workers=sum(1 for s in active if s.up and s.idle_ms > 0),
                message=self._message,
                address=self.address,
                client_address=self.client_address,
                dashboard_url=self.dashboard_url,
                nodes=tuple(nodes),
                created_at=self._created,
                updated_at=self._updated,
            )

    def node_counters(self) -> NodeCounters:
        """A copy of the worker nodes' history (starts, losses, restarts, start seconds), for metrics."""
        with self._lock:
            c = self._pool.counters
            return dataclasses.replace(c, start_buckets=list(c.start_buckets))

    def events(self) -> list[tuple[float, str]]:
        """What happened to the cluster, oldest first (time, message)."""
        with self._lock:
            return list(self._events)

    def wait_for_workers(self, count: int | None = None, timeout: float = 120.0) -> bool:
        """Block until ``count`` (default: all) workers are up; False on timeout."""
        want = len(self._pool.active()) if count is None else count
        deadline = time.monotonic() + timeout
        with self._changed:
            while sum(s.up for s in self._pool.active()) < want:
                left = deadline - time.monotonic()
                if left <= 0 or self._state.terminal:
                    return False
                self._changed.wait(min(left, 1.0))
        return True

    def down(self, timeout: float = 60.0) -> None:
        """Tear the cluster down; returns once its Ray processes are gone.

        Idempotent. Stops every node through its supervisor at once, cancels
        the cluster's Spark jobs, and waits for the supervisors to report that
        their process trees are gone.
        """
        with self._lock:
            if self._state == State.DELETED:
                return
            failed = self._state == State.FAILED
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
        self._jobs.close(deadline)
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
            shutil.rmtree(self._jobs.temp_dir(slot), ignore_errors=True)
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

    def node_logs(self, node: str, *, name: str = "", offset: int = 0,
                  max_bytes: int = nodelogs.NODE_BYTES) -> tuple[str, list[nodelogs.LogFile]]:
        """One node's Ray log files, read now by its supervisor: ``node`` is
        its index as ``status().nodes`` lists it, its key, or a prefix of its
        Ray node id. Returns (its key, the files). ClusterNotReadyError when
        no such node is linked now."""
        with self._lock:
            nodes = self.status().nodes
            links = self._channel.links() if self._channel is not None else {}
        link = nodelogs.pick(self.name, nodes, links, node)
        return link.key, link.fetch_logs(name=name, offset=offset, max_bytes=max_bytes)

    def dashboard(self, *, stop: bool = False) -> str:
        """Ray's dashboard for this cluster, started now when it has none
        (a cluster runs without it unless made with ``dashboard=True``): its
        URL, which also serves Ray Jobs from then on (:meth:`jobs`). It runs
        until the cluster goes down, or until ``dashboard(stop=True)``, which
        returns "". Takes a few seconds the first time; ClusterNotReadyError
        while the head is not up, or when it could not start."""
        if self.spec.dashboard:
            if stop:
                raise SpecError("stop", True, f"cluster {self.name!r} was made with its dashboard (dashboard=true): "
                                              "it runs as long as the cluster does")
            return self.dashboard_url
        with self._lock:
            link = self._head.link if self._head.up else None
        if link is None or self._state not in (State.RUNNING, State.DEGRADED):
            raise ClusterNotReadyError(f"cluster {self.name!r} is {self._state.value}: its dashboard starts on a "
                                       "running head (raydist status NAME)")
        try:
            url = link.switch_dashboard(stop=stop)
        except (TimeoutError, RuntimeError) as exc:
            raise ClusterNotReadyError(f"cluster {self.name!r}: Ray's dashboard did not "
                                       f"{'stop' if stop else 'start'}: {exc}") from None
        with self._lock:
            self.dashboard_url = "" if stop else url
        self._record(f"Ray's dashboard {'stopped' if stop else f'started at {url}'} on demand")
        return self.dashboard_url

    def logs(self, run: str = "last", *, node: str = "", grep: str = "") -> list[tuple[str, bytes]]:
        """What a teardown of this cluster kept of its nodes' logs
        (``RAYDIST_HOME/logs/<name>/<run>/``): [(NODE/FILE, bytes)], newest
        first, ``run`` "last" or a kept run's name, one ``node`` or every
        one, only the lines containing ``grep``."""
        _run, files = nodelogs.read_kept(logs_dir(), self.name, run=run, node=node, grep=grep)
        return [(f"{n}/{f}", data) for n, f, _size, data in files]

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"<RayCluster {self.name!r} {self._state.value} {self.address or '-'}>"

    # ---------------------------------------------------------- internals

    def _launch(self, cap: spark_side.SparkCapacity, cpus: int) -> None:
        spec = self.spec
        driver_ip = route_ip(side_of(self._spark).driver_host())
        # Behind a relay nothing dials this process: its channel listens on
        # loopback only and adopts the connections it dials out.
        self._channel = NodeChannel("127.0.0.1" if self._head.relay else driver_ip, self._link_keys,
                                    self._on_link, ports=None if self._head.relay else self._link_ports)
        if self._head.in_task:
            head_ip, ports = "", dict(self._head_ports)  # the head's task picks its host's ports
        else:
            head_ip, taken = driver_ip, set()
            ports = {name: preferred_or_free_port(head_ip, self._head_ports.get(name), taken)
                     for name in HEAD_PORTS}
            self._set_addresses(head_ip, ports)
        head, self._jobs.plan = node_plans(
            spec, cap, cpus, head_ip=head_ip, ports=ports, channel=(driver_ip, self._channel.port),
            head_secret=self._link_keys.issue(HEAD_KEY), secret_env=self._token.env(), temp_dir=self._temp_root,
        )
        self._record("submitting the head's Spark task" if self._head.in_task else f"starting head at {self.address}")
        self._head.start(dataclasses.replace(head, relay=self._head.relay), spark=self._spark, group=self._group,
                         cluster=self.name, head_cpus=spec.head_cpus, head_gpus=spec.head_gpus,
                         on_job_end=self._on_head_job_end)
        try:
            self._jobs.profile = spark_side.resource_profile(self._spark, cpus, spec.gpus_per_worker)
        except Exception as exc:  # noqa: BLE001 - stage-level scheduling is optional
            log.info("no stage-level scheduling (%s); using the default task resources", exc)
        if self._head.relay:
            self._dial_relay()  # the workers' plans name the relay: they wait for it
        self._cpus = cpus
        with self._lock:
            for slot in self._pool.active():
                self._jobs.start(slot)  # once a slot: one resized in before launch is started already
        self._jobs.begin()
        if elastic(spec) and len(self._pool.active()) < spec.desired_workers:
            self._jobs.warm(cap.executors)  # nodes added later skip Spark's Python worker start

    def _dial_relay(self) -> None:
        """Wait for the head's task to say where its relay and GCS listen,
        then link to the relay. The workers' supervisors connect there too,
        and start their nodes as soon as the GCS listens."""
        address, gcs = self._head.wait_relay(self._deadline)
        if not address:
            raise ClusterFailedError(self._message if self._state == State.FAILED else
                                     f"the head's Spark task did not start within {self.spec.start_timeout_s:g} s")
        host, port = address.rsplit(":", 1)
        assert self._jobs.plan is not None
        self._jobs.plan = dataclasses.replace(self._jobs.plan, channel=(host, int(port)), gcs_address=gcs)
        assert self._channel is not None
        self._dialer = RelayDialer((host, int(port)), relay_key(self._link_keys.issue(HEAD_KEY)), self._channel.adopt)
        self._record(f"node links through the head's relay at {address}")

    def _set_addresses(self, head_ip: str, ports: Mapping[str, int]) -> None:
        self.address = f"{head_ip}:{ports['gcs']}"
        self.client_address = f"ray://{head_ip}:{ports['client']}"
        self.dashboard_url = f"http://{head_ip}:{ports['dashboard']}" if self.spec.dashboard else ""

    def _on_head_job_end(self, reason: str) -> None:
        """The head's supervisor or Spark job ended: the cluster fails unless
        it is being torn down."""
        missing = missing_raydist(side_of(self._spark), reason) if self._head.in_task else None  # not under the lock
        with self._lock:
            self._head.job_end = reason
            if self._stopping.is_set() or self._state.terminal:
                self._changed.notify_all()
                return
            self._head.up = False
            where = "Spark task" if self._head.in_task else "node"
            tail = " | ".join(self._head.tail()[-3:])
            self._set_state(State.FAILED, missing or f"the head's {where} ended: {reason}"
                            + (f": {tail}" if tail else ""))
        spawn(self.down, name=f"raydist-{self.name}-failed")

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
        spark_side.check_fits(spec, cap, self._cpus or cap.cores_per_executor,
                              max(1, spec.head_cpus) if self._head.in_task else 0)
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

    def _on_demand(self, reading: dict[str, Any]) -> None:
        """A demand reading from the head (called with the lock held)."""
        if self._stopping.is_set() or self._state.terminal:
            return
        if self._scaler.on_demand(reading, self.spec, self._cpus, ready=self._state != State.CREATING):
            self._refresh_state()

    def _on_worker_lost(self, slot: WorkerSlot, reason: str) -> bool:
        """A worker's Spark job ended; returns whether to submit it again."""
        missing = missing_raydist(side_of(self._spark), reason)  # may read a setting: not under the lock
        with self._lock:
            if slot.retired.is_set():
                slot.up = False
                return False
            slot.up = False
            slot.last_reason = reason
            if spark_side.is_stopped(self._spark):
                # Nothing can run its Spark jobs again: the cluster ends here.
                if not self._stopping.is_set() and self._state != State.FAILED:
                    self._set_state(State.FAILED, "its SparkSession was stopped")
                    spawn(self.down, name=f"raydist-{self.name}-failed")
                return False
            if missing is not None:
                # Resubmitting cannot help: the executors' Python lacks raydist.
                self._set_state(State.FAILED, missing)
                return False
            self._refresh_state(f"worker {slot.key} lost: {reason}")
        return self.spec.self_heal

    def _on_link(self, event: str, link: NodeLink) -> None:
        with self._lock:
            if link.key == HEAD_KEY:
                self._on_head(event, link)
                return
            slot = self._pool.find(link.key)
            if slot is None:
                return
            if event in ("hello", "resumed") and self._head.in_task and self._head.up:
                # Said again on a resumed link: it may have been lost with the old connection.
                link.tell({"cmd": "head", "address": self.address})
            change = slot.on_link(event, link, stopping=self._stopping.is_set() or slot.retired.is_set())
            if change is not None:
                record, lost = change
                if record:
                    self._record(record)
                self._refresh_state(lost)

    def _on_head(self, event: str, link: NodeLink) -> None:
        if event == "hello":
            if self._head.link is not None and self._head.in_task:
                link.stop()  # Spark ran the head's task again: the workers know the first one only
                return
            self._head.link = link
        elif event == "demand" and link is self._head.link:
            if (reading := self._demand.add(link.demand)) is not None:
                self._on_demand(reading)
        elif event == "started" and link is self._head.link:
            if self._head.in_task:
                self._set_addresses(link.node_ip, link.info.get("ports", {}))
                for slot in self._pool.every():
                    if slot.link is not None:
                        slot.link.tell({"cmd": "head", "address": self.address})
            self._head.up = True
            self._record(f"head up at {self.address}" + (f" on {link.host}" if self._head.in_task else ""))
            self._refresh_state()
        elif (event in ("stopped", "closed") and link is self._head.link and not self._stopping.is_set()
              and self._state != State.FAILED):
            self._head.up = False
            tail = " | ".join(self._head.tail()[-3:])
            self._set_state(State.FAILED, f"the head node stopped: {link.ended_why()}" + (f": {tail}" if tail else ""))
            # The workers cannot outlive their GCS; tear them down off this thread.
            spawn(self.down, name=f"raydist-{self.name}-failed")

    def _refresh_state(self, reason: str = "") -> None:
        """Derive RUNNING/DEGRADED from the nodes (called with the lock held)."""
        if reason:
            self._record(reason)
        if self._state in (State.DELETING, State.DELETED, State.FAILED):
            return
        active = self._pool.active()
        up = sum(s.up for s in active)
        if not self._head.up:
            return
        if self._state == State.CREATING:
            if up >= self.spec.required_workers:
                self._set_state(State.RUNNING, f"{up}/{len(active)} workers up")
            return
        if up >= self.spec.required_workers:
            self._set_state(State.RUNNING, f"{up}/{len(active)} workers up")
        else:
            self._set_state(State.DEGRADED, reason or f"{up}/{len(active)} workers up")

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
