"""The control plane's answers, kept ready: one ``Cluster`` proto per cluster.

Reads (GetCluster, ListClusters, Watch) take the proto kept here and never
touch SQLite or a cluster's lock. A cluster's protos are rebuilt from its
store row and what its engine observed (:meth:`ClusterProtos.observed`), and
of its nodes only the ones that changed are built again: a thousand nodes
starting cost a thousand node messages, not a million.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from raydist.control.store import ClusterRow
from raydist.spec import ClusterSpec, NodeStatus, State, spec_to_proto

__all__ = ["ClusterProtos", "ts"]


def ts(t: float) -> Timestamp:
    """``t`` (seconds since the epoch) as a protobuf Timestamp."""
    out = Timestamp()
    out.FromNanoseconds(int(t * 1e9))
    return out


def _node_proto(pb: Any, node: NodeStatus) -> Any:
    return pb.Node(key=node.key, state=pb.NODE_STATE_UP if node.up else pb.NODE_STATE_STARTING, host=node.host,
                   node_ip=node.node_ip, ray_node_id=node.ray_node_id, restarts=node.restarts, cpus=node.cpus,
                   gpus=node.gpus, message=node.message, idle_seconds=node.idle_s)


class ClusterProtos:
    """Each cluster's proto by name (``by_name``: readers take entries
    without a lock, one dict operation at a time; writers hold the manager's
    lock), and what rebuilds them. ``on_change(name)`` follows every change."""

    def __init__(self, pb: Any, on_change: Callable[[str], None]) -> None:
        self._pb = pb
        self._on_change = on_change
        self.by_name: dict[str, Any] = {}
        self._idle: dict[str, int] = {}  # idle worker nodes per cluster (observed, not stored)
        self._nodes: dict[str, tuple[NodeStatus, ...]] = {}  # per cluster (observed, not stored)
        self._node_protos: dict[str, dict[str, tuple[NodeStatus, Any]]] = {}  # per cluster, per node key

    def observed(self, name: str, idle_workers: int, nodes: tuple[NodeStatus, ...]) -> None:
        """What ``name``'s engine sees now (taken into its proto at the next :meth:`refresh`)."""
        self._idle[name] = idle_workers
        self._nodes[name] = nodes

    def refresh(self, row: ClusterRow) -> None:
        """Build ``row``'s proto again."""
        pb = self._pb
        live = row.state in (State.CREATING.value, State.RUNNING.value, State.DEGRADED.value)
        try:
            spec = ClusterSpec.from_dict(row.spec)
        except Exception:  # noqa: BLE001 - a row today's rules reject (reconcile FAILED it): its name alone
            self.unreadable(row.name, row.message, row.state)
            return
        spec_msg = spec_to_proto(spec)
        spec_msg.restart_on_server_restart = row.restart
        self.by_name[row.name] = pb.Cluster(
            spec=spec_msg,
            state=pb.State.Value(row.state),
            ready_workers=row.ready_workers,
            desired_workers=row.desired_workers,
            address=row.address,
            client_address=row.client_address,
            dashboard_url=row.dashboard_url,
            create_time=ts(row.created),
            update_time=ts(row.updated or time.time()),
            message=row.message,
            gpus=spec.total_gpus,
            idle_workers=self._idle.get(row.name, 0) if live else 0,
            nodes=self._node_messages(row.name) if live else [],
        )
        self._on_change(row.name)

    def forget(self, name: str) -> None:
        """``name`` is gone from the store (a DELETED row past its retention)."""
        self.by_name.pop(name, None)
        for each in (self._idle, self._nodes, self._node_protos):
            each.pop(name, None)

    def unreadable(self, name: str, message: str, state: str = "FAILED") -> None:
        """An entry for a row that cannot be read as a cluster (its name, state and message)."""
        pb = self._pb
        self.by_name[name] = pb.Cluster(spec=pb.ClusterSpec(name=name), state=pb.State.Value(state),
                                        message=message, update_time=ts(time.time()))
        self._on_change(name)

    def _node_messages(self, name: str) -> list[Any]:
        """``name``'s nodes as protos, built again only for the nodes that changed."""
        before = self._node_protos.get(name, {})
        now: dict[str, tuple[NodeStatus, Any]] = {}
        for node in self._nodes.get(name, ()):
            seen = before.get(node.key)
            now[node.key] = seen if seen is not None and seen[0] == node else (node, _node_proto(self._pb, node))
        self._node_protos[name] = now
        return [msg for _, msg in now.values()]
