"""The slot loop alone: every end of a worker's job is reported, and the job is
submitted again until the cluster stops or says not to."""

from __future__ import annotations

import threading

from raydist.engine.slot import WorkerSlot, first_error_line, keep_filled


def test_resubmits_until_told_to_stop() -> None:
    slot = WorkerSlot(0, "w0")
    stopping = threading.Event()
    runs: list[int] = []
    lost: list[str] = []
    records: list[str] = []

    def run_job(s: WorkerSlot) -> None:
        runs.append(s.index)
        if len(runs) == 3:
            stopping.set()
            return
        raise RuntimeError("py4j junk\norg.apache.spark.SparkException: Lost executor 1\nmore junk")

    keep_filled(slot, run_job=run_job, stopping=stopping, on_lost=lambda s, r: lost.append(r) or True,
                record=records.append)
    assert len(runs) == 3
    assert lost == ["org.apache.spark.SparkException: Lost executor 1"] * 2
    assert records == ["resubmitting worker w0"] * 2


def test_on_lost_false_ends_the_loop() -> None:
    calls: list[str] = []

    def run_job(_: WorkerSlot) -> None:
        calls.append("run")

    keep_filled(WorkerSlot(1, "w1"), run_job=run_job, stopping=threading.Event(),
                on_lost=lambda s, r: calls.append(r) and False, record=calls.append)
    assert calls == ["run", "its Spark task ended"]


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
