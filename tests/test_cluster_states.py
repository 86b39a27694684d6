"""A cluster's state machine (raydist.engine.cluster.states), on its own:
every state against every count of nodes, every fault and every teardown."""

from __future__ import annotations

import pytest

from raydist.engine.cluster.states import fault_fails, from_nodes, teardown_state
from raydist.spec import State

pytestmark = pytest.mark.unit


def test_a_starting_cluster_runs_once_its_head_and_min_workers_are_up() -> None:
    assert from_nodes(State.CREATING, head_up=False, up=3, active=3, required=2) is None  # no head: no cluster
    assert from_nodes(State.CREATING, head_up=True, up=1, active=3, required=2) is None  # still starting
    assert from_nodes(State.CREATING, head_up=True, up=2, active=3, required=2) == (State.RUNNING, "2/3 workers up")
    assert from_nodes(State.CREATING, head_up=True, up=0, active=0, required=0) == (State.RUNNING, "0/0 workers up")


def test_a_running_cluster_degrades_with_the_reason_and_recovers() -> None:
    lost = "worker w1 lost: executor gone"
    assert from_nodes(State.RUNNING, head_up=True, up=1, active=2, required=2, reason=lost) == (State.DEGRADED, lost)
    assert from_nodes(State.RUNNING, head_up=True, up=1, active=2, required=2) == (State.DEGRADED, "1/2 workers up")
    assert from_nodes(State.DEGRADED, head_up=True, up=2, active=2, required=2) == (State.RUNNING, "2/2 workers up")
    # Elastic: fewer than asked but at least the minimum is running.
    assert from_nodes(State.DEGRADED, head_up=True, up=1, active=4, required=1) == (State.RUNNING, "1/4 workers up")


@pytest.mark.parametrize("state", [State.DELETING, State.DELETED, State.FAILED])
def test_nodes_never_move_a_cluster_that_failed_or_is_going(state: State) -> None:
    assert from_nodes(state, head_up=True, up=5, active=5, required=1) is None
    assert from_nodes(state, head_up=True, up=0, active=5, required=1, reason="lost") is None


def test_a_fault_fails_a_cluster_once_and_never_during_its_teardown() -> None:
    for state in (State.CREATING, State.RUNNING, State.DEGRADED, State.DELETING):
        assert fault_fails(state, stopping=False) is True, state
        assert fault_fails(state, stopping=True) is False, state  # the teardown's own stopping nodes
    assert fault_fails(State.FAILED, stopping=False) is False  # the first reason is kept
    assert fault_fails(State.DELETED, stopping=False) is False


def test_a_teardown_keeps_a_failure_and_is_done_once() -> None:
    for state in (State.CREATING, State.RUNNING, State.DEGRADED, State.DELETING):
        assert teardown_state(state) == State.DELETING, state
    assert teardown_state(State.FAILED) == State.FAILED
    assert teardown_state(State.DELETED) is None
