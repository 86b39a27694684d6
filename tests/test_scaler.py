"""The elastic cluster's rules (raydist.engine.cluster.scaler), on their own."""

from __future__ import annotations

import json

import pytest

from raydist.engine.cluster.scaler import decide, nodes_for

pytestmark = pytest.mark.unit

BASE = dict(min_workers=0, max_workers=3, cpus=2, gpus=0.0, idle_timeout_s=60.0)


def test_pending_bundles_are_packed_onto_worker_shaped_nodes() -> None:
    assert nodes_for([({"CPU": 1.0}, 3)], cpus=2, gpus=0) == (2, 0)
    assert nodes_for([({"CPU": 2.0}, 1), ({"CPU": 1.0}, 2)], cpus=2, gpus=0) == (2, 0)
    # What no node of this shape can ever hold is not a reason to add nodes.
    assert nodes_for([({"CPU": 4.0}, 1), ({"GPU": 1.0}, 1), ({"CPU": 1.0, "custom": 1.0}, 1)], cpus=2, gpus=0) == (0, 3)
    assert nodes_for([({"CPU": 1.0, "GPU": 1.0}, 2)], cpus=4, gpus=1) == (2, 0)


def test_grows_for_demand_up_to_max_counting_nodes_already_starting() -> None:
    grow = decide(pending=[({"CPU": 1.0}, 2)], idle_ms={}, active=0, up=0, **BASE)
    assert grow is not None and grow.workers == 1 and "2 resource request" in grow.reason
    # One node already starting takes the same demand: nothing more to add.
    assert decide(pending=[({"CPU": 1.0}, 2)], idle_ms={}, active=1, up=0, **BASE) is None
    capped = decide(pending=[({"CPU": 2.0}, 10)], idle_ms={}, active=1, up=1, **BASE)
    assert capped is not None and capped.workers == 3
    assert decide(pending=[({"CPU": 2.0}, 10)], idle_ms={}, active=3, up=3, **BASE) is None


def test_shrinks_idle_nodes_down_to_min_and_never_while_demand_waits() -> None:
    idle = {"w0": 61_000, "w1": 61_000, "w2": 5_000}
    shrink = decide(pending=[], idle_ms=idle, active=3, up=3, **BASE)
    assert shrink is not None and shrink.workers == 1 and set(shrink.remove) == {"w0", "w1"}
    floor = decide(pending=[], idle_ms=idle, active=3, up=3, **{**BASE, "min_workers": 2})
    assert floor is not None and floor.workers == 2 and len(floor.remove) == 1
    assert decide(pending=[({"CPU": 1.0}, 1)], idle_ms=idle, active=3, up=3, **BASE) is None
    # Demand no node could hold does not keep idle nodes.
    impossible = decide(pending=[({"CPU": 64.0}, 1)], idle_ms=idle, active=3, up=3, **BASE)
    assert impossible is not None and impossible.workers == 1
    assert decide(pending=[], idle_ms={"w0": 1_000}, active=1, up=1, **BASE) is None


def test_nodes_still_starting_are_left_to_come_up() -> None:
    # A reading with no demand while a node starts (between lease requests) removes nothing.
    assert decide(pending=[], idle_ms={"w0": 0}, active=2, up=1, **BASE) is None


def test_a_demand_reading_of_thousands_of_nodes_fits_the_link_and_comes_back_whole() -> None:
    # Past ~650 nodes the one-line reading passed the link's 64 KiB line
    # bound: every reading broke the head's link, and scaling stopped.
    from raydist.engine.link.wire import MAX_LINE
    from raydist.engine.node.demand import MAX_SHAPES, DemandParts, encode_reading

    idle = {f"w{i}": 60_000 + i for i in range(5000)}
    pending = [[{"CPU": 1.0, "GPU": float(i % 3)}, 2] for i in range(300)] + [[{"CPU": 1.0, "GPU": 0.0}, 5]]
    pending += [[{"CPU": float(i + 2)}, 1] for i in range(100)]  # more distinct shapes than are sent
    lines = encode_reading({"pending": pending, "idle": idle}, seq=4)
    assert len(lines) > 1
    assert all(len(line.encode()) + 32 < MAX_LINE for line in lines)  # with the supervisor's "type" added
    parts = DemandParts()
    got = [parts.add(json.loads(line)) for line in lines]
    assert got[:-1] == [None] * (len(lines) - 1)
    whole = got[-1]
    assert whole is not None and whole["idle"] == idle
    shapes = {json.dumps(b, sort_keys=True): c for b, c in whole["pending"]}
    assert shapes[json.dumps({"CPU": 1.0, "GPU": 0.0}, sort_keys=True)] == 100 * 2 + 5  # same shapes merged
    assert len(whole["pending"]) == MAX_SHAPES
    # A part of an older reading does not mix into a newer one.
    stale = json.loads(lines[0])
    stale["seq"] = 3
    assert parts.add(stale) is None and parts.add(json.loads(lines[0])) is None
