"""The session cluster's decisions (raydist.train.session_rules): every case,
and the promises as properties over generated situations."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raydist.train.session_rules import (
    YIELD_AFTER_S,
    IdleStep,
    Observed,
    RunStep,
    Shape,
    for_run,
    while_idle,
)

pytestmark = pytest.mark.unit

shapes = st.builds(Shape, st.integers(1, 8), st.integers(1, 4), st.integers(0, 2))
# A session cluster may have no worker nodes (shrunk to its head while Spark works).
cluster_shapes = st.builds(Shape, st.integers(0, 8), st.integers(1, 4), st.integers(0, 2))
observed = st.builds(
    Observed,
    shape=cluster_shapes,
    usable=st.booleans(),
    runs=st.integers(0, 3),
    idle_s=st.floats(0, 1000),
    spark_waiting_s=st.floats(0, 10),
    replacement_waiting=st.booleans(),
    head_holds_slot=st.booleans(),
)


def seen(shape: Shape, *, usable: bool = True, runs: int = 0, idle_s: float = 0.0, waiting_s: float = 0.0) -> Observed:
    return Observed(shape, usable, runs, idle_s, waiting_s)


def test_a_run_starts_a_cluster_when_there_is_none() -> None:
    assert for_run(None, Shape(2, 1)) == (RunStep.START, Shape(2, 1))


def test_a_run_uses_a_cluster_that_fits_even_while_others_run_on_it() -> None:
    assert for_run(seen(Shape(4, 2), runs=2), Shape(2, 1)) == (RunStep.USE, Shape(4, 2))


def test_more_nodes_of_the_same_size_grow_the_cluster_in_place_under_other_runs() -> None:
    assert for_run(seen(Shape(2, 1), runs=1), Shape(3, 1)) == (RunStep.GROW, Shape(3, 1))


def test_bigger_nodes_wait_for_the_runs_on_the_cluster_then_replace_it() -> None:
    assert for_run(seen(Shape(2, 1), runs=1), Shape(2, 2)) == (RunStep.WAIT, Shape(2, 2))
    # The replacement also has room for the old runs' workers: 4 x 1 CPU pack onto 2 nodes of 2.
    assert for_run(seen(Shape(4, 1)), Shape(2, 2)) == (RunStep.REPLACE, Shape(2, 2))
    assert for_run(seen(Shape(6, 1)), Shape(1, 2)) == (RunStep.REPLACE, Shape(3, 2))
    assert for_run(seen(Shape(2, 1)), Shape(2, 1, 1)) == (RunStep.REPLACE, Shape(2, 1, 1))


def test_workers_pack_onto_nodes_big_enough() -> None:
    assert Shape(2, 2).covers(Shape(4, 1))  # two to a node
    assert not Shape(2, 2).covers(Shape(5, 1))
    assert not Shape(4, 1).covers(Shape(1, 2))  # no node is big enough
    assert Shape(2, 2, 2).covers(Shape(4, 1, 1)) and not Shape(2, 4, 1).covers(Shape(4, 1, 1))
    assert for_run(seen(Shape(2, 2)), Shape(4, 1)) == (RunStep.USE, Shape(2, 2))


def test_a_failing_cluster_is_replaced_once_the_runs_on_it_have_ended() -> None:
    assert for_run(seen(Shape(2, 1), usable=False, runs=1), Shape(2, 1)) == (RunStep.WAIT, Shape(2, 1))
    assert for_run(seen(Shape(2, 1), usable=False), Shape(2, 1)) == (RunStep.START, Shape(2, 1))


@given(observed, shapes)
def test_a_cluster_with_runs_on_it_is_never_torn_down_for_another_run(current: Observed, want: Shape) -> None:
    step, shape = for_run(current, want)
    if current.runs:
        assert step is not RunStep.REPLACE
        assert step is not RunStep.START or not current.usable and not current.runs
    if step in (RunStep.USE, RunStep.GROW, RunStep.REPLACE, RunStep.START):
        assert shape.covers(want)  # what the run gets fits it
    if step is RunStep.REPLACE:
        assert shape.covers(current.shape)  # and the runs the old one served
    if step is RunStep.GROW:
        assert shape.same_nodes(current.shape) and shape.workers > current.shape.workers
    if current.replacement_waiting and step in (RunStep.USE, RunStep.GROW):
        raise AssertionError("a run went ahead of the run waiting to replace the cluster")


def test_an_idle_cluster_stays_while_warm_and_nothing_waits() -> None:
    assert while_idle(seen(Shape(2, 1), idle_s=10), keep_warm_s=120)[0] is IdleStep.KEEP


def test_an_idle_cluster_goes_after_keep_warm_s() -> None:
    step, why = while_idle(seen(Shape(2, 1), idle_s=120), keep_warm_s=120)
    assert step is IdleStep.RETIRE and "idle for 120 s" in why


def test_an_idle_cluster_gives_its_slots_back_to_waiting_spark_work() -> None:
    assert while_idle(seen(Shape(2, 1), waiting_s=YIELD_AFTER_S / 2), 120)[0] is IdleStep.KEEP
    step, why = while_idle(seen(Shape(2, 1), waiting_s=YIELD_AFTER_S), 120)
    assert step is IdleStep.RETIRE and "Spark jobs wait" in why


def test_a_cluster_that_can_no_longer_run_goes_once_idle() -> None:
    assert while_idle(seen(Shape(2, 1), usable=False), 120)[0] is IdleStep.RETIRE
    assert while_idle(seen(Shape(2, 1), usable=False, runs=1), 120)[0] is IdleStep.KEEP


@given(observed, st.floats(0, 500))
def test_the_reaper_never_retires_a_cluster_a_run_uses(current: Observed, keep_warm_s: float) -> None:
    step, why = while_idle(current, keep_warm_s)
    if current.runs:
        assert step is IdleStep.KEEP
    else:
        waited = current.spark_waiting_s >= YIELD_AFTER_S
        assert (step is IdleStep.RETIRE) == (
            not current.usable or current.idle_s >= keep_warm_s or (waited and current.head_holds_slot)
        )
        # A head that holds no slot stays when Spark waits: only worker nodes go, and only if there are any.
        assert (step is IdleStep.SHRINK) == (
            step is not IdleStep.RETIRE and waited and not current.head_holds_slot and current.shape.workers > 0
        )
        assert bool(why) == (step is not IdleStep.KEEP)


def test_waiting_spark_work_takes_the_worker_nodes_and_leaves_a_head_on_the_driver() -> None:
    on_driver = Observed(Shape(2, 1), True, 0, 5.0, YIELD_AFTER_S, head_holds_slot=False)
    step, why = while_idle(on_driver, 120)
    assert step is IdleStep.SHRINK and "worker nodes" in why
    # Shrunk, it keeps its head while Spark works, until its idle time is up.
    shrunk = dataclasses.replace(on_driver, shape=Shape(0, 1))
    assert while_idle(shrunk, 120)[0] is IdleStep.KEEP
    assert while_idle(dataclasses.replace(shrunk, idle_s=120), 120)[0] is IdleStep.RETIRE
    # The next run grows it back in place.
    assert for_run(dataclasses.replace(shrunk, spark_waiting_s=0.0), Shape(2, 1)) == (RunStep.GROW, Shape(2, 1))
    # A head in a Spark task of its own holds a slot: that cluster goes whole.
    in_task = dataclasses.replace(on_driver, head_holds_slot=True)
    assert while_idle(in_task, 120)[0] is IdleStep.RETIRE


def test_runs_that_fit_queue_behind_a_run_waiting_to_replace_the_cluster() -> None:
    waiting = Observed(Shape(2, 1), usable=True, runs=1, idle_s=0.0, spark_waiting_s=0.0, replacement_waiting=True)
    assert for_run(waiting, Shape(2, 1))[0] is RunStep.QUEUE  # would fit: not ahead of the replacement
    assert for_run(waiting, Shape(4, 1))[0] is RunStep.QUEUE  # would grow it: likewise
    assert for_run(waiting, Shape(2, 2))[0] is RunStep.WAIT  # another replacer: waits for the runs too
