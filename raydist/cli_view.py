"""How the CLI shows things: its two consoles (``out`` for results, ``err`` for
progress and errors), tables (rich) and JSON dicts of the API's messages."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["as_dict", "clusters_table", "err", "nodes_table", "out"]

err = Console(stderr=True)
out = Console()

STATE_STYLE = {"RUNNING": "green", "CREATING": "yellow", "DEGRADED": "yellow", "DELETING": "yellow",
               "DELETED": "dim", "FAILED": "red"}


def as_dict(cluster: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    d = MessageToDict(cluster, preserving_proto_field_name=True)
    d.get("spec", {}).pop("env", None)  # values may be credentials
    return d


def age(cluster: Any) -> str:
    seconds = max(0, int(time.time() - cluster.create_time.seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def clusters_table(out: Console, clusters: list[Any]) -> None:
    from raydist._proto import pb

    if not clusters:
        out.print("No clusters. Create one with: raydist up NAME -w 2")
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "STATE", "WORKERS", "GPUS", "ADDRESS", "AGE"):
        table.add_column(col)
    show_msg = any(c.state in (pb.FAILED, pb.DEGRADED) for c in clusters)
    if show_msg:
        table.add_column("MESSAGE", overflow="fold", max_width=60)
    for c in clusters:
        state = pb.State.Name(c.state)
        workers = f"{c.ready_workers}/{c.desired_workers}"
        low, high = c.spec.min_workers, c.spec.max_workers
        if c.spec.HasField("min_workers") and c.spec.HasField("max_workers") and low < high:
            workers += f" ({low}..{high}" + (f", {c.idle_workers} idle)" if c.idle_workers else ")")
        row = [c.spec.name, f"[{STATE_STYLE.get(state, '')}]{state}[/]", workers,
               f"{c.gpus:g}" if c.gpus else "-", c.client_address or "-", age(c)]
        if show_msg:
            row.append(c.message if c.state in (pb.FAILED, pb.DEGRADED) else "-")
        table.add_row(*row)
    out.print(table)


def nodes_table(out: Console, cluster: Any) -> None:
    """One cluster's nodes: where each runs, whether it is up, and why it last went down."""
    from raydist._proto import pb

    if not cluster.nodes:
        return
    table = Table(box=None, header_style="bold", title="nodes", title_justify="left", title_style="bold")
    for col in ("#", "NODE", "STATE", "HOST", "ADDRESS", "CPUS", "GPUS", "RESTARTS"):
        table.add_column(col, no_wrap=True)
    table.add_column("RAY NODE ID", no_wrap=True, min_width=12)  # 12 hex digits, as `ray list nodes` prints
    table.add_column("LAST ERROR", overflow="fold", ratio=1)
    for index, node in enumerate(cluster.nodes):
        state = pb.NodeState.Name(node.state).removeprefix("NODE_STATE_")
        style = "green" if node.state == pb.NODE_STATE_UP else "yellow"
        table.add_row(str(index), node.key, f"[{style}]{state}[/]", node.host or "-", node.node_ip or "-",
                      str(node.cpus), f"{node.gpus:g}" if node.gpus else "-", str(node.restarts),
                      node.ray_node_id[:12] or "-", node.message or "-")
    out.print(table)
