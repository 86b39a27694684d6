"""Runs in Spark's own tasks, and the session cluster's warm-up after them.

A part of :class:`~raydist.train.session.TrainingSession` (a mixin over its
fields and locks): where a distributor's run goes, by the pure rules
:func:`~raydist.train.session_rules.where_to_run` and
:func:`~raydist.train.session_rules.warm_up_now`, and the one thread that
starts the session cluster for the next run once runs in Spark's tasks have
paused.

Why runs go there first: pyspark's distributors run every job in one
barrier stage of Spark's tasks, and need no Ray. A first run that waits for
a Ray cluster pays the head's, the nodes' and Ray Train's starts before any
rank runs (more than pyspark's whole run on a small host); the same run in
Spark's tasks pays none of them. Once runs pause, the cluster starts on the
slots they left free, and the next run finds its workers warm (a fraction of
a second, where a barrier stage takes seconds).

``RAYDIST_FIRST_RUN`` chooses: ``spark`` (this way, the default) or ``ray``
(every run on the session cluster, started by the first run).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from raydist.backoff import Backoff
from raydist.engine.threads import spawn
from raydist.errors import TrainingConfigError
from raydist.train.session_rules import (
    WARM_UP_AFTER_MOST_S,
    WARM_UP_AFTER_S,
    RunPlace,
    Shape,
    warm_up_now,
    where_to_run,
)

if TYPE_CHECKING:
    from raydist.train.warm_run import WarmRuns

__all__ = ["SparkTaskRuns", "FIRST_RUN_ENV", "first_run_setting"]

log = logging.getLogger(__name__)

#: The setting that says where a run goes while the session cluster is not warm.
FIRST_RUN_ENV = "RAYDIST_FIRST_RUN"
_CHOICES = ("spark", "ray")
#: Where it goes unless the user says.
DEFAULT_FIRST_RUN = "spark"


def first_run_setting() -> str:
    """``spark`` or ``ray``: :data:`FIRST_RUN_ENV`, else the default."""
    value = os.environ.get(FIRST_RUN_ENV, "").strip().lower() or DEFAULT_FIRST_RUN
    if value not in _CHOICES:
        raise TrainingConfigError(FIRST_RUN_ENV, value, "set it to 'spark' (runs in Spark's tasks until the "
                                  "session cluster is warm) or 'ray' (every run on the session cluster)")
    return value


#: How often the warm-up looks again while the user's Spark work runs.
_BUSY_LOOK_S = 1.0


def _spark_busy(spark: Any) -> bool:
    """Whether other Spark work runs or waits on ``spark`` now (a session
    that cannot tell counts as idle)."""
    from raydist.engine.spark.sides import side_of

    try:
        side = side_of(spark)
        return bool(side.running_tasks() or side.waiting_tasks())
    except Exception as e:  # noqa: BLE001 - a session stopping under us: nothing to warm up for
        log.debug("reading Spark's tasks: %s", e)
        return False


class SparkTaskRuns:
    """Where runs go, and the warm-up after runs in Spark's tasks (mixed
    into TrainingSession, whose ``_lock``, ``_changed``, ``_held`` and
    leasing it uses)."""

    _lock: threading.Lock
    _changed: threading.Condition
    _held: Any
    warm_runs: WarmRuns

    def _init_spark_runs(self) -> None:
        self._spark_runs = 0  # runs in Spark's tasks now
        self._paused_since: float | None = None  # when the last one ended
        #: What the next run will want (its shape, each worker's resources,
        #: whether it reuses warm workers, how long to keep them, its
        #: SparkSession), once one has run in Spark's tasks; None: nothing to warm.
        self._next_run: tuple[Shape, dict[str, float], bool, float, Any] | None = None
        self._warmer: threading.Thread | None = None
        self._warming_up = False  # the warm-up thread is starting the cluster now
        self._cut_short = 0  # warm-ups cut short by a run in a row: each doubles the pause the next waits for
        self._pauses = Backoff(WARM_UP_AFTER_S, WARM_UP_AFTER_MOST_S)
        self._closing = False
        #: (id(SparkSession), GPU tasks) -> (it, its task slots)
        self._slots: dict[tuple[int, bool], tuple[Any, int]] = {}

    def run_place(self, *, needs_ray: bool, fits_spark: bool) -> RunPlace:
        """Where a run goes now (see :func:`where_to_run`)."""
        with self._lock:
            observed = self._observe(self._held, time.monotonic())  # type: ignore[attr-defined]
        place = where_to_run(observed, needs_ray=needs_ray, fits_spark=fits_spark)
        if place is RunPlace.RAY and observed is not None and observed.warm:
            self._warm_run_used()
        return place

    def spark_for_run(self, *, ranks: int, needs_ray: bool, per_task: int = 1, use_gpu: bool = False) -> Any | None:
        """The SparkSession a run of ``ranks`` processes, ``per_task`` to a
        task, goes to Spark's tasks on, or None: it runs on Ray.
        ``needs_ray``: the run asked for what only Ray serves; ``RAY_ADDRESS``
        and the user's own connection to a Ray cluster count too. A
        ``use_gpu`` run's tasks take their GPUs as Spark's default task
        resources say (``spark.task.resource.gpu.amount``)."""
        from raydist.engine.registry import registry
        from raydist.engine.spark import session as spark_side

        if first_run_setting() != "spark":
            return None
        needs_ray = needs_ray or bool(os.environ.get("RAY_ADDRESS")) or self.users_ray()
        if self.run_place(needs_ray=needs_ray, fits_spark=True) is not RunPlace.SPARK_TASKS:
            return None
        spark = spark_side.active_session() or registry.embedded_spark(None, {})
        return spark if -(-ranks // per_task) <= self._task_slots(spark, use_gpu) else None

    def _task_slots(self, spark: Any, use_gpu: bool) -> int:
        """How many tasks of ``spark.task.cpus`` (and, ``use_gpu``,
        ``spark.task.resource.gpu.amount`` GPUs) the session's executors run
        at once (read once per session: a barrier stage that finds fewer
        fails at once, naming the slots)."""
        from raydist.engine.spark import session as spark_side
        from raydist.train._resources import spark_task_resources

        key = (id(spark), use_gpu)
        with self._lock:
            known = self._slots.get(key)
        if known is None or known[0] is not spark:
            cpus, gpus = spark_task_resources()
            known = (spark, spark_side.capacity(spark).slots(cpus, gpus if use_gpu else 0))
            with self._lock:
                self._slots[key] = known
        return known[1]

    def users_ray(self) -> bool:
        """Whether this process is connected to a Ray cluster other than the
        session cluster (the user's own ``ray.init``): their runs go there."""
        from raydist.engine.connection import connected_address

        return connected_address() is not None and not self._on_session_cluster()  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def spark_tasks_run(self, want: Shape, resources_per_worker: Mapping[str, float], *, warm_workers: bool,
                        keep_warm_s: float, spark: Any) -> Iterator[None]:
        """Mark a run in Spark's tasks for the block. A session cluster that
        is not warm gives its slots back to it first (a warm-up under way is
        cut short). When runs have paused after it, the session cluster
        starts for the next one like it (and its warm run, with
        ``warm_workers``)."""
        with self._changed:
            self._spark_runs += 1
            if self._warming_up:
                self._cut_short += 1
            held = self._held
            give_back = held is not None and not held.runs and (not self._warming_up or held.warming)
            self._changed.notify_all()
        if give_back:
            self._give_back(held, "a run in Spark's tasks needs its slots")
        try:
            yield
        finally:
            with self._changed:
                self._spark_runs -= 1
                self._paused_since = time.monotonic()
                self._next_run = (want, dict(resources_per_worker), warm_workers, keep_warm_s, spark)
                if self._warmer is None and not self._closing:
                    self._warmer = spawn(self._warm_up_when_paused, name="raydist-session-warm-up")
                self._changed.notify_all()

    def _give_back(self, held: Any, why: str) -> None:
        """Free the slots ``held`` takes, unless a run took it meanwhile: its
        worker nodes, or all of it where its head holds a slot too."""
        if held.cluster.head_holds_slot:
            self._retire(held, why)  # type: ignore[attr-defined]
        elif held.shape.workers:
            self._shrink(held, why)  # type: ignore[attr-defined]

    def _warm_up_when_paused(self) -> None:
        """The warm-up thread: waits for runs in Spark's tasks to pause, then
        starts the session cluster for the next run; ends when nothing is
        left to warm."""
        while True:
            with self._changed:
                while True:
                    if self._closing or self._next_run is None:
                        self._warmer = None
                        return
                    pause_s = self._pauses.after(self._cut_short + 1)
                    paused = time.monotonic() - (self._paused_since or 0.0)
                    if not self._spark_runs and paused >= pause_s:
                        break
                    self._changed.wait(None if self._spark_runs else pause_s - paused)
                want, resources, warm_workers, keep_warm_s, spark = self._next_run
            busy = _spark_busy(spark)  # asked of Spark outside the lock
            with self._changed:
                if self._closing or self._next_run is None:
                    continue
                if busy and not self._spark_runs:
                    self._changed.wait(_BUSY_LOOK_S)  # the user's Spark work: look again when it may be done
                    continue
                observed = self._observe(self._held, time.monotonic())  # type: ignore[attr-defined]
                go = warm_up_now(observed, spark_runs=self._spark_runs, paused_s=paused, keep_warm_s=keep_warm_s,
                                 pause_s=pause_s, spark_busy=busy)
                self._next_run = None
                self._warming_up = go
            if go:
                try:
                    self._warm_up(want, resources, warm_workers, keep_warm_s, spark)
                except Exception as e:  # noqa: BLE001 - the next run starts what it needs itself
                    log.info("warming the session cluster up for the next run: %s", e)
                finally:
                    with self._changed:
                        self._warming_up = False
                        self._changed.notify_all()

    def _warm_up(self, want: Shape, resources: dict[str, float], warm_workers: bool, keep_warm_s: float,
                 spark: Any) -> None:
        """Start (or grow) the session cluster to ``want`` on ``spark`` and,
        with ``warm_workers``, its warm run. Meanwhile the cluster is
        *warming*: unlike a run, it gives its slots back to a run in Spark's
        tasks or to Spark work that waits for them (the warm run is let go,
        and this returns)."""
        from raydist.engine.spark import session as spark_side
        from raydist.train._env import RUN_ENV, run_settings

        if spark_side.is_stopped(spark):
            return
        log.info("warming the session cluster up for the next run: %d workers x %d CPU", want.workers, want.cpus)
        held = self._lease(want, keep_warm_s, spark)  # type: ignore[attr-defined]
        with self._changed:
            held.warming += 1
            cut_short = self._spark_runs > 0  # a run came while it started
        self._unlease(held)  # type: ignore[attr-defined]
        try:
            if cut_short:
                self._give_back(held, "a run in Spark's tasks needs its slots")
                return
            self._connect_to(held.cluster)  # type: ignore[attr-defined]
            if warm_workers:
                def wanted() -> bool:  # not once a run or Spark work has taken the slots back
                    return self._held is held and held.shape.workers >= want.workers and not self._spark_runs

                with run_settings(RUN_ENV):
                    self.warm_runs.prepare(workers=want.workers, resources_per_worker=resources,
                                           keep_warm_s=keep_warm_s, still_wanted=wanted)
        finally:
            with self._changed:
                held.warming -= 1
                held.idle_since = time.monotonic()
                self._changed.notify_all()

    def _warm_run_used(self) -> None:
        """A run found the session cluster warm: warm-ups pay again, after
        the shortest pause."""
        with self._changed:
            self._cut_short = 0

    def _stop_warming(self) -> None:
        """No more warm-ups (the session is closing); one under way ends with
        the cluster it starts."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
