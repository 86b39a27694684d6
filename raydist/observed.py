"""What is observed, beside what is desired (:mod:`raydist.spec`): a
cluster's lifecycle :class:`State`, and the status of the cluster and of
each of its nodes, as the engine sees them and the control plane records
them. ``raydist.spec`` re-exports these names, where they were first."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ClusterStatus", "NodeStatus", "State"]


class State(str, enum.Enum):
    """Lifecycle of a cluster; the same names as the control plane's proto enum."""

    CREATING = "CREATING"
    RUNNING = "RUNNING"
    DEGRADED = "DEGRADED"
    DELETING = "DELETING"
    DELETED = "DELETED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (State.DELETED, State.FAILED)


@dataclass(frozen=True)
class NodeStatus:
    """One Ray node as observed."""

    key: str
    up: bool
    host: str = ""
    node_ip: str = ""
    cpus: int = 0
    gpus: float = 0.0
    gpu_ids: tuple[str, ...] = ()
    restarts: int = 0
    message: str = ""
    idle_s: float = 0.0
    ray_node_id: str = ""


@dataclass(frozen=True)
class ClusterStatus:
    """What a cluster looks like now (the observed state)."""

    name: str
    state: State
    ready_workers: int
    desired_workers: int
    message: str = ""
    address: str = ""
    client_address: str = ""
    dashboard_url: str = ""
    nodes: tuple[NodeStatus, ...] = ()
    created_at: float = 0.0
    updated_at: float = 0.0
    idle_workers: int = 0
