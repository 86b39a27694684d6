"""The Spark side of worker nodes: one Spark job per worker slot.

Each slot's job runs in a thread of its own (:func:`raydist.engine.slot.keep_filled`
submits it again when it ends). All of a cluster's jobs share its group, so
teardown is one cancel; each slot's jobs also carry a tag of their own, so a
slot the cluster no longer wants is cancelled alone, even while its job still
waits for a free task slot. The session's kind (classic or Connect) is
:mod:`raydist.engine.sparkside`'s business.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from raydist.engine.launch import NodePlan, run_worker_node, warm_executor
from raydist.engine.slot import WorkerSlot, keep_filled
from raydist.engine.sparkside import side_of

__all__ = ["WorkerJobs"]

log = logging.getLogger(__name__)


class WorkerJobs:
    """Runs worker slots' Spark jobs for one cluster. ``plan`` (the workers'
    plan) and ``profile`` (their ResourceProfile, or None) are set at launch;
    ``issue`` gives each slot's node its own link key."""

    def __init__(self, spark: Any, *, group: str, cluster: str, temp_root: str, stopping: threading.Event,
                 on_lost: Callable[[WorkerSlot, str], bool], record: Callable[[str], None],
                 issue: Callable[[str], str]) -> None:
        self._side = side_of(spark)
        self._group = group
        self._cluster = cluster
        self._temp_root = temp_root
        self._stopping = stopping
        self._on_lost = on_lost
        self._record = record
        self._issue = issue
        self.plan: NodePlan | None = None
        self.profile: Any = None

    def temp_dir(self, slot: WorkerSlot) -> str:
        return f"{self._temp_root}-{slot.key}"

    def start(self, slot: WorkerSlot) -> None:
        """Keep ``slot``'s job running, in a thread of its own, until the
        cluster stops or the slot retires."""
        slot.thread = threading.Thread(
            target=keep_filled, args=(slot,), daemon=True, name=f"raydist-{self._cluster}-{slot.key}",
            kwargs={"run_job": self._run, "stopping": self._stopping, "on_lost": self._on_lost,
                    "record": self._record},
        )
        slot.thread.start()

    def warm(self, executors: int) -> None:
        """In the background, run one short task per executor (as Spark
        spreads them) with the workers' task resources, so that the nodes an
        elastic cluster adds later find each executor's Python worker daemon
        running. In the cluster's job group: teardown cancels it."""

        def run() -> None:
            try:
                hosts = self._side.run_tasks(
                    warm_executor, executors, group=self._group, profile=self.profile,
                    description=f"raydist cluster {self._cluster}: warm the executors for new nodes")
                log.debug("cluster %s: warmed executors on %s", self._cluster, sorted(set(hosts)))
            except Exception as exc:  # noqa: BLE001 - an optimisation: a node starts without it too
                log.debug("cluster %s: warm-up job ended: %s", self._cluster, exc)

        threading.Thread(target=run, daemon=True, name=f"raydist-{self._cluster}-warm").start()

    def cancel(self, slot: WorkerSlot) -> None:
        """Cancel ``slot``'s jobs (running or still waiting for a task slot)."""
        self._side.cancel(tag=self._tag(slot))  # the node's own stop ends its job anyway

    def _tag(self, slot: WorkerSlot) -> str:
        return f"{self._group}-{slot.tag}"

    def _run(self, slot: WorkerSlot) -> None:
        assert self.plan is not None
        plan = dataclasses.replace(self.plan, key=slot.key, link_secret=self._issue(slot.key),
                                   temp_dir=self.temp_dir(slot))
        self._side.run_tasks(functools.partial(run_worker_node, plan), group=self._group, tag=self._tag(slot),
                             profile=self.profile,
                             description=f"raydist cluster {self._cluster}: Ray worker {slot.key}")
