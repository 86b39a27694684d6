"""Each rank's torchrun layout (raydist.train._layout) and a GPU run's session
cluster (session_rules.gpu_run_shape): pyspark's contract, as properties over
every placement Ray could make."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raydist.train._layout import LAYOUT_KEYS, Placed, torchrun_layout
from raydist.train.session_rules import Shape, gpu_run_shape

pytestmark = pytest.mark.unit


def test_ranks_of_one_task_share_its_gpus_and_local_rank_indexes_each_ones_own() -> None:
    # Two Spark tasks on one host (one IP), two GPUs each: Ray Train would say
    # LOCAL_RANK 0..3 for all four, beside two visible devices each.
    placed = [Placed("a", ("2",)), Placed("a", ("3",)), Placed("b", ("0",)), Placed("b", ("1",))]
    envs = torchrun_layout(placed, use_gpu=True)
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["CUDA_VISIBLE_DEVICES"], e["NODE_RANK"]) for e in envs] == [
        ("0", "2", "2,3", "0"), ("1", "2", "2,3", "0"), ("0", "2", "0,1", "1"), ("1", "2", "0,1", "1")]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"}


def test_one_gpu_a_task_means_local_rank_zero_everywhere() -> None:
    envs = torchrun_layout([Placed("a", ("0",)), Placed("b", ("1",))], use_gpu=True)
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == [
        ("0", "1", "0"), ("0", "1", "1")]


def test_a_cpu_run_hides_every_gpu_as_pyspark_does() -> None:
    envs = torchrun_layout([Placed("a"), Placed("a"), Placed("b")], use_gpu=False)
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == [
        ("0", "2", ""), ("1", "2", ""), ("0", "1", "")]


def test_devices_are_ordered_so_that_each_rank_finds_its_own_whatever_ray_numbered_them() -> None:
    # Ray sorts GPU ids as text ("10" before "9"): each rank's own id still
    # sits at its LOCAL_RANK.
    envs = torchrun_layout([Placed("a", ("9",)), Placed("a", ("10",))], use_gpu=True)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["9,10", "9,10"]


@st.composite
def placements(draw: st.DrawFn) -> list[Placed]:
    """Workers on up to four nodes, each node's GPUs its own (one Spark task's)."""
    nodes = draw(st.integers(1, 4))
    out = []
    for node in range(nodes):
        for gpu in range(draw(st.integers(1, 3))):
            out.append(Placed(f"n{node}", (str(node * 8 + gpu),)))
    return draw(st.permutations(out))


@given(placements())
def test_every_rank_picks_its_own_device_and_no_two_ranks_share_one(placed: list[Placed]) -> None:
    envs = torchrun_layout(placed, use_gpu=True)
    chosen = []
    for worker, env in zip(placed, envs, strict=True):
        assert set(LAYOUT_KEYS) <= set(env)
        visible = env["CUDA_VISIBLE_DEVICES"].split(",")
        local = int(env["LOCAL_RANK"])
        assert 0 <= local < int(env["LOCAL_WORLD_SIZE"]) <= len(visible)
        assert visible[local] == worker.gpus[0]  # set_device(LOCAL_RANK) is this rank's own GPU
        assert set(visible) == {g for w in placed if w.node == worker.node for g in w.gpus}  # its task's GPUs only
        chosen.append(visible[local])
    assert len(set(chosen)) == len(chosen)


def test_a_gpu_run_asks_for_one_node_per_spark_task_of_its_gpus() -> None:
    assert gpu_run_shape(4, task_cpus=1, task_gpus=2) == (Shape(2, 1, 2), {"CPU": 0.5, "GPU": 1.0})
    assert gpu_run_shape(2, task_cpus=1, task_gpus=1) == (Shape(2, 1, 1), {"CPU": 1.0, "GPU": 1.0})
    assert gpu_run_shape(3, task_cpus=4, task_gpus=2) == (Shape(2, 4, 2), {"CPU": 2.0, "GPU": 1.0})
    assert gpu_run_shape(3, task_cpus=1, task_gpus=3) == (Shape(1, 1, 3), {"CPU": 0.3333, "GPU": 1.0})
    # A run smaller than a task takes one node of just its ranks' GPUs.
    assert gpu_run_shape(1, task_cpus=2, task_gpus=4) == (Shape(1, 2, 1), {"CPU": 2.0, "GPU": 1.0})


@given(st.integers(1, 64), st.integers(1, 8), st.integers(1, 8))
def test_a_gpu_run_shape_holds_every_rank(ranks: int, task_cpus: int, task_gpus: int) -> None:
    shape, per_rank = gpu_run_shape(ranks, task_cpus, task_gpus)
    per_node = min(shape.gpus, (shape.cpus * 10_000) // round(per_rank["CPU"] * 10_000))  # as Ray counts
    assert shape.workers * per_node >= ranks and shape.gpus <= task_gpus and shape.cpus == task_cpus


def test_a_run_without_a_spark_session_asks_one_gpu_a_node() -> None:
    from raydist.train.session import run_shape

    assert run_shape(4, {"CPU": 1.0, "GPU": 1.0}, True) == Shape(4, 1, 1)
    assert run_shape(2, {"CPU": 2.0}, False) == Shape(2, 2, 0)
    # Workers bigger than a task's share keep nodes of their own size.
    assert run_shape(2, {"CPU": 4.0, "GPU": 2.0}, True) == Shape(2, 4, 2)
