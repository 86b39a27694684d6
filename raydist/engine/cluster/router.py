"""What the nodes say, turned into the cluster's state.

Every node-link event (a hello, a node up, a node stopped, a demand reading)
and every end of a worker's Spark job reaches the cluster here, under its
lock: :class:`LinkRouter` finds the head or the worker slot it concerns,
updates it, and asks :mod:`raydist.engine.cluster.states` what the cluster
becomes.
"""

from __future__ import annotations

from typing import Any

from raydist.engine.cluster.lifecycle import ClusterLifecycle
from raydist.engine.cluster.slot import WorkerSlot
from raydist.engine.cluster.states import fault_fails
from raydist.engine.link import messages
from raydist.engine.link.channel import NodeLink
from raydist.engine.node.launch import HEAD_KEY
from raydist.engine.spark import session as spark_side
from raydist.engine.spark.side import missing_raydist
from raydist.engine.spark.sides import side_of
from raydist.spec import State

__all__ = ["LinkRouter"]


class LinkRouter(ClusterLifecycle):
    """The cluster's listeners: node-link events, the head's and the workers' Spark jobs ending."""

    def _on_link(self, event: str, link: NodeLink) -> None:
        with self._lock:
            if link.key == HEAD_KEY:
                self._on_head(event, link)
                return
            slot = self._pool.find(link.key)
            if slot is None:
                return
            if event in ("hello", "resumed") and self._head.in_task and self._head.up:
                # Said again on a resumed link: it may have been lost with the old connection.
                link.tell(messages.head(self.address))
            change = slot.on_link(event, link, stopping=self._stopping.is_set() or slot.retired.is_set())
            if change is not None:
                record, lost = change
                if record:
                    self._record(record)
                self._refresh_state(lost)

    def _on_head(self, event: str, link: NodeLink) -> None:
        if event == "hello":
            if self._head.link is not None and self._head.in_task:
                link.stop()  # Spark ran the head's task again: the workers know the first one only
                return
            self._head.link = link
        elif event == "demand" and link is self._head.link:
            if (reading := self._demand.add(link.demand)) is not None:
                self._on_demand(reading)
        elif event == "started" and link is self._head.link:
            if self._head.in_task:
                self._set_addresses(link.node_ip, link.info.get("ports", {}))
                for slot in self._pool.every():
                    if slot.link is not None:
                        slot.link.tell(messages.head(self.address))
            self._head.up = True
            self._record(f"head up at {self.address}" + (f" on {link.host}" if self._head.in_task else ""))
            self._refresh_state()
        elif (event in ("stopped", "closed") and link is self._head.link
              and fault_fails(self._state, stopping=self._stopping.is_set())):
            self._head.up = False
            # The workers cannot outlive their GCS: the whole cluster goes.
            self._fail(self._with_head_tail(f"the head node stopped: {link.ended_why()}"))

    def _on_demand(self, reading: dict[str, Any]) -> None:
        """A demand reading from the head (called with the lock held)."""
        if self._stopping.is_set() or self._state.terminal:
            return
        if self._scaler.on_demand(reading, self.spec, self._cpus, ready=self._state != State.CREATING):
            self._refresh_state()

    def _on_worker_lost(self, slot: WorkerSlot, reason: str) -> bool:
        """A worker's Spark job ended; returns whether to submit it again."""
        missing = missing_raydist(side_of(self._spark), reason)  # may read a setting: not under the lock
        with self._lock:
            if slot.retired.is_set():
                slot.up = False
                return False
            slot.up = False
            slot.last_reason = reason
            if spark_side.is_stopped(self._spark):
                # Nothing can run its Spark jobs again: the cluster ends here.
                if fault_fails(self._state, stopping=self._stopping.is_set()):
                    self._fail("its SparkSession was stopped")
                return False
            if missing is not None:
                # Resubmitting cannot help: the executors' Python lacks raydist.
                self._set_state(State.FAILED, missing)
                return False
            self._refresh_state(f"worker {slot.key} lost: {reason}")
        return self.spec.self_heal

    def _on_head_job_end(self, reason: str) -> None:
        """The head's supervisor or Spark job ended: the cluster fails unless
        it is being torn down."""
        missing = missing_raydist(side_of(self._spark), reason) if self._head.in_task else None  # not under the lock
        with self._lock:
            self._head.job_end = reason
            if not fault_fails(self._state, stopping=self._stopping.is_set()):
                self._changed.notify_all()
                return
            self._head.up = False
            where = "Spark task" if self._head.in_task else "node"
            self._fail(missing or self._with_head_tail(f"the head's {where} ended: {reason}"))

    def _with_head_tail(self, why: str) -> str:
        """``why`` the head went, with the last lines its node printed."""
        tail = " | ".join(self._head.tail()[-3:])
        return why + (f": {tail}" if tail else "")
