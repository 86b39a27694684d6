"""A classic SparkSession: the SparkContext is in this process, reached through py4j.

Jobs run as one-partition RDDs (a node's task needs no data), labelled with
a job group (the cluster) and a job tag (the node); the status tracker says
what other work waits for slots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from raydist.engine.ports import resolve_host
from raydist.engine.sparkside import SparkSide, TaskBody, _wrap_stop

__all__ = ["ClassicSide"]

log = logging.getLogger(__name__)


def _each(body: TaskBody, _partition: Iterator[Any]) -> Iterator[str]:
    yield body()


class ClassicSide(SparkSide):
    kind = "classic"

    def stopped(self) -> bool:
        return self.spark.sparkContext._jsc is None

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

    def run_tasks(self, body: TaskBody, n: int = 1, *, group: str, tag: str = "", profile: Any = None,
                  description: str = "") -> list[str]:
        import functools

        sc = self.spark.sparkContext
        # Groups and tags are this thread's: each job runs in a thread of its own.
        sc.setJobGroup(group, description, True)
        if tag:
            sc.addJobTag(tag)
        try:
            rdd = sc.parallelize(range(n), n)
            if profile is not None:
                rdd = rdd.withResources(profile)
            return list(rdd.mapPartitions(functools.partial(_each, body)).collect())
        finally:
            if tag and sc._jsc is not None:
                sc.removeJobTag(tag)

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
