"""The worker jobs' loop alone: every end of a worker's job is reported, and
the job is submitted again (after its backoff) until the cluster stops or
says not to. A stand-in SparkSide plays Spark: this is the loop's logic; the
real thing runs in test_engine_cluster and test_autoscale."""

from __future__ import annotations

import threading
import time

import pytest

from raydist.engine.cluster.node_jobs import WorkerJobs, backoff_s
from raydist.engine.cluster.slot import WorkerSlot, first_error_line
from raydist.engine.node.launch import NodePlan
from raydist.engine.spark.side import SparkJob

pytestmark = pytest.mark.unit


class _Job(SparkJob):
    def __init__(self, error: str) -> None:
        self._error = error

    def ended(self) -> bool:
        return True

    def error(self) -> str:
        return self._error


class _Side:
    """Every job ends at once, failing with ``error`` until ``runs`` reached ``ok_after``."""

    def __init__(self, error: str) -> None:
        self.error = error
        self.submitted: list[str] = []
        self.threads: set[str] = set()

    def submit(self, body, n=1, *, group, tag="", profile=None, description=""):  # noqa: ANN001, ANN201
        self.submitted.append(tag)
        self.threads.add(threading.current_thread().name)
        return _Job(self.error)

    def ended(self, jobs):  # noqa: ANN001, ANN201
        return [j for j in jobs if j.ended()]

    def cancel(self, *, group="", tag=""):  # noqa: ANN001, ANN201
        self.submitted.append(f"cancel {tag}")


def _jobs(side: _Side, on_lost, records: list[str], stopping: threading.Event) -> WorkerJobs:  # noqa: ANN001
    jobs = WorkerJobs(None, group="g", cluster="c", temp_root="/tmp/x", stopping=stopping, on_lost=on_lost,
                      record=records.append, issue=lambda key: "s" * 64, side=side)  # type: ignore[arg-type]
    jobs.plan = NodePlan(cluster="c", key="", channel=("127.0.0.1", 1), node_secret="", secret_env={})
    jobs.begin()
    return jobs


def _wait(cond, timeout: float = 10.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_resubmits_on_one_thread_until_told_to_stop() -> None:
    side = _Side("py4j junk\norg.apache.spark.SparkException: Lost executor 1\nmore junk")
    stopping = threading.Event()
    lost: list[str] = []
    records: list[str] = []

    def on_lost(slot: WorkerSlot, reason: str) -> bool:
        lost.append(reason)
        if len(lost) == 3:
            stopping.set()
        return True

    jobs = _jobs(side, on_lost, records, stopping)
    slots = [WorkerSlot(0, "w0"), WorkerSlot(1, "w1")]
    for slot in slots:
        jobs.start(slot)
    assert _wait(lambda: stopping.is_set() and not any(s.in_spark for s in slots))
    jobs.close(time.monotonic() + 5)
    assert set(lost) == {"org.apache.spark.SparkException: Lost executor 1"}
    assert len(side.threads) == 1  # every submission from the one jobs thread, whatever the node count
    assert records.count("resubmitting worker w0") + records.count("resubmitting worker w1") == len(side.submitted) - 2


def test_on_lost_false_ends_the_slot() -> None:
    side = _Side("")
    calls: list[str] = []
    jobs = _jobs(side, lambda s, r: calls.append(r) and False, calls, threading.Event())
    slot = WorkerSlot(1, "w1")
    jobs.start(slot)
    assert _wait(lambda: not slot.in_spark)
    jobs.close(time.monotonic() + 5)
    assert calls == ["its Spark task ended"]
    assert side.submitted == ["g-slot-w1"]


def test_backoff_doubles_and_is_bounded() -> None:
    assert backoff_s(0) == 0.2
    assert [backoff_s(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert backoff_s(50) == 30.0


def test_first_error_line_names_the_python_exception_a_task_traceback_ends_with() -> None:
    spark_error = RuntimeError(
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the "
        "Python worker: Traceback (most recent call last):\n"
        '  File "/x/worker.py", line 1, in main\n'
        "    import raydist\n"
        "ModuleNotFoundError: No module named 'raydist'\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)")
    assert first_error_line(spark_error) == "ModuleNotFoundError: No module named 'raydist'"


def test_first_error_line_falls_back_to_the_type() -> None:
    assert first_error_line(ValueError("")) == "ValueError"
    assert first_error_line(ValueError("plain text")) == "plain text"


def test_a_slot_started_twice_or_before_the_plan_runs_one_job() -> None:
    # UpdateCluster while a cluster was CREATING started a slot's loop
    # before launch did, then launch started it again: two Spark jobs for one
    # node, each one's node replacing the other's.
    class Holding(_Side):
        def submit(self, body, n=1, *, group, tag="", profile=None, description=""):  # noqa: ANN001, ANN201
            self.submitted.append(tag)

            class Running(_Job):
                def ended(self) -> bool:
                    return False

            return Running("")

    side = Holding("")
    jobs = WorkerJobs(None, group="g", cluster="c", temp_root="/tmp/x", stopping=threading.Event(),
                      on_lost=lambda s, r: True, record=lambda m: None, issue=lambda key: "s",
                      side=side)  # type: ignore[arg-type]
    slot = WorkerSlot(2, "w2")
    jobs.start(slot)  # a resize before launch
    time.sleep(0.3)
    assert side.submitted == []  # no plan yet: nothing submitted
    jobs.plan = NodePlan(cluster="c", key="", channel=("127.0.0.1", 1), node_secret="", secret_env={})
    jobs.start(slot)  # launch starts every active slot
    jobs.begin()
    jobs.start(slot)
    assert _wait(lambda: side.submitted == ["g-slot-w2"])
    time.sleep(0.5)
    assert side.submitted == ["g-slot-w2"]
    jobs.close(time.monotonic() + 1)


class _Link:
    def __init__(self, host: str) -> None:
        self.host, self.node_ip, self.info = host, "10.0.0.1", {}

    def ended_why(self) -> str:
        return "gone"


def test_a_node_that_says_hello_in_a_loop_writes_one_event_per_window(monkeypatch) -> None:
    """A supervisor that reconnects over and over (a valid key: a bug, or a
    hostile peer on an executor) must not write an event row per hello."""
    import raydist.engine.cluster.slot as slot_module

    now = [1000.0]
    monkeypatch.setattr(slot_module.time, "monotonic", lambda: now[0])
    slot = WorkerSlot(0, "w0")
    records = []
    for _ in range(50):
        record, _lost = slot.on_link("hello", _Link("h"), stopping=False)
        records.append(record)
        now[0] += 0.1  # 50 hellos in 5 s
    assert [r for r in records if r] == ["worker w0 starting on h"]
    now[0] += slot_module.HELLO_EVENT_S
    record, _ = slot.on_link("hello", _Link("h"), stopping=False)
    assert record == "worker w0 starting on h (49 more hello(s) before it not recorded)"
    # The slot still follows the newest supervisor: its start is seen.
    link = _Link("h2")
    slot.on_link("hello", link, stopping=False)
    assert slot.on_link("started", link, stopping=False) == ("worker w0 up on h2 (10.0.0.1)", "")
    assert slot.up and slot.restarts == 51
