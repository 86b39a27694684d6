"""What a cluster's Ray wants and which nodes sit idle, read where the token is.

``python -m raydist.engine.node.demand GCS_ADDRESS INTERVAL_S`` runs beside the head
of an elastic cluster, started by the head's supervisor (so it has the
cluster's own Ray token, which the driver may not: Ray allows one token per
process, and a control plane runs clusters of many). Every ``INTERVAL_S`` it
asks the GCS for the cluster status Ray's own autoscaler reads
(``ray.autoscaler.v2.sdk.get_cluster_status``) and prints it as JSON lines:

``{"seq": 7, "part": 0, "parts": 1, "pending": [[{"CPU": 1.0}, 2], ...], "idle": {"w3": 61250, ...}}``

``pending`` is the resource bundles Ray cannot place now (tasks, actors,
placement groups, cluster constraints), the same shapes counted together, at
most :data:`MAX_SHAPES` of them (the most wanted); ``idle`` is every worker
node Ray counts idle, by its raydist key (``RAY_CLOUD_INSTANCE_ID``, set by
the supervisor), with how long. Only what the driver uses is sent, and a
reading too big for one line of the link (thousands of idle nodes) is spread
over ``parts`` lines of at most :data:`LINE_BUDGET` bytes, which the driver
puts back together (:class:`DemandParts`). The supervisor forwards each line
to the driver over the node link; :mod:`raydist.engine.cluster.scaler` decides.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Any

__all__ = ["DemandParts", "LINE_BUDGET", "MAX_SHAPES", "encode_reading", "read_demand"]

#: Longest line a reading takes on the link (wire.MAX_LINE, 64 KiB, is the hard bound).
LINE_BUDGET = 32 * 1024
#: Distinct pending shapes sent (the most wanted first); the rest are counted in ``more``.
MAX_SHAPES = 64


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
    idle: dict[str, int] = {}
    for node in (*status.active_nodes, *status.idle_nodes):
        usage = node.resource_usage
        ms = int(usage.idle_time_ms) if usage is not None else 0
        if node.instance_id and ms > 0:  # the head has no raydist key; a busy node is not sent
            idle[node.instance_id] = ms
    return {"pending": pending, "idle": idle}


def encode_reading(reading: dict[str, Any], seq: int, budget: int = LINE_BUDGET) -> list[str]:
    """``reading`` as JSON lines of at most ``budget`` bytes each: the
    pending shapes merged and capped in the first, the idle nodes spread
    over as many as they need."""
    merged: dict[str, list[Any]] = {}
    for bundle, count in reading.get("pending", []):
        key = json.dumps(bundle, sort_keys=True)
        merged.setdefault(key, [bundle, 0])[1] += int(count)
    shapes = sorted(merged.values(), key=lambda item: -item[1])
    more = sum(count for _, count in shapes[MAX_SHAPES:])
    head: dict[str, Any] = {"pending": shapes[:MAX_SHAPES], **({"more": more} if more else {})}
    chunks: list[dict[str, int]] = [{}]
    size = len(json.dumps(head)) + 64
    for key, ms in reading.get("idle", {}).items():
        item = len(key) + len(str(ms)) + 6
        if size + item > budget and chunks[-1]:
            chunks.append({})
            size = 64
        chunks[-1][key] = ms
        size += item
    lines = []
    for part, idle in enumerate(chunks):
        body = {"seq": seq, "part": part, "parts": len(chunks), **(head if part == 0 else {}), "idle": idle}
        lines.append(json.dumps(body, separators=(",", ":")))
    return lines


class DemandParts:
    """The driver's side: puts a reading's lines back together. :meth:`add`
    returns the whole reading once its last part came (parts of an older
    reading, or an error line, start over)."""

    def __init__(self) -> None:
        self._seq: Any = None
        self._got: dict[int, dict[str, Any]] = {}

    def add(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        if "error" in msg or "parts" not in msg:
            self._seq, self._got = None, {}
            return dict(msg)
        if msg.get("seq") != self._seq:
            self._seq, self._got = msg.get("seq"), {}
        try:
            part, parts = int(msg["part"]), int(msg["parts"])
        except (TypeError, ValueError):
            return None
        if not 0 <= part < parts or parts > 10_000:
            return None
        self._got[part] = msg
        if len(self._got) < parts:
            return None
        first = self._got.get(0, {})
        idle: dict[str, int] = {}
        for each in self._got.values():
            if isinstance(each.get("idle"), dict):
                idle.update(each["idle"])
        self._seq, self._got = None, {}
        return {"pending": first.get("pending", []), "idle": idle}


def main() -> int:
    gcs_address, interval = sys.argv[1], float(sys.argv[2])
    for seq in itertools.count():
        try:
            lines = encode_reading(read_demand(gcs_address), seq)
        except Exception as exc:  # noqa: BLE001 - the GCS may be starting or gone; say so, go on
            lines = [json.dumps({"error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})]
        print("\n".join(lines), flush=True)
        time.sleep(interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
