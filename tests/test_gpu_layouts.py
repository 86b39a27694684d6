"""pyspark's GPU contract on Spark's real GPU scheduling with fake addresses:
each layout a user's program (tests/programs/gpu_layouts.py) on its own
local-cluster, every compat class and the facade on it, compared with what
pyspark's own TorchDistributor gave the same function on the same layout
(recorded in tests/originals.json by ``make refresh-originals``)."""

from __future__ import annotations

import pytest

from tests.probe import recorded_original, run_program

pytestmark = pytest.mark.integration

#: layout: (ranks, GPUs a task, the GPU ids Spark can hand the executors' tasks)
LAYOUTS = {
    "two-executors": (2, 1, {"0", "1"}),
    "one-executor-four-gpus": (2, 1, {"0", "1", "2", "3"}),
    "two-gpus-a-task": (4, 2, {"0", "1", "2", "3"}),
    "executor-visible-devices": (2, 1, {"6", "7"}),  # the executors' own CUDA_VISIBLE_DEVICES=6,7
}
#: The classes whose ranks run torchrun-shaped code (LOCAL_RANK picks the device).
TORCHRUN_CLASSES = ("torch", "torch_again", "horovod", "deepspeed")


def shape(ranks: dict) -> list[tuple[str, str, int]]:
    """Each rank's (LOCAL_RANK, LOCAL_WORLD_SIZE, how many devices it sees), in order."""
    return sorted((r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"], len(r["CUDA_VISIBLE_DEVICES"].split(",")))
                  for r in ranks.values())


def check_own_devices(name: str, run: dict, ranks: int, gpus: set[str]) -> None:
    assert run["error"] is None, (name, run["error"])
    got = run["ranks"]
    assert sorted(got, key=int) == [str(r) for r in range(ranks)], (name, sorted(got))
    for rank, seen in got.items():
        assert "device_error" not in seen, (name, rank, seen)
        visible = seen["CUDA_VISIBLE_DEVICES"].split(",")
        assert set(visible) <= gpus, (name, rank, visible)
        assert seen["device"] == visible[int(seen["LOCAL_RANK"])], (name, rank, seen)
    devices = [seen["device"] for seen in got.values()]
    assert len(set(devices)) == len(devices), (name, "two ranks share a device", devices)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_rank_gets_its_own_device_as_under_pyspark(layout: str, no_leftover_ray) -> None:
    """About 90 s a layout: a Spark application of its own, a session
    cluster, and every class on it (TensorFlow's workers import TF)."""
    ours = run_program("gpu_layouts.py", layout, timeout=800)
    check_layout(layout, ours, recorded_original("gpu_layouts.py", layout))


@pytest.mark.timeout(900)
def test_every_rank_gets_its_own_device_from_a_connect_session(no_leftover_ray) -> None:
    """The same program as a Spark Connect client of a server with the
    layout (about 120 s: the server, then the runs): the head's task
    carries one task's GPUs too, and nothing dials back to the client."""
    layout = "one-executor-four-gpus"
    ours = run_program("gpu_layouts.py", layout, "--connect", timeout=800)
    assert ours["server_left"] == []
    check_layout(layout, ours, recorded_original("gpu_layouts.py", layout), local=False)


def check_layout(layout: str, ours: dict, theirs: dict, *, local: bool = True) -> None:
    """What every rank of every class saw on ``layout``, against pyspark's own run."""
    ranks, task_gpus, gpus = LAYOUTS[layout]
    assert ours["alive"] is True

    for name in TORCHRUN_CLASSES:
        check_own_devices(name, ours[name], ranks, gpus)
        # Each rank of a task sees that task's GPUs, and counts among its ranks.
        assert shape(ours[name]["ranks"]) == sorted(
            (str(i), str(task_gpus), task_gpus) for _ in range(ranks // task_gpus) for i in range(task_gpus)), name
        if name != "horovod":  # hvd.init() is the function's own group
            assert not any(r["group_before"] for r in ours[name]["ranks"].values()), (name, "a group before")
    assert [r["hvd"][2:] for r in ours["horovod"]["ranks"].values()] == [
        [int(r["LOCAL_RANK"]), int(r["LOCAL_WORLD_SIZE"])] for r in ours["horovod"]["ranks"].values()]
    # The second GPU run forked its jobs from the same warm workers.
    assert {r["parent"] for r in ours["torch_again"]["ranks"].values()} == {
        r["parent"] for r in ours["torch"]["ranks"].values()}

    # pyspark's own, on the same layout: the same shape, each rank its own device.
    if theirs["torch"]["error"] is None:
        check_own_devices("pyspark", theirs["torch"], ranks, gpus)
        assert shape(theirs["torch"]["ranks"]) == shape(ours["torch"]["ranks"])
    else:
        # An executor with a CUDA_VISIBLE_DEVICES of its own: pyspark's task
        # keeps the whole list instead of its own GPUs and starts a torchrun
        # per device, more processes than asked; raydist maps the task's
        # addresses through the list, as pyspark's _get_gpus_owned means to.
        assert layout == "executor-visible-devices", theirs["torch"]["error"]

    # spark-tensorflow-distributor's layout: one worker per task, with the task's GPUs.
    workers = ours["mirrored"]["ranks"]
    assert ours["mirrored"]["error"] is None and len(workers) == ranks // task_gpus
    tf_devices = [d for w in workers.values() for d in w["CUDA_VISIBLE_DEVICES"].split(",")]
    assert len(tf_devices) == ranks and len(set(tf_devices)) == ranks and set(tf_devices) <= gpus

    # The facade keeps Ray Train's semantics: get_device() is the worker's own GPU.
    facade = ours["facade"]
    assert facade["error"] is None
    assert sorted(r["device"] for r in facade["ranks"].values()) == sorted(
        r["gpu_ids"][0] for r in facade["ranks"].values())
    assert len({r["device"] for r in facade["ranks"].values()}) == ranks

    # Local mode: two of the driver's four GPUs, picked at random as pyspark
    # picks them, LOCAL_RANK indexing each rank's own.
    for side in (ours, theirs) if local else ():
        local = side["local"]["ranks"]
        assert side["local"]["error"] is None and len(local) == 2
        visible = {r["CUDA_VISIBLE_DEVICES"] for r in local.values()}
        assert len(visible) == 1 and len(visible.pop().split(",")) == 2
        assert len({r["device"] for r in local.values()}) == 2
