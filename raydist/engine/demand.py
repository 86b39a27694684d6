"""What a cluster's Ray wants and which nodes sit idle, read where the token is.

``python -m raydist.engine.demand GCS_ADDRESS INTERVAL_S`` runs beside the head
of an elastic cluster, started by the head's supervisor (so it has the
cluster's own Ray token, which the driver may not: Ray allows one token per
process, and a control plane runs clusters of many). Every ``INTERVAL_S`` it
asks the GCS for the cluster status Ray's own autoscaler reads
(``ray.autoscaler.v2.sdk.get_cluster_status``) and prints one JSON line:

``{"pending": [[{"CPU": 1.0}, 2], ...], "nodes": {"w0": {"idle_ms": 0}, ...}}``

``pending`` is every resource bundle Ray cannot place now (tasks, actors,
placement groups, cluster constraints), with its count; ``nodes`` is every
live worker node by its raydist key (``RAY_CLOUD_INSTANCE_ID``, set by the
supervisor) with how long Ray has counted it idle. The supervisor forwards each
line to the driver over the node link; :mod:`raydist.engine.scaler` decides.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

__all__ = ["read_demand"]


def read_demand(gcs_address: str) -> dict[str, Any]:
    """One reading of the cluster's unplaced demand and idle nodes."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(gcs_address)
    demands = status.resource_demands
    pending: list[list[Any]] = []
    for group in (*demands.ray_task_actor_demand, *demands.placement_group_demand,
                  *demands.cluster_constraint_demand):
        for request in group.bundles_by_count:
            pending.append([dict(request.bundle), int(request.count)])
    nodes: dict[str, dict[str, Any]] = {}
    for node in (*status.active_nodes, *status.idle_nodes):
        if not node.instance_id:
            continue  # the head (it has no raydist key)
        usage = node.resource_usage
        nodes[node.instance_id] = {
            "idle_ms": int(usage.idle_time_ms) if usage is not None else 0,
            "node_id": node.node_id or "",
        }
    return {"pending": pending, "nodes": nodes}


def main() -> int:
    gcs_address, interval = sys.argv[1], float(sys.argv[2])
    while True:
        try:
            line = json.dumps(read_demand(gcs_address))
        except Exception as exc:  # noqa: BLE001 - the GCS may be starting or gone; say so, go on
            line = json.dumps({"error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})
        print(line, flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
