"""A Spark Connect session: no SparkContext here, only the DataFrame API over gRPC.

A node's task is a one-row ``mapInArrow`` with the node's ResourceProfile;
jobs carry tags (``spark.addTag``: the cluster's and the node's) and are
cancelled with ``spark.interruptTag``. Executors are found by a short probe
job, since Connect has no status tracker. For the same reason a client sees
only its own work waiting for slots: :meth:`ConnectSide.waiting_tasks` counts
the tasks of this client's queries that have not started, from the progress
reports the server sends while each runs (``registerProgressHandler``),
leaving out the queries raydist's own threads run (the nodes' tasks). Other
clients' work stays invisible, so the session cluster also keeps its short
idle hold there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from raydist.engine.sizing import local_cluster_shape
from raydist.engine.spark.side import AnnouncingBody, SparkSide, TaskBody, _wrap_stop, missing_raydist
from raydist.engine.threads import on_raydist_thread
from raydist.errors import ClusterFailedError

__all__ = ["ConnectSide"]

log = logging.getLogger(__name__)

#: How long each probe task lingers, so that Spark spreads the probe over
#: every executor with a free slot instead of reusing the first one.
_PROBE_LINGER_S = 0.3


def _arrow_body(body: TaskBody) -> Any:
    """``mapInArrow`` function that runs ``body`` once per partition."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:
            pass  # the partition's one row says nothing; the body is the work
        yield pa.RecordBatch.from_pylist([{"out": body()}], schema=pa.schema([("out", pa.string())]))

    return run


def _announcing_arrow_body(body: AnnouncingBody, key: str) -> Any:
    """``mapInArrow`` function of a two-task barrier stage: task 1 runs
    ``body``; task 0, the herald, waits for what the body announces and ends
    with it as its result, which Spark then delivers to the client. The body
    announces at a meeting the herald chairs (:mod:`raydist.engine.spark.meeting`,
    ``key`` the stage's): a round of the barrier's ``allGather``, the one way
    Spark gives a running task to speak, costs both tasks a second."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import BarrierTaskContext

        from raydist.engine.spark.meeting import Chair, Seat, meeting_ports

        ctx = BarrierTaskContext.get()
        for _ in batches:
            pass
        herald = ctx.getTaskInfos()[0].address.rsplit(":", 1)[0]
        if ctx.partitionId() == 0:
            chair = Chair(herald, key, 2, meeting_ports(key))
            try:
                with contextlib.closing(Seat.join(herald, [chair.port], key, 0, "")) as seat:
                    out = str(seat.everyone[1])
            finally:
                chair.close(wait=False)
        else:
            said: list[str] = []

            def announce(line: str) -> None:
                if not said:
                    said.append(line)
                    Seat.join(herald, meeting_ports(key), key, 1, line).close()

            out = body(announce)
            announce("")  # a body that announced nothing still frees its herald
        yield pa.RecordBatch.from_pylist([{"out": out}], schema=pa.schema([("out", pa.string())]))

    return run


def executor_identity() -> str:
    """Probe body: this task's host and executor (its JVM's pid)."""
    import psutil

    time.sleep(_PROBE_LINGER_S)
    jvm = 0
    try:
        for proc in psutil.Process().parents():
            if proc.name() == "java":
                jvm = proc.pid
                break
    except psutil.Error:
        pass
    return json.dumps({"host": socket.gethostname(), "jvm": jvm})


class _OwnWaitingTasks:
    """A Connect progress handler: tasks of this client's queries not started
    yet, by query, from the latest report of each; a query raydist's own
    threads run is not counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, int] = {}

    def __call__(self, stages: Any, inflight_tasks: int, operation_id: str | None, done: bool) -> None:
        if on_raydist_thread():
            return
        key = operation_id or ""
        left = sum(max(0, s.num_tasks - s.num_completed_tasks) for s in (stages or ()) if not s.done)
        with self._lock:
            if done:
                self._waiting.pop(key, None)
            else:
                self._waiting[key] = max(0, left - int(inflight_tasks or 0))

    def count(self) -> int:
        with self._lock:
            return sum(self._waiting.values())


class ConnectSide(SparkSide):
    kind = "connect"

    def __init__(self, spark: Any) -> None:
        super().__init__(spark)
        self._own_waiting: _OwnWaitingTasks | None = None
        try:
            handler = _OwnWaitingTasks()
            spark.registerProgressHandler(handler)
            self._own_waiting = handler
        except Exception as exc:  # noqa: BLE001 - a client without progress reports: blind as before
            log.debug("registerProgressHandler: %s", exc)

    def stopped(self) -> bool:
        return bool(self.spark.is_stopped)

    def alive(self) -> bool:
        if self.stopped():
            return False
        try:
            self.spark.conf.get("spark.app.name", None)  # one small round trip to the server
            return True
        except Exception:  # noqa: BLE001 - the server does not answer
            return False

    def discard(self) -> None:
        try:
            self.spark.stop()
        except Exception as exc:  # noqa: BLE001 - the server is gone already
            log.debug("stopping a dead Connect session: %s", exc)

    def conf(self, key: str, default: str | None = None) -> str | None:
        try:
            value = self.spark.conf.get(key, None)
        except Exception as exc:  # noqa: BLE001 - a key the server will not show reads as unset
            log.debug("conf.get(%s): %s", key, exc)
            value = None
        return value if value is not None else default

    @property
    def master(self) -> str:
        return self.conf("spark.master", "") or ""

    @contextlib.contextmanager
    def _active(self) -> Iterator[None]:
        """This session as the calling thread's active one: Connect resolves
        resource profiles through the thread's active session, and engine
        threads have none of their own."""
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        slot = ConnectSession._active_session
        previous = getattr(slot, "session", None)
        slot.session = self.spark
        try:
            yield
        finally:
            slot.session = previous

    def executor_hosts(self) -> dict[str, int]:
        shape = local_cluster_shape(self.master)
        if shape is not None:
            # A local-cluster master starts every executor on its own host at
            # once: nothing to probe (a job of its own, seconds on a first run).
            # Executors that cannot import raydist fail the head's task instead.
            return {self.driver_host(): shape[0]}
        n = max(2, self.default_parallelism())
        seen: set[tuple[str, int]] = set()
        try:
            for line in self.run_tasks(executor_identity, n, group=f"raydist-probe-{os.getpid()}",
                                       description="raydist: find the executors"):
                found = json.loads(line)
                seen.add((str(found["host"]), int(found["jvm"])))
        except Exception as exc:  # noqa: BLE001 - no probe, no executors known
            if (missing := missing_raydist(self, str(exc))) is not None:
                raise ClusterFailedError(missing) from None  # waiting for executors cannot help
            log.info("executor probe failed: %s", exc)
        hosts: dict[str, int] = {}
        for host, _ in seen:
            hosts[host] = hosts.get(host, 0) + 1
        return hosts

    def default_parallelism(self) -> int:
        given = self.conf("spark.default.parallelism")
        if given:
            return int(given)
        shape = local_cluster_shape(self.master)
        if shape is not None:
            return shape[0] * shape[1]
        return max(2, int(self.conf("spark.executor.instances", "0") or 0) *
                   int(self.conf("spark.executor.cores", "1") or 1))

    @contextlib.contextmanager
    def _labelled(self, group: str, tag: str) -> Iterator[None]:
        """The calling thread's operations carry ``group`` and ``tag``."""
        labels = [label for label in (group, tag) if label]
        with self._active():
            for label in labels:
                self.spark.addTag(label)  # this thread's operations only
            try:
                yield
            finally:
                for label in labels:
                    with contextlib.suppress(Exception):
                        self.spark.removeTag(label)

    def _job_labels(self, group: str, description: str) -> contextlib.AbstractContextManager[None]:
        return self._labelled(group, "")

    def run_tasks(self, body: TaskBody, n: int = 1, *, group: str, tag: str = "", profile: Any = None,
                  description: str = "", barrier: bool = False) -> list[str]:
        with self._labelled(group, tag):
            df = self.spark.range(n, numPartitions=n)
            out = df.mapInArrow(_arrow_body(body), "out string", barrier=barrier, profile=profile)
            return [row.out for row in out.collect()]

    def run_announcing(self, body: AnnouncingBody, *, group: str, tag: str = "", profile: Any = None,
                       description: str = "", on_announce: Callable[[str], None]) -> str:
        # The herald holds a task slot of the body's size for as long as the
        # announcement takes to reach this process (seconds), then frees it.
        with self._labelled(group, tag):
            df = self.spark.range(2, numPartitions=2)
            rows = df.mapInArrow(_announcing_arrow_body(body, secrets.token_hex(16)), "out string", barrier=True,
                                 profile=profile)
            said, result = "", ""
            for index, row in enumerate(rows.toLocalIterator()):  # in partition order: the herald's first
                if index == 0:
                    said = row.out
                    if said:
                        on_announce(said)
                else:
                    result = row.out
            return result

    def cancel(self, *, group: str = "", tag: str = "") -> None:
        for label in (group, tag):
            if label and not self.stopped():
                try:
                    self.spark.interruptTag(label)
                except Exception as exc:  # noqa: BLE001 - a session going away has nothing left to cancel
                    log.debug("interruptTag(%s): %s", label, exc)

    def waiting_tasks(self, ignore_group: str = "") -> int | None:
        # Connect shows a client no scheduler state: only its own queries' progress.
        return self._own_waiting.count() if self._own_waiting is not None else None

    def running_tasks(self) -> int | None:
        return None

    def on_stop(self, hook: Callable[[Any], None]) -> None:
        _wrap_stop(self.spark, self.spark, hook)

    def resource_profile(self, cpus: int, gpus: float) -> Any:
        profile = super().resource_profile(cpus, gpus)
        with self._active():
            profile.id  # noqa: B018 - registered on the server now, in a thread that has the session
        return profile
