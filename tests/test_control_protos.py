"""A cluster's proto is built again only for the nodes that changed."""

from __future__ import annotations

import dataclasses

import pytest

from raydist._proto import pb
from raydist.control.protos import ClusterProtos
from raydist.control.store import ClusterRow
from raydist.spec import ClusterSpec, NodeStatus

pytestmark = pytest.mark.unit


def test_node_messages_are_rebuilt_only_for_changed_nodes(monkeypatch) -> None:  # noqa: ANN001
    import raydist.control.protos as protos

    built: list[str] = []
    real = protos._node_proto
    monkeypatch.setattr(protos, "_node_proto", lambda p, node: built.append(node.key) or real(p, node))
    cache = ClusterProtos(pb, lambda name: None)
    row = ClusterRow(name="big", spec=ClusterSpec(name="big", workers=1000).to_dict(), state="CREATING")
    nodes = tuple(NodeStatus(key=f"w{i}", up=False) for i in range(1000))
    cache.observed("big", 0, nodes)
    cache.refresh(row)
    assert len(built) == 1000
    built.clear()
    nodes = (dataclasses.replace(nodes[0], up=True), *nodes[1:])
    cache.observed("big", 0, nodes)
    cache.refresh(row)
    assert built == ["w0"]  # one node changed: one message built
    msg = cache.by_name["big"]
    assert len(msg.nodes) == 1000 and msg.nodes[0].state == pb.NODE_STATE_UP
