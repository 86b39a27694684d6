"""The session cluster's decisions (raydist.train.session_rules): every case,
and the promises as properties over generated situations."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raydist.train.session_rules import (
    WARM_UP_AFTER_S,
    YIELD_AFTER_S,
    IdleStep,
    Observed,
    RunPlace,
    RunStep,
    Shape,
    for_run,
    warm_up_now,
    where_to_run,
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
    warm=st.booleans(),
    warming=st.booleans(),
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


# ------------------------------------------------------- where a run goes


def test_a_first_run_goes_to_sparks_tasks_and_waits_for_no_ray() -> None:
    assert where_to_run(None, needs_ray=False, fits_spark=True) is RunPlace.SPARK_TASKS


def test_a_run_only_ray_serves_goes_to_ray_whatever_the_cluster() -> None:
    for current in (None, seen(Shape(2, 1)), dataclasses.replace(seen(Shape(2, 1)), warm=True)):
        assert where_to_run(current, needs_ray=True, fits_spark=True) is RunPlace.RAY
    # Ranks that Spark's slots cannot hold at once (a barrier stage needs them all) go to Ray too.
    assert where_to_run(None, needs_ray=False, fits_spark=False) is RunPlace.RAY


def test_a_warm_cluster_or_one_in_use_takes_the_run() -> None:
    warm = dataclasses.replace(seen(Shape(2, 1)), warm=True)
    assert where_to_run(warm, needs_ray=False, fits_spark=True) is RunPlace.RAY
    in_use = seen(Shape(2, 1), runs=1)
    assert where_to_run(in_use, needs_ray=False, fits_spark=True) is RunPlace.RAY


def test_a_cold_warming_shrunk_or_failed_cluster_leaves_the_run_to_sparks_tasks() -> None:
    warming = dataclasses.replace(seen(Shape(2, 1)), warming=True)  # it gives its slots back to the run
    failed = dataclasses.replace(seen(Shape(2, 1), usable=False), warm=True)
    for current in (seen(Shape(2, 1)), seen(Shape(0, 1)), warming, failed):
        assert where_to_run(current, needs_ray=False, fits_spark=True) is RunPlace.SPARK_TASKS


@given(observed, st.booleans(), st.booleans())
def test_a_run_never_goes_to_sparks_tasks_when_it_needs_ray_or_finds_ray_warm(
        current: Observed, needs_ray: bool, fits_spark: bool) -> None:
    place = where_to_run(current, needs_ray=needs_ray, fits_spark=fits_spark)
    if needs_ray or not fits_spark or (current.usable and (current.warm or current.runs)):
        assert place is RunPlace.RAY
    else:
        assert place is RunPlace.SPARK_TASKS


def test_the_cluster_warms_up_once_runs_pause() -> None:
    assert warm_up_now(None, spark_runs=0, paused_s=WARM_UP_AFTER_S, keep_warm_s=120)
    assert not warm_up_now(None, spark_runs=0, paused_s=WARM_UP_AFTER_S - 0.1, keep_warm_s=120)  # back to back
    assert not warm_up_now(None, spark_runs=1, paused_s=60, keep_warm_s=120)  # a run holds the slots
    assert not warm_up_now(None, spark_runs=0, paused_s=60, keep_warm_s=0)  # nothing kept warm
    assert not warm_up_now(None, spark_runs=0, paused_s=60, keep_warm_s=120, spark_busy=True)  # the user's work
    shrunk = seen(Shape(0, 1))
    assert warm_up_now(shrunk, spark_runs=0, paused_s=60, keep_warm_s=120)  # its worker nodes come back
    warm = dataclasses.replace(seen(Shape(2, 1)), warm=True)
    assert not warm_up_now(warm, spark_runs=0, paused_s=60, keep_warm_s=120)
    assert not warm_up_now(seen(Shape(2, 1), runs=1), spark_runs=0, paused_s=60, keep_warm_s=120)
    warming = dataclasses.replace(seen(Shape(2, 1)), warming=True)
    assert not warm_up_now(warming, spark_runs=0, paused_s=60, keep_warm_s=120)


def test_a_warming_cluster_still_gives_its_slots_to_waiting_spark_work() -> None:
    warming = Observed(Shape(2, 1), usable=True, runs=0, idle_s=0.0, spark_waiting_s=1.0, head_holds_slot=False,
                       warming=True)
    assert while_idle(warming, 120)[0] is IdleStep.SHRINK


def test_a_warm_up_cut_short_waits_for_a_longer_pause_next_time() -> None:
    assert not warm_up_now(None, spark_runs=0, paused_s=6, keep_warm_s=120, pause_s=10)
    assert warm_up_now(None, spark_runs=0, paused_s=10, keep_warm_s=120, pause_s=10)
    assert not warm_up_now(None, spark_runs=0, paused_s=30, keep_warm_s=20, pause_s=20)  # kept warm no longer


@given(st.one_of(st.none(), observed), st.integers(0, 2), st.floats(0, 100), st.floats(0, 1000),
       st.floats(WARM_UP_AFTER_S, 80), st.booleans())
def test_a_warm_up_never_takes_slots_from_a_run_in_sparks_tasks_or_other_spark_work(
        current: Observed | None, spark_runs: int, paused_s: float, keep_warm_s: float, pause_s: float,
        spark_busy: bool) -> None:
    if warm_up_now(current, spark_runs=spark_runs, paused_s=paused_s, keep_warm_s=keep_warm_s, pause_s=pause_s,
                   spark_busy=spark_busy):
        assert spark_runs == 0 and not spark_busy and paused_s >= pause_s and keep_warm_s > pause_s
        assert current is None or not current.usable or not (current.warm or current.runs or current.warming)
