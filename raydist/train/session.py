"""What a process keeps between training runs, and its one owner.

Spark users call a distributor many times in one session and never name a
cluster. :class:`TrainingSession` is this process's owner of everything that
outlives one run:

- the *session cluster*: a raydist cluster on the active SparkSession (the
  user's own, else the embedded one), started by the first run that names no
  cluster and finds no ``RAY_ADDRESS``, grown when a later run needs more, and
  torn down after ``keep_warm_s`` without a run, at once when other Spark jobs
  wait for the task slots it holds, when its SparkSession stops, or at exit;
- the warm Ray Train run (:class:`~raydist.train.resident.ResidentRun`) on the
  cluster this process is connected to: one at a time, since its workers hold
  the CPUs a different run would need;
- the local forker (:class:`~raydist.train.local.LocalRun`) for runs on this
  machine (``local_mode=True``).

State changes go through this object. Its lock guards its fields only and is
never held while calling out (Ray, Spark, a cluster's ``down``); starting and
stopping the session cluster are serialized by a second lock that is always
taken first. One background thread (the reaper) runs while a session cluster
exists.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from raydist.errors import TrainingConfigError
from raydist.spec import State

if TYPE_CHECKING:
    from raydist.engine.cluster import RayCluster
    from raydist.train.local import LocalRun
    from raydist.train.resident import ResidentRun

__all__ = ["TrainingSession", "training_session", "DEFAULT_KEEP_WARM_S"]

log = logging.getLogger(__name__)

#: How long the session cluster, a warm run and the local forker stay up
#: after the last run, unless the run asked otherwise.
DEFAULT_KEEP_WARM_S = 120.0
#: Ray Train settings for the runs raydist starts, unless the user set them
#: (Ray Train reads them from the driver's environment). ``report()`` waits
#: on the controller's health-check poll, 2 s by default: raydist polls at
#: 0.2 s. The preemption watcher (one more actor process per run) reads the
#: drain notices a cloud provider gives Ray's nodes; raydist's nodes are Spark
#: tasks, which get none.
RUN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
_REAP_EVERY_S = 1.0

#: Polls in a row that must see other Spark work waiting before an idle
#: session cluster gives its slots back (one poll may catch a job's tasks
#: in the instant before they launch).
_WAITING_POLLS = 2


class TrainingSession:
    """This process's session cluster, warm run and local forker (see the
    module docstring). Get it with :func:`training_session`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the fields below; never held while calling out
        self._lifecycle = threading.Lock()  # serializes session-cluster start and teardown; taken first
        self._cluster: RayCluster | None = None
        self._busy = 0
        self._idle_since = time.monotonic()
        self._keep_warm_s = DEFAULT_KEEP_WARM_S
        self._warm: tuple[tuple[Any, ...], ResidentRun] | None = None
        self._local: LocalRun | None = None
        self._start_errors: dict[str, BaseException] = {}
        self._reaper: threading.Thread | None = None
        self._closed = False

    # ----------------------------------------------------------- clusters

    @property
    def cluster(self) -> RayCluster | None:
        """The session cluster, while one runs."""
        return self._cluster

    @contextlib.contextmanager
    def connected(
        self,
        cluster: Any,
        *,
        workers: int,
        cpus_per_worker: int,
        use_gpu: bool,
        keep_warm_s: float | None = None,
    ) -> Iterator[Any]:
        """Connect this process to the cluster a run uses, for the run.

        ``cluster`` is a handle or a name; ``None`` means, in order: the Ray
        cluster this process is already connected to, ``RAY_ADDRESS``, else
        the session cluster (started or grown here). Yields the cluster
        handle (None for a plain Ray address). The session cluster is kept
        ``keep_warm_s`` after the run.
        """
        import os

        import ray

        from raydist.train._env import scoped_env

        handle = self._resolve(cluster)
        session_run = handle is None and (
            self._on_session_cluster() or (not ray.is_initialized() and not os.environ.get("RAY_ADDRESS"))
        )
        connected_here = False
        if session_run:
            handle = self._acquire(workers, cpus_per_worker, 1 if use_gpu else 0, keep_warm_s)
        try:
            with scoped_env(RUN_ENV, keep_existing=True):
                if handle is not None:
                    self._connect_to(handle)
                elif not ray.is_initialized():
                    ray.init(log_to_driver=True)
                    connected_here = True
                if not session_run:  # the session cluster is sized for the run
                    _check_resources(workers, cpus_per_worker, use_gpu)
                yield handle
        except BaseException as e:
            failed = self._start_errors.pop(handle.address, None) if session_run and handle else None
            if failed is not None:
                raise failed from e  # the run failed because its cluster did not come up
            raise
        finally:
            if connected_here:
                self.release_warm()
                ray.shutdown()
            if session_run:
                self._release()

    def _on_session_cluster(self) -> bool:
        """Whether this process is connected to the session cluster (by an
        earlier run: not a connection the user made)."""
        import ray

        ours = self._cluster
        return ours is not None and ray.is_initialized() and ray.get_runtime_context().gcs_address == ours.address

    def _resolve(self, cluster: Any) -> RayCluster | None:
        """A handle for what the user named; None when they named nothing."""
        from raydist.engine.cluster import RayCluster

        if isinstance(cluster, RayCluster):
            return cluster
        if isinstance(cluster, str):
            from raydist.api import _registry

            return _registry.get(cluster)
        if cluster is not None:
            raise TrainingConfigError("cluster", cluster, "give a raydist cluster handle, a cluster name, or nothing")
        return None

    def _connect_to(self, handle: RayCluster) -> None:
        import ray

        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if current == handle.address:
                return
            ours = self._cluster
            if ours is None or current != ours.address:
                raise TrainingConfigError(
                    "cluster",
                    handle.name,
                    f"this process is already connected to Ray at {current}; call ray.shutdown() first",
                )
            # Leave the idle session cluster for the cluster the user named.
            self.release_warm()
            ray.shutdown()
        # Stay connected after the run: the next run on this cluster skips a
        # new driver job; the cluster's down() disconnects.
        handle.connect(log_to_driver=True)

    def _acquire(self, workers: int, cpus: int, gpus: int, keep_warm_s: float | None) -> RayCluster:
        """The session cluster, big enough for the run, marked busy."""
        import raydist.api as api
        from raydist.engine import spark as spark_side
        from raydist.engine.cluster import RayCluster
        from raydist.spec import ClusterSpec

        with self._lifecycle:
            current = self._cluster
            fits = (
                current is not None
                and current.state in (State.CREATING, State.RUNNING, State.DEGRADED)
                and not spark_side.is_stopped(current.spark)
                and current.spec.desired_workers >= workers
                and (current.spec.cpus_per_worker or 0) >= cpus
                and current.spec.gpus_per_worker >= gpus
            )
            if not fits:
                if current is not None:
                    old = current.spec
                    workers, cpus = max(workers, old.desired_workers), max(cpus, old.cpus_per_worker or 0)
                    gpus = max(gpus, int(old.gpus_per_worker))
                    log.info("session cluster %s is too small or gone; starting a bigger one", current.name)
                    self._teardown_locked()
                spark = spark_side.active_session() or api._registry.embedded_spark(None, {})
                spec = ClusterSpec(
                    name=f"session-{secrets.token_hex(3)}",
                    workers=workers,
                    cpus_per_worker=cpus,
                    gpus_per_worker=gpus,
                )
                log.info("starting session cluster %s: %d workers x %d CPU", spec.name, workers, cpus)
                current = RayCluster(spec, spark).launch()
                # The run starts once the head is up: Ray Train's controller and
                # its placement group wait for the workers' CPUs, so their start
                # overlaps the workers' (seconds of a first run on a small host).
                current.wait_head()
                threading.Thread(
                    target=self._watch_start, args=(current,), name="raydist-session-start", daemon=True
                ).start()
                self._stop_with(spark)
            with self._lock:
                self._cluster = current
                self._busy += 1
                if keep_warm_s is not None:
                    self._keep_warm_s = keep_warm_s
                if self._reaper is None or not self._reaper.is_alive():
                    self._reaper = threading.Thread(target=self._reap, name="raydist-session-reaper", daemon=True)
                    self._reaper.start()
            return current

    def _watch_start(self, cluster: RayCluster) -> None:
        """Wait for a new session cluster's workers; when they do not come
        up, the cluster is torn down (ending the run that waits for them)
        and the run raises this error instead of Ray's."""
        try:
            cluster.wait_ready()
        except BaseException as e:  # noqa: BLE001 - handed to the run by connected()
            with self._lock:
                self._start_errors[cluster.address] = e
                if self._cluster is cluster:
                    self._cluster = None

    def _stop_with(self, spark: Any) -> None:
        """Tear the session cluster down inside ``spark.stop()``, before Spark
        ends the tasks under its nodes (a run's workers would report their
        nodes lost, to the driver's console)."""
        sc = spark.sparkContext
        if getattr(sc.stop, "raydist_session", None) is self:
            return
        original = sc.stop

        def stop() -> None:
            cluster = self._cluster
            if cluster is not None and cluster.spark.sparkContext is sc:
                self._teardown(cluster, "its SparkSession is stopping")
            original()

        stop.raydist_session = self  # type: ignore[attr-defined]
        sc.stop = stop  # this SparkContext object only

    def _release(self) -> None:
        with self._lock:
            self._busy -= 1
            self._idle_since = time.monotonic()

    def _reap(self) -> None:
        """Tear the session cluster down when it should go (see the module
        docstring); ends with the cluster."""
        from raydist.engine import spark as spark_side

        waiting_polls = 0
        while True:
            time.sleep(_REAP_EVERY_S)
            with self._lock:
                cluster, busy = self._cluster, self._busy
                idle_s, keep_s = time.monotonic() - self._idle_since, self._keep_warm_s
            if cluster is None or self._closed:
                return
            if busy:
                waiting_polls = 0
                continue
            why = ""
            if spark_side.is_stopped(cluster.spark):
                why = "its SparkSession stopped"
            elif idle_s >= keep_s:
                why = f"idle for {keep_s:g} s"
            else:
                try:
                    waiting = spark_side.waiting_tasks(cluster.spark, frozenset({cluster.job_group}))
                except Exception as e:  # noqa: BLE001 - the SparkContext is stopping under us
                    log.debug("reading Spark's status tracker: %s", e)
                    waiting = 0
                waiting_polls = waiting_polls + 1 if waiting else 0
                if waiting_polls >= _WAITING_POLLS:
                    why = f"{waiting} Spark tasks wait for the slots it holds"
            if why:
                self._teardown(cluster, why)

    def _teardown(self, cluster: RayCluster, why: str) -> None:
        with self._lifecycle:
            with self._lock:
                if self._cluster is not cluster or self._busy:
                    return  # replaced, or a run took it meanwhile
            log.info("tearing down session cluster %s: %s", cluster.name, why)
            self._teardown_locked()

    def _teardown_locked(self) -> None:
        """Stop the session cluster and the warm run on it (the lifecycle
        lock is held)."""
        with self._lock:
            cluster, self._cluster = self._cluster, None
        if cluster is None:
            return
        warm = self._warm
        if warm is not None and warm[0][0] == cluster.address:
            self.release_warm()
        cluster.down()

    # ------------------------------------------------------------ warm runs

    def warm_run(
        self, *, workers: int, resources_per_worker: Mapping[str, float], max_failures: int, keep_alive_s: float
    ) -> ResidentRun:
        """The warm run for these settings on the connected cluster, started
        if needed; a warm run with other settings ends first."""
        import ray

        from raydist.train.resident import ResidentRun

        key = (
            ray.get_runtime_context().gcs_address,
            workers,
            tuple(sorted(resources_per_worker.items())),
            max_failures,
            keep_alive_s,
        )
        with self._lock:
            current = self._warm
        if current is not None and current[0] == key and current[1].alive:
            return current[1]
        self.release_warm()
        run = ResidentRun(
            workers=workers,
            resources_per_worker=resources_per_worker,
            max_failures=max_failures,
            keep_alive_s=keep_alive_s,
        )
        with self._lock:
            self._warm = (key, run)
        run.start()
        return run

    def release_warm(self) -> None:
        """End the warm run, if any, so its workers' CPUs are free."""
        with self._lock:
            warm, self._warm = self._warm, None
        if warm is not None:
            warm[1].close()

    # ----------------------------------------------------------- local runs

    def local_run(self, keep_alive_s: float) -> LocalRun:
        """The local forker (started on its first run)."""
        from raydist.train.local import LocalRun

        with self._lock:
            if self._local is None or self._local.keep_alive_s != keep_alive_s:
                old, self._local = self._local, LocalRun(keep_alive_s=keep_alive_s)
            else:
                old = None
            local = self._local
        if old is not None:
            old.close()
        return local

    # ---------------------------------------------------------------- end

    def close(self) -> None:
        """End everything this session keeps (at exit, or by hand)."""
        self._closed = True
        with self._lock:
            local, self._local = self._local, None
        if local is not None:
            local.close()
        self.release_warm()
        with self._lifecycle:
            self._teardown_locked()


def training_session() -> TrainingSession:
    """This process's training session, kept by raydist's process registry
    (closed at exit)."""
    from raydist.api import _registry

    return _registry.service("training-session", TrainingSession)


def _check_resources(workers: int, cpus_per_worker: int, use_gpu: bool) -> None:
    """Fail before any training when the cluster can never host the workers."""
    import ray

    total = ray.cluster_resources()
    if use_gpu and total.get("GPU", 0) < workers:
        raise TrainingConfigError(
            "use_gpu",
            True,
            f"the cluster has {total.get('GPU', 0):g} GPUs for {workers} workers; "
            "start it with gpus_per_worker=1 or train with use_gpu=False",
        )
    if total.get("CPU", 0) < workers * cpus_per_worker:
        raise TrainingConfigError(
            "workers",
            workers,
            f"the cluster has {total.get('CPU', 0):g} CPUs, fewer than {workers} workers x "
            f"{cpus_per_worker} CPU; use fewer workers or a bigger cluster",
        )
