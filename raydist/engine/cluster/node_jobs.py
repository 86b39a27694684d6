"""The Spark side of worker nodes: one Spark job per worker slot, on one thread.

A worker node is one Spark job of one task. When that job ends while the
cluster should run (the executor was lost, the task was killed), the slot's
job is submitted again, backing off when it keeps failing fast. What a loss
means for the cluster's state is the cluster's business: it hears of every
end through ``on_lost``.

One thread per cluster submits, watches and cancels every job
(:meth:`SparkSide.submit` returns at once; :meth:`SparkSide.ended` looks at
all of them in one go), so the driver's thread count does not grow with the
nodes; and since every Spark call is made here, none is made under the
cluster's lock: the cluster asks (:meth:`WorkerJobs.start`,
:meth:`WorkerJobs.cancel`) and returns. All of a cluster's jobs share its
group, so teardown is one cancel; each slot's jobs also carry a tag of their
own, so a slot the cluster no longer wants is cancelled alone, even while its
job still waits for a free task slot. The session's kind (classic or Connect)
is :mod:`raydist.engine.spark.side`'s business.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from raydist.backoff import Backoff
from raydist.engine.cluster.slot import WorkerSlot, first_error_line
from raydist.engine.node.launch import NodePlan, prestart_python_worker, run_worker_node
from raydist.engine.spark.side import SparkJob, SparkSide
from raydist.engine.spark.sides import side_of

__all__ = ["HEALTHY_RUN_S", "MAX_BACKOFF_S", "WorkerJobs", "backoff_s"]

log = logging.getLogger(__name__)

#: A job that ran at least this long was healthy: its end resets the backoff.
HEALTHY_RUN_S = 60.0
#: Backoff after the n-th quick failure in a row: 0.5 s * 2**n, at most this.
MAX_BACKOFF_S = 30.0
#: How often running jobs are looked at (while the cluster is torn down: more often).
POLL_S = 0.5
CLOSING_POLL_S = 0.05
_RESUBMIT = Backoff(0.5, MAX_BACKOFF_S)


def backoff_s(failures: int) -> float:
    """How long to wait before submitting a job again after ``failures``
    quick failures in a row (0: it ran long enough to count as healthy)."""
    return _RESUBMIT.after(failures + 1) if failures else 0.2


@dataclasses.dataclass
class _Running:
    slot: WorkerSlot
    job: SparkJob
    since: float


class WorkerJobs:
    """Runs worker slots' Spark jobs for one cluster. ``plan`` (the workers'
    plan) and ``profile`` (their ResourceProfile, or None) are set at launch;
    ``issue`` gives each slot's node its own node secret; ``on_lost(slot,
    reason)`` is told of every end of a slot's job and returns whether to
    submit it again. ``side`` is the session's engine view (``side_of(spark)``
    by default)."""

    def __init__(self, spark: Any, *, group: str, cluster: str, temp_root: str, stopping: threading.Event,
                 on_lost: Callable[[WorkerSlot, str], bool], record: Callable[[str], None],
                 issue: Callable[[str], str], side: SparkSide | None = None) -> None:
        self._side = side or side_of(spark)
        self._group = group
        self._cluster = cluster
        self._temp_root = temp_root
        self._stopping = stopping
        self._on_lost = on_lost
        self._record = record
        self._issue = issue
        self.plan: NodePlan | None = None
        self.profile: Any = None
        self._cond = threading.Condition()
        self._asks: deque[tuple[str, Any]] = deque()  # ("start"|"cancel"|"prestart", slot or count)
        self._running: dict[str, _Running] = {}  # by slot key (this thread's alone)
        self._timers: list[tuple[float, int, WorkerSlot]] = []  # resubmissions due (this thread's alone)
        self._failures: dict[str, int] = {}
        self._seq = itertools.count()
        self._closing = False
        self._close_by = 0.0
        self._ready = False  # begin() was called (this thread's alone)
        self._held: list[WorkerSlot] = []  # started before begin()
        self._thread: threading.Thread | None = None

    def temp_dir(self, slot: WorkerSlot) -> str:
        return f"{self._temp_root}-{slot.key}"

    # asks (any thread; none waits for Spark) -----------------------------------

    def start(self, slot: WorkerSlot) -> None:
        """Keep ``slot``'s job running until the cluster stops or the slot
        retires. Once per slot: a slot started already is left as it is (two
        jobs for one node would keep stopping each other); before
        :meth:`begin` the job waits for the workers' plan."""
        if slot.in_spark:
            return
        slot.in_spark = True
        self._ask("start", slot)

    def begin(self) -> None:
        """The workers' plan and profile are set: submit the slots started so far, and any later at once."""
        self._ask("begin", None)

    def cancel(self, slot: WorkerSlot) -> None:
        """Cancel ``slot``'s jobs (running or still waiting for a task slot)."""
        self._ask("cancel", slot)

    def prestart(self, executors: int) -> None:
        """Run one short task per executor (as Spark spreads them) with the
        workers' task resources, so that the nodes an elastic cluster adds
        later find each executor's Python worker daemon running. In the
        cluster's job group: teardown cancels it."""
        self._ask("prestart", executors)

    def close(self, deadline: float) -> None:
        """After the cluster's group was cancelled: stop submitting, and
        wait (until ``deadline``) for the jobs to end."""
        with self._cond:
            self._closing = True
            self._close_by = deadline
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.1, deadline - time.monotonic()))

    def _ask(self, what: str, arg: Any) -> None:
        with self._cond:
            self._asks.append((what, arg))
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, daemon=True, name=f"raydist-{self._cluster}-jobs")
                self._thread.start()
            self._cond.notify_all()

    # the jobs' thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                poll = CLOSING_POLL_S if self._closing else POLL_S  # a teardown waits on these ends
                due = self._timers[0][0] if self._timers else time.monotonic() + poll
                wait = min(poll, due - time.monotonic()) if self._running or self._timers else poll
                if not self._asks and wait > 0:
                    self._cond.wait(wait)
                asks = list(self._asks)
                self._asks.clear()
                closing = self._closing
            if closing and ((not self._running and not asks) or time.monotonic() > self._close_by):
                break  # every job ended, or the teardown stopped waiting for them
            try:
                self._step(asks, closing)
            except Exception:  # noqa: BLE001 - the loop must outlive one bad call
                log.exception("cluster %s: watching its worker jobs failed", self._cluster)
                time.sleep(POLL_S)
        for left in [t[2] for t in self._timers] + self._held:
            left.in_spark = False
        self._timers.clear()
        self._held.clear()

    def _step(self, asks: list[tuple[str, Any]], closing: bool) -> None:
        for what, arg in asks:
            if what == "begin":
                self._ready = True
                held, self._held = self._held, []
                for slot in held:
                    self._submit(slot)
            elif what == "start" and not closing and not self._ready:
                self._held.append(arg)
            elif what == "start" and not closing:
                self._submit(arg)
            elif what == "start":
                arg.in_spark = False
            elif what == "cancel":
                self._side.cancel(tag=self._tag(arg))  # the node's own stop ends its job anyway
            elif what == "prestart" and not closing:
                self._side.submit(prestart_python_worker, arg, group=self._group, profile=self.profile,
                                  description=f"raydist cluster {self._cluster}: warm the executors for new nodes")
        ended = self._side.ended([r.job for r in self._running.values()]) if self._running else []
        runs = {id(r.job): r for r in self._running.values()} if ended else {}
        for job in ended:
            run = runs[id(job)]
            del self._running[run.slot.key]
            error = job.error()
            self._ended(run, first_error_line(RuntimeError(error)) if error else "its Spark task ended", closing)
        now = time.monotonic()
        while self._timers and (self._timers[0][0] <= now or closing):
            _, _, slot = heapq.heappop(self._timers)
            if closing or self._stopping.is_set() or slot.retired.is_set():
                slot.in_spark = False
            else:
                self._record(f"resubmitting worker {slot.key}")
                self._submit(slot)

    def _submit(self, slot: WorkerSlot) -> None:
        if slot.key in self._running:
            return  # its job runs: one job per slot
        if self._stopping.is_set() or slot.retired.is_set():
            slot.in_spark = False
            return
        assert self.plan is not None
        plan = dataclasses.replace(self.plan, key=slot.key, node_secret=self._issue(slot.key),
                                   temp_dir=self.temp_dir(slot))
        run = _Running(slot, _Failed(""), time.monotonic())
        try:
            run.job = self._side.submit(functools.partial(run_worker_node, plan), group=self._group,
                                        tag=self._tag(slot), profile=self.profile,
                                        description=f"raydist cluster {self._cluster}: Ray worker {slot.key}")
        except Exception as exc:  # noqa: BLE001 - a job that could not be submitted ended at once
            run.job = _Failed(str(exc) or type(exc).__name__)
        self._running[slot.key] = run

    def _ended(self, run: _Running, reason: str, closing: bool) -> None:
        slot = run.slot
        if closing or self._stopping.is_set() or slot.retired.is_set() or not self._on_lost(slot, reason):
            slot.in_spark = False
            return
        healthy = time.monotonic() - run.since > HEALTHY_RUN_S
        failures = self._failures[slot.key] = 0 if healthy else self._failures.get(slot.key, 0) + 1
        heapq.heappush(self._timers, (time.monotonic() + backoff_s(failures), next(self._seq), slot))

    def _tag(self, slot: WorkerSlot) -> str:
        return f"{self._group}-{slot.tag}"


class _Failed(SparkJob):
    """A job that never ran (its submission failed)."""

    def __init__(self, why: str) -> None:
        self._why = why

    def ended(self) -> bool:
        return True

    def error(self) -> str:
        return self._why
