"""Pure sizing rules: how much of a host a Ray node may take.

No Spark and no Ray imports here, so every rule is unit-tested directly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from raydist.errors import SpecError
from raydist.spec import MIN_OBJECT_STORE

__all__ = [
    "memory_limit",
    "NodeSize",
    "node_size",
    "visible_gpus",
    "embedded_master",
    "RAY_WORKER_PORTS",
]

#: Where a container's memory limit is read: cgroup v2, then v1.
CGROUP_MEMORY_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_limit(host_total: int, files: Sequence[str] = CGROUP_MEMORY_FILES) -> int:
    """The memory this process may use: the host's total, or the container's
    cgroup limit when it is lower (in a Kubernetes pod the host is the node,
    and sizing from it would get the pod killed). ``max`` or an unreadable
    file means no limit."""
    for path in files:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < host_total:
            return int(text)
        return host_total  # the first file present decides (v2 "max": no limit)
    return host_total


#: Ray hands its workers ports from this range by default; a port raydist
#: picks for anything else (GCS, client server, dashboard) must lie outside it
#: or ``ray start`` refuses to run.
RAY_WORKER_PORTS = range(10002, 20000)

#: Part of a node's memory budget that goes to the object store when the user
#: does not size it (Ray's own default is 30%).
OBJECT_STORE_FRACTION = 0.3
#: Part of the host that Ray nodes may use in all; the rest is left to the OS,
#: the Spark executor JVMs and page cache.
HOST_FRACTION = 0.8
#: Part of /dev/shm one node's object store may fill.
SHM_FRACTION = 0.8


@dataclass(frozen=True)
class NodeSize:
    """Memory of one Ray node, in bytes."""

    memory: int
    object_store: int


def node_size(
    *,
    host_memory: int,
    shm_bytes: int,
    nodes_on_host: int,
    jvm_bytes_on_host: int = 0,
    memory: int | None = None,
    object_store: int | None = None,
) -> NodeSize:
    """Size one Ray node from its share of the host.

    ``nodes_on_host`` is how many Ray nodes may share the host (Spark task
    slots there, plus a head). The share of memory left after the executor
    JVMs is split evenly; the object store never exceeds the node's share of
    ``/dev/shm``, since Ray's plasma store lives there and a full ``/dev/shm``
    crashes workers with SIGBUS instead of spilling.

    Explicit ``memory``/``object_store`` win, but an object store larger than
    the node's share of ``/dev/shm`` is an error that says so.
    """
    nodes = max(1, nodes_on_host)
    usable = max(0, int((host_memory - jvm_bytes_on_host) * HOST_FRACTION))
    budget = usable // nodes
    shm_share = int(shm_bytes * SHM_FRACTION) // nodes
    if object_store is not None:
        if shm_bytes and object_store > shm_bytes * SHM_FRACTION:
            raise SpecError(
                "object_store_per_worker",
                object_store,
                f"this host's /dev/shm holds {shm_bytes >> 20} MiB; ask for less or enlarge /dev/shm",
            )
        store = object_store
    else:
        store = int(budget * OBJECT_STORE_FRACTION)
        if shm_bytes:
            store = min(store, shm_share)
        store = max(store, MIN_OBJECT_STORE)
    heap = memory if memory is not None else max(budget - store, 64 << 20)
    return NodeSize(memory=int(heap), object_store=int(store))


def visible_gpus(addresses: Sequence[str], executor_visible: str | None) -> list[str]:
    """Map a Spark task's GPU addresses to the devices CUDA should see.

    Spark hands a task device *addresses*. When the executor itself already
    runs under ``CUDA_VISIBLE_DEVICES`` (YARN and Kubernetes often set it),
    CUDA numbers devices relative to that list, so address ``i`` means the
    ``i``-th entry of it. Without such a list, addresses are device ids.

    Raises ValueError when an address does not exist among the visible devices.
    """
    if executor_visible is None or executor_visible.strip() == "":
        return [a.strip() for a in addresses]
    pool = [d.strip() for d in executor_visible.split(",") if d.strip()]
    out = []
    for address in addresses:
        address = address.strip()
        if address.isdigit() and int(address) < len(pool):
            out.append(pool[int(address)])
        elif address in pool:
            # Already a device id from the visible list (a discovery script that
            # reports the ids it sees).
            out.append(address)
        else:
            raise ValueError(
                f"GPU address {address!r} is not among the executor's "
                f"CUDA_VISIBLE_DEVICES={executor_visible!r}"
            )
    return out


def embedded_master(cpu_count: int, memory_bytes: int, executors: int | None = None) -> str:
    """A ``local-cluster[N,C,M]`` master sized from this machine.

    Leaves one core and a quarter of memory for the driver (which also runs
    the Ray head). Two executors of at least one core each, so that a lost
    executor never takes the whole cluster.
    """
    n = executors or 2
    cores = max(1, (max(cpu_count - 1, n)) // n)
    mem_mb = max(1024, int(memory_bytes * 0.25 / n) >> 20)
    mem_mb = min(mem_mb, 8192)
    return f"local-cluster[{n},{cores},{mem_mb}]"


def local_cluster_shape(master: str) -> tuple[int, int, int] | None:
    """(executors, cores each, MiB each) of a ``local-cluster[N,C,M]`` master; None for any other."""
    m = re.match(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]", master)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
