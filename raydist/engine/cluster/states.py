"""A cluster's states and what moves it between them, as pure rules.

No lock, no thread, no Ray: :mod:`~raydist.engine.cluster.lifecycle` and
:mod:`~raydist.engine.cluster.router` read the facts (is the head up, how many
worker nodes are, is a teardown under way) and do what these answer;
``tests/test_cluster_states.py`` asks them every case.

The states, in the order a cluster goes through them::

    CREATING --(head up, min_workers up)--> RUNNING <--> DEGRADED
        |                                      |            |
        +--------------- fault ----------------+------------+--> FAILED --down--> (stays FAILED)
        +---------------------------- down() ---------------------------> DELETING --> DELETED

A fault while the cluster is torn down is no failure: a teardown's own
stopping nodes look like faults to the links.
"""

from __future__ import annotations

from raydist.spec import State

__all__ = ["from_nodes", "fault_fails", "teardown_state"]


def from_nodes(state: State, *, head_up: bool, up: int, active: int, required: int,
               reason: str = "") -> tuple[State, str] | None:
    """The state the nodes make now, and its message; None when it stays.

    A cluster is RUNNING once its head and ``required`` worker nodes are up,
    and DEGRADED (with ``reason``, when known) when fewer are up after it ran.
    While it starts, fewer nodes leave it CREATING; a cluster being torn down,
    or failed, is not moved by its nodes."""
    if state in (State.DELETING, State.DELETED, State.FAILED) or not head_up:
        return None
    counted = f"{up}/{active} workers up"
    if up >= required:
        return State.RUNNING, counted
    if state == State.CREATING:
        return None
    return State.DEGRADED, reason or counted


def fault_fails(state: State, *, stopping: bool) -> bool:
    """Whether a fault (the head lost, its Spark task ended, the SparkSession
    stopped) makes the cluster FAILED: not during a teardown, and only once."""
    return not stopping and not state.terminal


def teardown_state(state: State) -> State | None:
    """What ``down()`` sets as it begins: DELETING, unless the cluster failed
    (it stays FAILED, so the reason is kept) or is gone already (None: nothing
    to do)."""
    if state == State.DELETED:
        return None
    return state if state == State.FAILED else State.DELETING
