"""The Python API: ``raydist.up`` and ``raydist.down``.

``up`` without ``address=`` runs the engine in this process (the notebook case);
clusters started here are remembered by name so ``down(name)`` finds them.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from raydist.errors import ClusterExistsError, ClusterNotFoundError
from raydist.paths import logs_dir, verbose
from raydist.spec import ClusterSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from raydist.control.remote import RemoteCluster
    from raydist.engine.cluster import RayCluster

__all__ = ["up", "down", "attach", "clusters", "spark_log"]

log = logging.getLogger(__name__)


class _Closeable(Protocol):
    def close(self) -> None: ...


_S = TypeVar("_S", bound=_Closeable)


class _Registry:
    """What this process started through raydist, torn down at exit: clusters
    by name, the embedded SparkSession, and long-lived services (the training
    session) that higher layers keep here by key. The exit hook is
    registered with the first thing kept, not at import."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[str, RayCluster] = {}
        self._services: dict[str, _Closeable] = {}
        self._owned_spark: SparkSession | None = None
        #: Where the embedded SparkSession's driver JVM writes its console output.
        self.spark_log: Path | None = None
        self._hooked = False

    def _hook_exit(self) -> None:
        """Called with the lock held."""
        if not self._hooked:
            atexit.register(self.shutdown)
            self._hooked = True

    def service(self, key: str, factory: Callable[[], _S]) -> _S:
        """The service kept under ``key``, made by ``factory`` on first use;
        closed at :meth:`shutdown` (before the clusters and Spark)."""
        with self._lock:
            if key not in self._services:
                self._hook_exit()
                self._services[key] = factory()
            return self._services[key]  # type: ignore[return-value]

    def add(self, cluster: RayCluster) -> None:
        with self._lock:
            self._hook_exit()
            old = self._clusters.get(cluster.name)
            if old is not None and not old.state.terminal:
                raise ClusterExistsError(cluster.name)
            self._clusters[cluster.name] = cluster

    def remove(self, name: str, cluster: RayCluster) -> None:
        with self._lock:
            if self._clusters.get(name) is cluster:
                del self._clusters[name]

    def get(self, name: str) -> RayCluster:
        with self._lock:
            if name not in self._clusters:
                raise ClusterNotFoundError(name)
            return self._clusters[name]

    def all(self) -> list[RayCluster]:
        with self._lock:
            return list(self._clusters.values())

    def embedded_spark(self, master: str | None, conf: Mapping[str, str]) -> SparkSession:
        from raydist.engine.spark import embedded_session, is_stopped

        with self._lock:
            if self._owned_spark is None or is_stopped(self._owned_spark):
                self._hook_exit()
                if not verbose():
                    self.spark_log = logs_dir() / f"spark-driver-{os.getpid()}.log"
                self._owned_spark = embedded_session(master, conf, log_path=self.spark_log)
            return self._owned_spark

    def shutdown(self) -> None:
        with self._lock:
            services, self._services = list(self._services.values()), {}
        for service in reversed(services):
            try:
                service.close()
            except Exception:  # noqa: BLE001 - at exit, tear down as much as possible
                log.exception("closing %r at exit", service)
        for cluster in self.all():
            try:
                cluster.down()
            except Exception:  # noqa: BLE001 - at exit, tear down as much as possible
                log.exception("tearing down %s at exit", cluster.name)
        with self._lock:
            spark, self._owned_spark = self._owned_spark, None
        if spark is not None:
            spark.stop()


_registry = _Registry()


def up(
    spark: SparkSession | None = None,
    name: str | None = None,
    workers: int | None = None,
    *,
    cpus_per_worker: int | None = None,
    gpus_per_worker: float = 0,
    memory_per_worker: int | str | None = None,
    min_workers: int | None = None,
    max_workers: int | None = None,
    spark_master: str | None = None,
    address: str | None = None,
    **spec_fields: Any,
) -> Any:
    """Start a Ray cluster on Spark and return its handle once it is ready.

    Args:
        spark: the SparkSession whose executors host the Ray workers. ``None``
            starts (once per process) an embedded session on
            ``RAYDIST_SPARK_MASTER`` or a ``local-cluster`` sized from this
            machine.
        name: the cluster's name (a DNS label); generated when omitted.
        workers: Ray worker nodes, one Spark task each (2 unless
            ``min_workers``/``max_workers`` say otherwise).
        cpus_per_worker: CPUs per node; ``None`` takes whole executors.
        gpus_per_worker: GPUs per node, from Spark's GPU scheduling.
        memory_per_worker: Ray memory per node (``"4g"``); sized when omitted.
        min_workers / max_workers: an elastic size instead of ``workers``.
        spark_master: master for the embedded session (ignored with ``spark``).
        address: a control plane (``host:port``) to create the cluster in,
            instead of running the engine in this process; returns a
            :class:`raydist.control.remote.RemoteCluster` with the same surface.
            Such a cluster runs the Ray dashboard (Ray Jobs) unless
            ``dashboard=False``; one in this process only with ``dashboard=True``.
        **spec_fields: any other :class:`raydist.spec.ClusterSpec` field.

    Returns:
        The running cluster: ``.address``, ``.client_address``,
        ``.dashboard_url``, ``.status()``, ``.down()``; a context manager.
        Like ``ray.util.spark.setup_ray_cluster``, it becomes this process's
        default Ray cluster: ``RAY_ADDRESS`` and the cluster's token are set
        in ``os.environ`` (restored at ``down()``), so ``ray.init()`` and
        subprocesses reach it with no other call.

    Example:
        >>> with raydist.up(workers=2, cpus_per_worker=1) as cluster:  # doctest: +SKIP
        ...     cluster.connect()
    """
    from raydist.engine.cluster import RayCluster

    if address is not None:
        # A served cluster takes Ray Jobs (raydist submit) unless told not to:
        # long-lived and reached from other hosts, it is worth the dashboard's
        # start (about 2 s on a small host).
        spec_fields.setdefault("dashboard", True)
    spec = ClusterSpec(
        name=name or f"ray-{secrets.token_hex(3)}",
        workers=workers,
        min_workers=min_workers,
        max_workers=max_workers,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        memory_per_worker=memory_per_worker,
        **spec_fields,
    )
    if spark is not None and spec.spark_conf:
        from raydist.errors import SpecError

        raise SpecError("spark_conf", sorted(spec.spark_conf),
                        "settings for a SparkSession raydist creates; yours runs already: set them on it")
    if address is not None:
        from raydist.control.client import Client
        from raydist.control.remote import RemoteCluster

        return RemoteCluster(Client(address), spec).start(timeout=spec.start_timeout_s + 60)
    session = spark if spark is not None else _registry.embedded_spark(spark_master, spec.spark_conf)
    cluster = RayCluster(spec, session)
    _registry.add(cluster)
    try:
        cluster.start()
    except BaseException:
        _registry.remove(spec.name, cluster)
        raise
    cluster.export_env()
    return cluster


def down(name: str) -> None:
    """Tear down the cluster of that name started by this process."""
    cluster = _registry.get(name)
    cluster.down()
    _registry.remove(name, cluster)


def attach(name: str, address: str | None = None) -> RemoteCluster:
    """A handle to cluster ``name`` that a control plane already runs (made by
    ``raydist up`` or another process): status, env, connect, submit, resize,
    down. ``address``: the control plane's ``host:port``, default
    ``RAYDIST_ADDRESS`` or the local one; its token from ``RAYDIST_TOKEN`` or
    ``RAYDIST_HOME``. ClusterNotFoundError when it runs no such cluster."""
    from raydist.control.client import Client
    from raydist.control.remote import RemoteCluster
    from raydist.spec import spec_from_proto

    client = Client(address)
    return RemoteCluster(client, spec_from_proto(client.get(name).spec))


def spark_log() -> Path | None:
    """The file the SparkSession raydist started writes its driver JVM's
    console output to (``RAYDIST_HOME/logs``), or None (none started, or
    ``RAYDIST_VERBOSE=1`` kept it on the terminal)."""
    return _registry.spark_log


def clusters() -> list[RayCluster]:
    """Clusters this process started and has not torn down."""
    return [c for c in _registry.all() if not c.state.terminal]
