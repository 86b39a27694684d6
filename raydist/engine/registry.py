"""What this process started through raydist, torn down at exit.

One registry per process: the clusters ``raydist.up`` started here (by name,
so ``down(name)`` and ``cluster="name"`` find them), the SparkSession raydist
made when the user had none, and long-lived services that higher layers keep
by key (the training session). It lives in the engine, below both the Python
API and the training runtime, which share it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from raydist.errors import ClusterExistsError, ClusterNotFoundError
from raydist.paths import logs_dir, verbose

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from raydist.engine.cluster import RayCluster

__all__ = ["ProcessRegistry", "registry"]

log = logging.getLogger(__name__)


class _Closeable(Protocol):
    def close(self) -> None: ...


_S = TypeVar("_S", bound=_Closeable)


class ProcessRegistry:
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
        from raydist.engine.spark.session import embedded_session, is_stopped

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


#: This process's registry.
registry = ProcessRegistry()
