"""Outbox: a cluster's events reach its listener in order, off the cluster's lock."""

from __future__ import annotations

import threading

import pytest

from raydist.engine.cluster.outbox import Outbox

pytestmark = pytest.mark.unit


def test_events_arrive_in_order_on_one_thread_and_flush_waits_for_them() -> None:
    got: list[tuple[str, str, str]] = []
    box = Outbox(lambda state, msg: got.append((state, msg, threading.current_thread().name)), "c")
    for i in range(50):
        box.put("RUNNING", f"event {i}")
    assert box.flush(10)
    assert [m for _, m, _ in got] == [f"event {i}" for i in range(50)]
    assert {t for _, _, t in got} == {"c-events"}
    box.close()
    box.put("DELETED", "after close")  # dropped, no error
    assert len(got) == 50


def test_a_listener_that_takes_a_lock_the_recorder_holds_cannot_deadlock() -> None:
    """The shape of the control plane's old freeze: the cluster records an
    event holding its lock; the listener takes the manager's lock and then
    reads the cluster (its lock); another thread holds the manager's lock and
    reads the cluster."""
    cluster_lock, manager_lock = threading.RLock(), threading.Lock()
    seen: list[str] = []

    def listener(state: str, message: str) -> None:
        with manager_lock, cluster_lock:
            seen.append(message)

    box = Outbox(listener, "c")
    reader_has_manager = threading.Event()

    def reader() -> None:  # the manager serving GetCluster
        with manager_lock:
            reader_has_manager.set()
            with cluster_lock:
                pass

    with cluster_lock:  # the cluster, recording an event under its lock
        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        reader_has_manager.wait(5)
        box.put("DEGRADED", "worker w1 lost")  # returns at once: no lock taken here
    thread.join(10)
    assert not thread.is_alive()
    assert box.flush(10) and seen == ["worker w1 lost"]
    box.close()


def test_a_failing_listener_does_not_stop_delivery() -> None:
    got: list[str] = []

    def listener(state: str, message: str) -> None:
        if message == "bad":
            raise RuntimeError("listener bug")
        got.append(message)

    box = Outbox(listener, "c")
    for message in ("a", "bad", "b"):
        box.put("RUNNING", message)
    assert box.flush(10) and got == ["a", "b"]
    box.close()
