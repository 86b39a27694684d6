"""What a process keeps between training runs, and its one owner.

Spark users call a distributor many times in one session and never name a
cluster. :class:`TrainingSession` is this process's owner of everything that
outlives one run:

- the *session cluster*: a raydist cluster on the active SparkSession (the
  user's own, else the embedded one), started by the first run that names no
  cluster and finds no ``RAY_ADDRESS``, grown or replaced when a later run
  needs more, and retired when it has idled ``keep_warm_s``, when its
  SparkSession stops, or at exit. When other Spark jobs wait for its task
  slots it gives them back: its worker nodes go and a head on the driver
  stays, for the next run to grow again (a head in a task of its own, on
  Connect, goes too). The decisions are the pure rules of
  :mod:`raydist.train.session_rules`;
- the warm Ray Train run on the cluster this process is connected to
  (:class:`~raydist.train.warm_run.WarmRuns`, ``.warm_runs``);
- the local forker (:class:`~raydist.train.local.LocalRun`, ``local_mode=True``).

Runs *lease* the session cluster: one with runs on it is never torn down or
replaced (a run that needs other nodes waits for them to end, and runs that
fit queue behind it). Each session cluster has exactly one reaper thread,
which ends with it.

Locks: ``_lifecycle`` serializes starting, growing, shrinking and retiring
session clusters, always taken first; ``_lock`` guards the fields, never held
while calling out (Ray, Spark, ``down``). Disconnecting this process from a
cluster that goes is :mod:`raydist.engine.connection`'s job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raydist.engine.connection import connected_address, process_ray, same_address
from raydist.engine.spark.side import is_connect
from raydist.engine.threads import spawn
from raydist.errors import (
    CapacityError,
    ClusterFailedError,
    ConnectionInUseError,
    NodeStartTimeoutError,
    TrainingConfigError,
)
from raydist.spec import State
from raydist.train._env import RUN_ENV
from raydist.train._mlflow import note_cluster
from raydist.train._resources import check_resources, run_shape
from raydist.train.session_rules import IdleStep, Observed, RunStep, Shape, for_run, while_idle
from raydist.train.session_spark_runs import SparkTaskRuns
from raydist.train.warm_run import WarmRuns

if TYPE_CHECKING:
    from raydist.engine.cluster import RayCluster
    from raydist.train.local import LocalRun

__all__ = ["TrainingSession", "training_session", "DEFAULT_KEEP_WARM_S", "RUN_ENV"]

log = logging.getLogger(__name__)

#: How long the session cluster, a warm run and the local forker stay up
#: after the last run, unless the run asked otherwise.
DEFAULT_KEEP_WARM_S = 120.0
#: The longest a session cluster idles where Spark cannot show all the
#: waiting work it would yield to (Spark Connect shows a client only its own):
#: another client's Spark job right after a run waits at most this long.
BLIND_KEEP_WARM_S = 15.0
#: How often the reaper looks at an idle session cluster and Spark's waiting tasks.
_REAP_EVERY_S = 0.2


@dataclass(eq=False)
class _Held:
    """One session cluster and what its life depends on."""

    cluster: RayCluster
    shape: Shape
    #: Worker shares the head node carries (1 where the head has a Spark task
    #: of its own, on Connect): ``shape.workers`` counts it.
    head_share: int = 0
    runs: int = 0
    #: Warm-ups under way (:mod:`raydist.train.session_spark_runs`): a run
    #: waits for one, Spark work that wants the slots does not.
    warming: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    spark_waiting_since: float | None = None
    #: What a run on it raises when it ends under the run (it did not come
    #: up, or its SparkSession stopped): the reason, not Ray's symptom.
    failure: BaseException | None = None
    gone: threading.Event = field(default_factory=threading.Event)


class TrainingSession(SparkTaskRuns):
    """This process's session cluster, warm run and local forker (see the
    module docstring). Get it with :func:`training_session`."""

    def __init__(self) -> None:
        self._lifecycle = threading.Lock()  # starting, growing, shrinking, retiring session clusters; taken first
        self._lock = threading.Lock()  # guards the fields below; never held while calling out
        self._changed = threading.Condition(self._lock)
        self._held: _Held | None = None
        self._replacers = 0  # runs waiting for the runs on the session cluster to end, to replace it
        self._keep_warm_s = DEFAULT_KEEP_WARM_S
        self._local: LocalRun | None = None
        #: The warm Ray Train run on the connected cluster.
        self.warm_runs = WarmRuns()
        process_ray().before_disconnect(self.warm_runs.let_go)
        self._init_spark_runs()

    # ----------------------------------------------------------- clusters

    @property
    def cluster(self) -> RayCluster | None:
        """The session cluster, while one is kept."""
        held = self._held
        return held.cluster if held is not None else None

    @contextlib.contextmanager
    def connected(
        self,
        cluster: Any,
        *,
        workers: int,
        resources_per_worker: Mapping[str, float],
        use_gpu: bool,
        keep_warm_s: float | None = None,
    ) -> Iterator[Any]:
        """Connect this process to the cluster a run of ``workers`` workers,
        each taking ``resources_per_worker``, uses, for the run.

        ``cluster`` is a handle or a name; ``None`` means, in order: the Ray
        cluster this process is already connected to, ``RAY_ADDRESS``, else
        the session cluster (started or grown here to :func:`run_shape`, and
        leased for the run). Yields the cluster handle (None for a plain Ray
        address). The session cluster is kept ``keep_warm_s`` after the run.
        """
        import ray

        from raydist.train._env import run_settings

        t0 = time.monotonic()
        process_ray().sync()
        handle = self._resolve(cluster)
        held: _Held | None = None
        if handle is None and (
            self._on_session_cluster() or (connected_address() is None and not os.environ.get("RAY_ADDRESS"))
        ):
            held = self._lease(run_shape(workers, resources_per_worker, use_gpu), keep_warm_s)
            handle = held.cluster
        connected_here = False
        try:
            with run_settings(RUN_ENV):
                if handle is not None:
                    self._connect_to(handle)
                elif not ray.is_initialized():
                    ray.init(log_to_driver=True)
                    connected_here = True
                if held is None:  # the session cluster is sized for the run
                    check_resources(workers, float(resources_per_worker.get("CPU", 1) or 0), use_gpu)
                note_cluster(wait_s=time.monotonic() - t0, name=handle.name if handle is not None else "",
                             session_cluster=held is not None, workers=workers,
                             resources_per_worker=dict(resources_per_worker))
                yield handle
        except BaseException as e:
            if held is not None and held.failure is not None:
                raise held.failure from e  # the run ended because its cluster did
            if isinstance(e, SystemExit) and connected_address() is None:
                # What Ray raises in a thread waiting on a connection that
                # another thread closed: the run's cluster was torn down.
                raise ClusterFailedError("the run's cluster was torn down during the run") from e
            raise
        finally:
            if connected_here:
                self.warm_runs.release()
                ray.shutdown()
            if held is not None:
                self._unlease(held)

    def _on_session_cluster(self) -> bool:
        """Whether this process is connected to the session cluster (by an
        earlier run: not a connection the user made)."""
        held, current = self._held, connected_address()
        return held is not None and current is not None and same_address(current, held.cluster.address)

    def _resolve(self, cluster: Any) -> RayCluster | None:
        """A handle for what the user named; None when they named nothing."""
        from raydist.engine.cluster import RayCluster

        if isinstance(cluster, RayCluster):
            return cluster
        if isinstance(cluster, str):
            from raydist.engine.registry import registry

            return registry.get(cluster)
        if cluster is not None:
            raise TrainingConfigError("cluster", cluster, "give a raydist cluster handle, a cluster name, or nothing")
        return None

    def _connect_to(self, handle: RayCluster) -> None:
        current = connected_address()
        if current is not None and not same_address(current, handle.address):
            with self._lock:
                held = self._held
                idle_session = held is not None and same_address(current, held.cluster.address) and not held.runs
            if not idle_session:
                raise ConnectionInUseError(current, handle.address)
            # Leave the idle session cluster for the cluster the user named.
            process_ray().disconnect()
        # Stay connected after the run: the next run on this cluster skips a
        # new driver job; the cluster's down() disconnects.
        handle.connect(log_to_driver=True)

    def _observe(self, held: _Held | None, now: float) -> Observed | None:
        """What the rules look at (called with ``_lock`` held)."""
        from raydist.engine.spark import session as spark_side

        if held is None:
            return None
        cluster = held.cluster
        usable = (
            held.failure is None
            and cluster.state in (State.CREATING, State.RUNNING, State.DEGRADED)
            and not spark_side.is_stopped(cluster.spark)
        )
        waiting = now - held.spark_waiting_since if held.spark_waiting_since is not None else 0.0
        idle_since = held.idle_since
        used = process_ray().last_use()  # a DataFrame handoff on it is use too
        if used is not None and used > idle_since and self._on_session_cluster():
            idle_since = used
        busy = held.runs or held.warming
        return Observed(held.shape, usable, held.runs, 0.0 if busy else max(0.0, now - idle_since), waiting,
                        replacement_waiting=self._replacers > 0, head_holds_slot=cluster.head_holds_slot,
                        warm=bool(held.shape.workers) and self.warm_runs.ready_on(cluster.address),
                        warming=held.warming > 0)

    def _lease(self, want: Shape, keep_warm_s: float | None, spark: Any = None) -> _Held:
        """The session cluster, fit for ``want`` and leased to the caller's run
        (one started on ``spark``, None: the active SparkSession)."""
        replacing = False
        try:
            while True:
                held, step = self._try_lease(want, keep_warm_s, replacing, spark)
                if held is not None:
                    return held
                with self._changed:
                    current = self._held
                    if step is RunStep.WAIT:
                        # First in line to replace it, once the runs on it have ended.
                        if not replacing:
                            replacing, self._replacers = True, self._replacers + 1
                        self._changed.wait_for(lambda h=current: self._held is not h or h is None or not h.runs)
                    else:  # QUEUE: behind a run waiting to replace it
                        self._changed.wait_for(lambda h=current: self._held is not h or not self._replacers)
        finally:
            if replacing:
                with self._changed:
                    self._replacers -= 1
                    self._changed.notify_all()

    def _try_lease(self, want: Shape, keep_warm_s: float | None, replacing: bool,
                   spark: Any = None) -> tuple[_Held | None, RunStep]:
        """One decision of ``_lease``: the cluster leased to the run, or None
        and the step to wait by (WAIT or QUEUE)."""
        with self._lifecycle:
            with self._lock:
                held = self._held
                observed = self._observe(held, time.monotonic())
                if observed is not None and replacing:  # a run waiting to replace it is not behind itself
                    observed = dataclasses.replace(observed, replacement_waiting=self._replacers > 1)
                step, shape = for_run(observed, want)
                if step is RunStep.USE and held is not None:
                    return self._take(held, keep_warm_s), step
            if step is RunStep.GROW and held is not None:
                self._grow(held, shape)
                with self._lock:
                    return self._take(held, keep_warm_s), step
            if step in (RunStep.START, RunStep.REPLACE):
                if held is not None:
                    why = "a run needs bigger nodes" if step is RunStep.REPLACE else "it can no longer run"
                    self._retire_locked(held, why)
                try:
                    held = self._start(shape, spark)
                except CapacityError:
                    if shape == want:
                        raise
                    # Room for the old runs' workers as well does not fit Spark: the run's own size.
                    log.info("a session cluster of %s does not fit Spark; starting one of %s", shape, want)
                    held = self._start(want, spark)
                with self._changed:
                    self._held = held
                    self._changed.notify_all()
                    return self._take(held, keep_warm_s), step
        return None, step

    def _take(self, held: _Held, keep_warm_s: float | None) -> _Held:
        """Lease ``held`` to one more run (``_lock`` held)."""
        held.runs += 1
        if keep_warm_s is not None:
            self._keep_warm_s = keep_warm_s
        return held

    def _unlease(self, held: _Held) -> None:
        with self._changed:
            held.runs -= 1
            if not held.runs:
                held.idle_since = time.monotonic()
            self._changed.notify_all()

    def _start(self, shape: Shape, spark: Any = None) -> _Held:
        """Start a session cluster of ``shape`` on ``spark`` (None: the active
        SparkSession, else the embedded one) (``_lifecycle`` held); returns
        once its head is up, so the run's Ray Train start overlaps the
        workers' (seconds of a first run on a small host)."""
        from raydist.engine.cluster import RayCluster
        from raydist.engine.registry import registry
        from raydist.engine.spark import session as spark_side
        from raydist.spec import ClusterSpec

        spark = spark or spark_side.active_session() or registry.embedded_spark(None, {})
        # A head in a Spark task of its own (Connect) holds a task slot: it
        # carries one worker's share, so the cluster takes the slots Spark's
        # own distributor would take, no more.
        share = 1 if is_connect(spark) else 0
        spec = ClusterSpec(
            name=f"session-{secrets.token_hex(3)}",
            workers=shape.workers - share,
            cpus_per_worker=shape.cpus,
            gpus_per_worker=shape.gpus,
            head_cpus=shape.cpus * share,
            head_gpus=shape.gpus * share,
        )
        log.info("starting session cluster %s: %d workers x %d CPU%s", spec.name, shape.workers, shape.cpus,
                 " (one of them the head)" if share else "")
        cluster = RayCluster(spec, spark).launch()
        cluster.wait_head()
        held = _Held(cluster, shape, head_share=share)
        spawn(self._watch_start, held, name=f"raydist-session-start-{spec.name}")
        spawn(self._reap, held, name=f"raydist-session-reaper-{spec.name}")
        self._stop_with(spark)
        return held

    def _grow(self, held: _Held, shape: Shape) -> None:
        """Add nodes of the same size to ``held`` in place (``_lifecycle``
        held); returns once they are up. Runs on it go on undisturbed."""
        cluster = held.cluster
        log.info("growing session cluster %s to %d workers", cluster.name, shape.workers)
        before = held.shape
        cluster.resize(workers=shape.workers - held.head_share)
        with self._lock:
            held.shape = shape
        if not cluster.wait_for_workers(shape.workers - held.head_share, timeout=cluster.spec.start_timeout_s):
            cluster.resize(workers=before.workers - held.head_share)
            with self._lock:
                held.shape = before
            ready = cluster.status().ready_workers
            raise NodeStartTimeoutError(expected=shape.workers, started=ready + held.head_share,
                                        timeout=cluster.spec.start_timeout_s,
                                        pending={"session cluster": ["no free Spark task slot for the added nodes?"]})

    def _watch_start(self, held: _Held) -> None:
        """Wait for a new session cluster's workers. When they do not come
        up, the cluster is torn down (ending the run that waits for them),
        and the run raises this error instead of Ray's."""
        try:
            held.cluster.wait_ready()
        except BaseException as e:  # noqa: BLE001 - handed to the run by connected()
            with self._lock:
                held.failure = e

    def _stop_with(self, spark: Any) -> None:
        """Retire the session cluster inside ``spark.stop()``, before Spark
        ends the tasks under its nodes (a run's workers would report their
        nodes lost, to the driver's console)."""
        from raydist.engine.spark.sides import side_of

        side_of(spark).on_stop(self._spark_stopping)

    def _spark_stopping(self, spark: Any) -> None:
        from raydist.engine.spark.sides import side_of

        held = self._held
        if held is not None and side_of(held.cluster.spark).same_session(spark):
            self._retire(held, "its SparkSession is stopping", force=True)

    def _reap(self, held: _Held) -> None:
        """The reaper of one session cluster: retires it when the rules say
        so, and ends with it."""
        from raydist.engine.spark import session as spark_side

        cluster = held.cluster
        # Connect shows a client only its own queries' waiting tasks, never
        # other clients': there the cluster also idles no longer than
        # BLIND_KEEP_WARM_S.
        blind = is_connect(cluster.spark)
        while not held.gone.wait(_REAP_EVERY_S):
            with self._lock:
                if self._held is not held:
                    return
                runs = held.runs
            waiting: int | None = 0
            # A DataFrame handoff's own Spark job waits for slots too: the
            # cluster it hands data to must not make room for it.
            if not runs and not process_ray().handing_off() and not spark_side.is_stopped(cluster.spark):
                try:
                    waiting = spark_side.waiting_tasks(cluster.spark, cluster.job_group)
                except Exception as e:  # noqa: BLE001 - the SparkContext is stopping under us
                    log.debug("reading Spark's status tracker: %s", e)
            with self._lock:
                now = time.monotonic()
                if waiting and not held.runs:
                    held.spark_waiting_since = held.spark_waiting_since or now
                else:
                    held.spark_waiting_since = None
                observed = self._observe(held, now)
                assert observed is not None
                step, why = while_idle(observed, min(self._keep_warm_s, BLIND_KEEP_WARM_S)
                                       if blind else self._keep_warm_s)
            if step is IdleStep.RETIRE:
                self._retire(held, why)
            elif step is IdleStep.SHRINK:
                self._shrink(held, why)

    def _shrink(self, held: _Held, why: str) -> None:
        """Give back the slots of ``held``'s worker nodes, keeping its head
        (on the driver: it holds no slot), its GCS and this process's
        connection, unless a run took it meanwhile. The warm run on those
        nodes ends first; the next run grows the cluster again."""
        with self._lifecycle:
            with self._lock:
                if self._held is not held or held.runs or not held.shape.workers:
                    return
                workers, held.shape = held.shape.workers, dataclasses.replace(held.shape, workers=0)
                held.spark_waiting_since = None
            log.info("session cluster %s gives back its %d worker nodes' slots: %s", held.cluster.name, workers, why)
            self.warm_runs.let_go(held.cluster.address)
            held.cluster.resize(workers=0)

    def _retire(self, held: _Held, why: str, *, force: bool = False) -> None:
        """Tear ``held`` down unless a run took it meanwhile (``force``: even
        then, as when its SparkSession stops under the run)."""
        with self._lifecycle:
            with self._lock:
                if self._held is not held or (held.runs and not force):
                    return
                if held.runs:
                    held.failure = ClusterFailedError(f"the session cluster {held.cluster.name} was torn down: {why}")
            self._retire_locked(held, why)

    def _retire_locked(self, held: _Held, why: str) -> None:
        """Tear ``held`` down (``_lifecycle`` held). This process disconnects
        from it first, and the warm run on it ends (``WarmRuns.let_go``)."""
        with self._changed:
            if self._held is held:
                self._held = None
            self._changed.notify_all()
        log.info("tearing down session cluster %s: %s", held.cluster.name, why)
        try:
            held.cluster.down()
        finally:
            held.gone.set()

    # ----------------------------------------------------------- local runs

    def local_run(self, keep_warm_s: float) -> LocalRun:
        """The local forker (started on its first run)."""
        from raydist.train.local import LocalRun

        with self._lock:
            if self._local is None or self._local.keep_warm_s != keep_warm_s:
                old, self._local = self._local, LocalRun(keep_warm_s=keep_warm_s)
            else:
                old = None
            local = self._local
        if old is not None:
            old.close()
        return local

    # ---------------------------------------------------------------- end

    def close(self) -> None:
        """End everything this session keeps (at exit, or by hand)."""
        self._stop_warming()
        with self._lock:
            local, self._local = self._local, None
        if local is not None:
            local.close()
        held = self._held
        if held is not None:
            self._retire(held, "this process is ending", force=True)
        self.warm_runs.close()


def training_session() -> TrainingSession:
    """This process's training session, kept by raydist's process registry
    (closed at exit)."""
    from raydist.engine.registry import registry

    return registry.service("training-session", TrainingSession)
