"""Finding the Ray cluster a trainer runs on, and connecting this process.

The facade needs only a Ray address. It finds one, in order, from:
a :class:`~raydist.engine.cluster.RayCluster` handle; a cluster name started
by this process; ``RAY_ADDRESS``; else an embedded cluster that it starts and
tears down after ``fit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from raydist.errors import TrainingConfigError

log = logging.getLogger(__name__)

#: Ray Train V2's ``report()`` waits on the controller's health-check poll
#: (2 s by default); raydist polls faster unless the user chose a value.
FAST_HEALTH_CHECK_S = "0.2"


@contextlib.contextmanager
def connected(cluster: Any, *, workers: int, cpus_per_worker: int, use_gpu: bool) -> Iterator[Any]:
    """Connect this process to the right cluster for the duration of a fit.

    Yields the cluster handle (or None for a plain ``RAY_ADDRESS``). A cluster
    started here is torn down on exit; a connection made here is closed.
    """
    import ray

    import raydist
    from raydist.engine.cluster import RayCluster

    owned = None
    handle: RayCluster | None = None
    if isinstance(cluster, RayCluster):
        handle = cluster
    elif isinstance(cluster, str):
        from raydist.api import _registry

        handle = _registry.get(cluster)
    elif cluster is not None:
        raise TrainingConfigError("cluster", cluster, "give a raydist cluster handle, a cluster name, or nothing")
    elif starts_embedded(cluster):
        log.info("no cluster given and no RAY_ADDRESS: starting an embedded one")
        owned = raydist.up(workers=workers, cpus_per_worker=cpus_per_worker, gpus_per_worker=1 if use_gpu else 0)
        handle = owned
    connected_here = False
    previous_interval = os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", FAST_HEALTH_CHECK_S)
    try:
        if handle is not None:
            if ray.is_initialized():
                current = ray.get_runtime_context().gcs_address
                if current != handle.address:
                    raise TrainingConfigError(
                        "cluster",
                        handle.name,
                        f"this process is already connected to Ray at {current}; call ray.shutdown() first",
                    )
            else:
                # Stay connected after the fit: the next fit on this cluster
                # skips a new driver job; the cluster's down() disconnects.
                handle.connect(log_to_driver=True)
                connected_here = owned is not None
        elif not ray.is_initialized():
            ray.init(log_to_driver=True)
            connected_here = True
        _check_resources(workers, cpus_per_worker, use_gpu)
        yield handle
    finally:
        if previous_interval is None:
            os.environ.pop("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", None)
        if connected_here:
            ray.shutdown()
        if owned is not None:
            owned.down()


def starts_embedded(cluster: Any) -> bool:
    """Whether :func:`connected` would start (and after the fit tear down)
    an embedded cluster for ``cluster``."""
    import ray

    return cluster is None and not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")


def _check_resources(workers: int, cpus_per_worker: int, use_gpu: bool) -> None:
    """Fail before any training when the cluster can never host the workers."""
    import ray

    total = ray.cluster_resources()
    if use_gpu and total.get("GPU", 0) < workers:
        raise TrainingConfigError(
            "use_gpu",
            True,
            f"the cluster has {total.get('GPU', 0):g} GPUs for {workers} workers; "
            "start it with gpus_per_worker=1 or train with use_gpu=False",
        )
    if total.get("CPU", 0) < workers * cpus_per_worker:
        raise TrainingConfigError(
            "workers",
            workers,
            f"the cluster has {total.get('CPU', 0):g} CPUs, fewer than {workers} workers x "
            f"{cpus_per_worker} CPU; use fewer workers or a bigger cluster",
        )
