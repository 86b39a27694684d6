"""The Python API: ``raydist.up`` and ``raydist.down``.

``up`` without ``address=`` runs the engine in this process (the notebook case);
clusters started here are remembered by name so ``down(name)`` finds them.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydist.engine.registry import registry
from raydist.spec import ClusterSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from raydist.control.remote import RemoteCluster
    from raydist.engine.cluster import RayCluster

__all__ = ["up", "down", "attach", "clusters", "spark_log"]

log = logging.getLogger(__name__)



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
    session = spark if spark is not None else registry.embedded_spark(spark_master, spec.spark_conf)
    cluster = RayCluster(spec, session)
    registry.add(cluster)
    try:
        cluster.start()
    except BaseException:
        registry.remove(spec.name, cluster)
        raise
    cluster.export_env()
    return cluster


def down(name: str) -> None:
    """Tear down the cluster of that name started by this process."""
    cluster = registry.get(name)
    cluster.down()
    registry.remove(name, cluster)


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
    return registry.spark_log


def clusters() -> list[RayCluster]:
    """Clusters this process started and has not torn down."""
    return [c for c in registry.all() if not c.state.terminal]
