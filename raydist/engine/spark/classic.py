"""A classic SparkSession: the SparkContext is in this process, reached through py4j.

Jobs run as one-partition RDDs (a node's task needs no data), labelled with
a job group (the cluster) and a job tag (the node); the status tracker says
what other work waits for slots.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Collection, Iterator
from typing import Any

from raydist.engine.ports import resolve_host
from raydist.engine.spark.side import SparkJob, SparkSide, TaskBody, _wrap_stop

__all__ = ["ClassicSide"]

log = logging.getLogger(__name__)


def _each(body: TaskBody, _partition: Iterator[Any]) -> Iterator[str]:
    yield body()


class _FutureJob(SparkJob):
    """A job submitted with ``collectAsync``: the JVM runs it, nothing here waits."""

    def __init__(self, future: Any, job_ids: list[int]) -> None:
        self.future = future
        self.job_ids = job_ids
        self._error: str | None = None

    def ended(self) -> bool:
        try:
            return bool(self.future.isDone())
        except Exception:  # noqa: BLE001 - the gateway is gone: so is the job
            return True

    def error(self) -> str:
        if self._error is None:
            try:
                self.future.get()
                self._error = ""
            except Exception as exc:  # noqa: BLE001 - a failed or cancelled job says why here
                self._error = str(exc) or type(exc).__name__
        return self._error


class ClassicSide(SparkSide):
    kind = "classic"

    def stopped(self) -> bool:
        return self.spark.sparkContext._jsc is None

    def alive(self) -> bool:
        try:
            return not self.stopped() and not bool(self.spark.sparkContext._jsc.sc().isStopped())
        except Exception:  # noqa: BLE001 - py4j's gateway is gone: the JVM died
            return False

    def discard(self) -> None:
        # PySpark keeps the dead JVM's gateway and context in class fields;
        # with them cleared, the next SparkSession starts a JVM of its own.
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        sc = self.spark.sparkContext
        try:
            if sc._gateway is not None:
                sc._gateway.shutdown()
        except Exception as exc:  # noqa: BLE001 - it is gone already
            log.debug("closing a dead gateway: %s", exc)
        sc._jsc = None
        SparkContext._gateway = None  # type: ignore[attr-defined]
        SparkContext._jvm = None  # type: ignore[attr-defined]
        SparkContext._active_spark_context = None  # type: ignore[attr-defined]
        SparkSession._instantiatedSession = None  # type: ignore[attr-defined]
        SparkSession._activeSession = None  # type: ignore[attr-defined]

    def conf(self, key: str, default: str | None = None) -> str | None:
        value = self.spark.sparkContext.getConf().get(key, None)
        return value if value is not None else default

    @property
    def master(self) -> str:
        return str(self.spark.sparkContext.master)

    @property
    def ui_url(self) -> str:
        return str(self.spark.sparkContext.uiWebUrl or "")

    def executor_hosts(self) -> dict[str, int]:
        # Spark's list includes the driver: it is dropped from the driver's
        # host (compared by address: one side may say a name, the other an IP).
        sc = self.spark.sparkContext
        hosts: dict[str, int] = {}
        for info in sc._jsc.sc().statusTracker().getExecutorInfos():
            hosts[info.host()] = hosts.get(info.host(), 0) + 1
        driver_ip = resolve_host(self.driver_host())
        for host in list(hosts):
            if resolve_host(host) == driver_ip:
                hosts[host] -= 1
                if hosts[host] <= 0:
                    del hosts[host]
                break
        return hosts

    def default_parallelism(self) -> int:
        return int(self.spark.sparkContext.defaultParallelism)

    @contextlib.contextmanager
    def _job_labels(self, group: str, description: str) -> Iterator[None]:
        self.spark.sparkContext.setJobGroup(group, description, True)  # this thread's jobs
        yield

    @contextlib.contextmanager
    def _job(self, body: TaskBody, n: int, group: str, tag: str, profile: Any, description: str,
             barrier: bool = False) -> Iterator[Any]:
        """The RDD of ``n`` tasks running ``body`` (one barrier stage if
        ``barrier``), with this thread's group and tag set while it is
        submitted (labels are the submitting thread's)."""
        sc = self.spark.sparkContext
        sc.setJobGroup(group, description, True)
        if tag:
            sc.addJobTag(tag)
        try:
            rdd = sc.parallelize(range(n), n)
            if profile is not None:
                rdd = rdd.withResources(profile)
            each = functools.partial(_each, body)
            yield rdd.barrier().mapPartitions(each) if barrier else rdd.mapPartitions(each)
        finally:
            if tag and sc._jsc is not None:
                sc.removeJobTag(tag)

    def run_tasks(self, body: TaskBody, n: int = 1, *, group: str, tag: str = "", profile: Any = None,
                  description: str = "", barrier: bool = False) -> list[str]:
        with self._job(body, n, group, tag, profile, description, barrier) as rdd:
            return list(rdd.collect())

    def submit(self, body: TaskBody, n: int = 1, *, group: str, tag: str = "", profile: Any = None,
               description: str = "") -> SparkJob:
        # The JVM runs the job (collectAsync); no Python thread waits for it.
        with self._job(body, n, group, tag, profile, description) as rdd:
            future = rdd._jrdd.collectAsync()
            return _FutureJob(future, [int(i) for i in future.jobIds()])

    def ended(self, jobs: Collection[SparkJob]) -> list[SparkJob]:
        # One look at the running jobs for all of them; only a job that is
        # not among them (ended, or not started yet) is asked on its own.
        if not jobs:
            return []
        try:
            sc = self.spark.sparkContext
            ids = sc._jsc.sc().statusTracker().getActiveJobIds()
            running = {int(i) for i in str(sc._jvm.java.util.Arrays.toString(ids)).strip("[]").split(",") if i.strip()}
        except Exception:  # noqa: BLE001 - a stopped context: every job is asked (and has ended)
            running = set()
        return [job for job in jobs
                if not (isinstance(job, _FutureJob) and job.job_ids and set(job.job_ids) <= running) and job.ended()]

    def cancel(self, *, group: str = "", tag: str = "") -> None:
        sc = self.spark.sparkContext
        try:
            if group:
                sc.cancelJobGroup(group)
            if tag:
                sc.cancelJobsWithTag(tag)
        except Exception as exc:  # noqa: BLE001 - a stopped SparkContext has no jobs left
            log.debug("cancel(group=%s, tag=%s): %s", group, tag, exc)

    def waiting_tasks(self, ignore_group: str = "") -> int | None:
        tracker = self.spark.sparkContext.statusTracker()
        ignored = set(tracker.getJobIdsForGroup(ignore_group)) if ignore_group else set()
        theirs: set[int] = set()
        for job_id in tracker.getActiveJobsIds():
            job = None if job_id in ignored else tracker.getJobInfo(job_id)
            if job is not None:
                theirs.update(job.stageIds)
        waiting = 0
        for stage_id in tracker.getActiveStageIds():
            stage = tracker.getStageInfo(stage_id) if stage_id in theirs else None
            if stage is not None:
                waiting += max(0, stage.numTasks - stage.numActiveTasks - stage.numCompletedTasks)
        return waiting

    def running_tasks(self) -> int | None:
        tracker = self.spark.sparkContext.statusTracker()
        return sum(info.numActiveTasks for sid in tracker.getActiveStageIds()
                   if (info := tracker.getStageInfo(sid)) is not None)

    def on_stop(self, hook: Callable[[Any], None]) -> None:
        # On the SparkContext: spark.stop() and a direct sc.stop() both end there.
        sc = self.spark.sparkContext
        _wrap_stop(sc, self.spark, hook)

    def same_session(self, other: Any) -> bool:
        return getattr(other, "sparkContext", None) is self.spark.sparkContext
