"""RayCluster: one Ray cluster on one SparkSession, as its user holds it.

The head runs on the driver (or, on a Connect session, in a Spark task of its
own); each worker node is one long-running Spark task, submitted as its own
Spark job (decision 2 of the design: a lost executor then costs one node,
which is submitted again, instead of failing a barrier job). All jobs of a
cluster share a job group, so teardown is one cancel.

This module is the handle: addresses, the Ray connection, Ray Jobs, status,
logs, the dashboard. How the cluster starts, fails and goes is
:mod:`~raydist.engine.cluster.lifecycle`; how node events move it,
:mod:`~raydist.engine.cluster.router`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raydist.engine import nodelogs
from raydist.engine.auth import RayToken
from raydist.engine.cluster.router import LinkRouter
from raydist.engine.cluster.slot import NodeCounters
from raydist.engine.connection import process_ray
from raydist.engine.node.launch import HEAD_PORTS
from raydist.engine.ports import gcs_host
from raydist.errors import ClusterNotReadyError, SpecError
from raydist.paths import logs_dir
from raydist.ray_jobs import RayJobs
from raydist.spec import ClusterStatus, State

if TYPE_CHECKING:

    from pyspark.sql import SparkSession

__all__ = ["HEAD_PORTS", "RayCluster"]

log = logging.getLogger("raydist.engine.cluster")

#: Ray Client connections tried before giving up, and the errors of its
#: proxy worth another try (it lost the server process it started).
_CLIENT_TRIES = 3
_CLIENT_SERVER_FLAKES = ("Starting Ray client server failed", "ZombieProcess")


class RayCluster(LinkRouter):
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

    # ------------------------------------------------------------------ API

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

    def ray_jobs(self) -> RayJobs:
        """This cluster's Ray jobs (it needs ``dashboard=True``)."""
        return RayJobs(self.name, self.dashboard_url, self._token.reveal())

    def jobs(self) -> RayJobs:
        """Deprecated name of :meth:`ray_jobs` ("jobs" alone also meant Spark's)."""
        warnings.warn("cluster.jobs() is now cluster.ray_jobs()", DeprecationWarning, stacklevel=2)
        return self.ray_jobs()

    def submit(self, entrypoint: str | Sequence[str], **options: Any) -> str:
        """Submit a Ray job (``RayJobs.submit``: working_dir, pip, env); returns its id."""
        return self.ray_jobs().submit(entrypoint, **options)

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
        URL, which also serves Ray Jobs from then on (:meth:`ray_jobs`). It runs
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
