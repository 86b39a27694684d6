"""The Spark side: an embedded SparkSession, executor capacity, resource profiles.

What differs between a classic and a Spark Connect session sits behind
:mod:`raydist.engine.spark.side`; this module holds what is the same for both.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from raydist.engine.sizing import embedded_master, local_cluster_shape, memory_limit
from raydist.engine.spark.sides import side_of
from raydist.errors import CapacityError
from raydist.spec import ClusterSpec, parse_size

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "connect_session", "embedded_session", "active_session", "is_stopped", "waiting_tasks", "SparkCapacity",
    "capacity", "check_fits", "resource_profile",
]

log = logging.getLogger(__name__)

#: How long an executor count must hold still before it is taken as final
#: when the configuration does not say how many executors to expect.
_SETTLE_S = 1.0



def embedded_session(master: str | None = None, conf: Mapping[str, str] | None = None, *,
                     log_path: str | os.PathLike[str] | None = None) -> SparkSession:
    """A SparkSession for raydist to own.

    ``master`` defaults to ``RAYDIST_SPARK_MASTER``, else a ``local-cluster``
    sized from this machine: real executor JVMs, so the same code paths run as
    on a standalone master, YARN or Kubernetes. ``log_path``: the driver JVM's
    console output (Spark's log4j lines, JVM warnings) goes to that file
    instead of this process's terminal, when this call starts the JVM.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    master = master or os.environ.get("RAYDIST_SPARK_MASTER") or embedded_master(
        os.cpu_count() or 2, memory_limit(psutil.virtual_memory().total)
    )
    # PySpark starts executor Python workers with PYSPARK_PYTHON (read when the
    # SparkContext is created); they must run this interpreter, which has Ray
    # and raydist installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    defaults = {
        # Executors must run this interpreter: it has Ray and raydist installed.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.RAY_USAGE_STATS_ENABLED": "0",
        "spark.ui.showConsoleProgress": "false",
        # A Ray node task runs for the cluster's lifetime; Spark must not
        # speculate it or give up after a few executor losses.
        "spark.speculation": "false",
        "spark.task.maxFailures": "8",
        "spark.python.worker.reuse": "true",
    }
    settings = {"spark.master": master, "spark.app.name": "raydist", **defaults, **(conf or {})}
    if log_path is not None and SparkContext._gateway is None:  # type: ignore[attr-defined]
        # PySpark's own way to start the JVM, with its output sent to a file;
        # SparkContext then uses that JVM.
        from pyspark.java_gateway import launch_gateway

        spark_conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
        with open(log_path, "ab") as log:
            gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": log, "stderr": log})
        SparkContext(conf=spark_conf, gateway=gateway)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def connect_session(url: str, conf: Mapping[str, str] | None = None) -> SparkSession:
    """A new Spark Connect session to ``url`` (``sc://host:port``) for
    raydist to own (``raydist serve`` with ``[spark] remote``, or a
    tenant's ``spark_remote``); ``conf``: session settings. The server's
    executors must run a Python with raydist. Always a session of its own:
    a process that holds sessions to several Connect servers must never be
    handed another's (``getOrCreate`` returns whichever is active)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(url)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.create()


def active_session() -> SparkSession | None:
    """The SparkSession this process's code is using, classic or Spark
    Connect, if it has one that runs. Looks only at what pyspark has loaded:
    it never starts a JVM or a connection."""
    active: list[Any] = []
    made: list[Any] = []
    if "pyspark.sql" in sys.modules:
        from pyspark.sql import SparkSession

        try:
            active.append(SparkSession.getActiveSession())
        except Exception:  # noqa: BLE001 - a context being stopped right now
            pass
        made.append(SparkSession._instantiatedSession)
    if "pyspark.sql.connect.session" in sys.modules:
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        active.append(ConnectSession.getActiveSession())
        made.append(ConnectSession._default_session)
    candidates = active + made  # this thread's session first, then the process's
    for session in candidates:
        if session is not None and not is_stopped(session):
            return session
    return None


def is_stopped(spark: SparkSession) -> bool:
    """Whether ``spark.stop()`` has run (no round trip)."""
    return side_of(spark).stopped()


def waiting_tasks(spark: SparkSession, ignore_group: str = "") -> int | None:
    """Tasks of other Spark jobs (not ``ignore_group``'s) that wait for a
    task slot now; None where the session cannot tell (Spark Connect)."""
    return side_of(spark).waiting_tasks(ignore_group)


@dataclass(frozen=True)
class SparkCapacity:
    """What the Spark application can ever offer Ray worker nodes."""

    executors: int
    cores_per_executor: int
    gpus_per_executor: float
    memory_per_executor: int
    dynamic: bool
    hosts: Mapping[str, int]

    def slots(self, cpus: int, gpus: float) -> int:
        """How many Ray nodes of this size fit at once, at most."""
        if cpus > self.cores_per_executor:
            return 0
        per = self.cores_per_executor // cpus
        if gpus > 0:
            per = min(per, math.floor(self.gpus_per_executor / gpus + 1e-9))
        return per * self.executors


def capacity(spark: SparkSession, wait_s: float = 30.0) -> SparkCapacity:
    """Read executor count and sizes, waiting (up to ``wait_s``) for executors
    that the master promised but that have not registered yet."""
    side = side_of(spark)
    master = side.master
    expected = None
    cores = int(side.conf("spark.executor.cores", "0") or 0)
    memory = parse_size(side.conf("spark.executor.memory", "1g"), "spark.executor.memory") or 0
    shape = local_cluster_shape(master)
    if shape is not None:
        expected, cores, memory = shape[0], shape[1], shape[2] << 20
    elif side.conf("spark.executor.instances"):
        expected = int(side.conf("spark.executor.instances") or 0)
    elif master.startswith("spark://") and cores and side.conf("spark.cores.max"):
        # Standalone: the master spreads spark.cores.max over executors of
        # spark.executor.cores each.
        expected = int(side.conf("spark.cores.max") or 0) // cores
    dynamic = (side.conf("spark.dynamicAllocation.enabled", "false") or "").lower() == "true"
    if master.startswith("local[") or master == "local":
        n = master[6:-1] if master.startswith("local[") else "1"
        cores = (os.cpu_count() or 1) if n == "*" else int(n.split(",")[0])
        expected = 1
    deadline = time.monotonic() + wait_s
    hosts: dict[str, int] = {}
    last, settled_at = -1, time.monotonic()
    while True:
        hosts = side.executor_hosts()
        count = sum(hosts.values())
        if master.startswith("local"):
            count = max(count, 1)
        if count != last:
            last, settled_at = count, time.monotonic()
        if expected is not None and count >= expected:
            break
        # Nothing says how many executors will come: take what has
        # registered once the count has held still for a moment.
        if expected is None and (dynamic or (count > 0 and time.monotonic() - settled_at > _SETTLE_S)):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.1 if side.kind == "classic" else 1.0)  # a Connect probe is a Spark job
    if not cores:
        cores = int(side.default_parallelism() // max(1, sum(hosts.values()))) or 1
    gpus = float(side.conf("spark.executor.resource.gpu.amount", "0") or 0)
    return SparkCapacity(
        executors=sum(hosts.values()) if not master.startswith("local[") else 1,
        cores_per_executor=cores,
        gpus_per_executor=gpus,
        memory_per_executor=memory,
        dynamic=dynamic,
        hosts=hosts,
    )


def check_fits(spec: ClusterSpec, cap: SparkCapacity, *, head_in_task: bool, cpus: int = 0) -> None:
    """Raise CapacityError when Spark can never run ``spec``'s worker nodes
    of ``cpus`` CPUs each (by default what the spec asks, or an executor's
    cores), and, ``head_in_task``, the head's Spark task beside them."""
    cpus = cpus or spec.cpus_per_worker or cap.cores_per_executor
    head_task_cpus = max(1, spec.head_cpus) if head_in_task else 0
    if spec.gpus_per_worker > 0 and cap.gpus_per_executor <= 0:
        raise CapacityError(
            f"{spec.gpus_per_worker:g} GPU per worker",
            "no executor offers GPUs",
            "set spark.executor.resource.gpu.amount and spark.executor.resource.gpu.discoveryScript, "
            "or ask for gpus_per_worker=0",
        )
    if cap.dynamic:
        return  # executors come and go; Spark's own scheduler decides
    if cpus > cap.cores_per_executor:
        raise CapacityError(
            f"{cpus} CPUs per worker",
            f"executors have {cap.cores_per_executor} cores each",
            f"ask for cpus_per_worker <= {cap.cores_per_executor} or give executors more cores",
        )
    if spec.gpus_per_worker > cap.gpus_per_executor:
        raise CapacityError(
            f"{spec.gpus_per_worker:g} GPUs per worker",
            f"executors have {cap.gpus_per_executor:g} GPUs each",
            f"ask for gpus_per_worker <= {cap.gpus_per_executor:g}",
        )
    slots = cap.slots(cpus, spec.gpus_per_worker)
    head = ""
    if head_task_cpus:
        # The head's task takes its CPUs on one executor: the worker slots it displaces there.
        slots = max(0, slots - math.ceil(head_task_cpus / max(cpus, 1)))
        head = f" beside the head's task ({head_task_cpus} CPU)"
    if spec.desired_workers > slots and spec.required_workers <= slots:
        # An elastic cluster may not ask for more nodes than Spark can ever
        # run: each would hold a thread and a Spark job waiting forever.
        raise CapacityError(
            f"max_workers={spec.desired_workers} x {cpus} CPU",
            f"{cap.executors} executors of {cap.cores_per_executor} cores fit {slots} such workers{head}",
            f"ask for max_workers <= {slots}",
        )
    if spec.required_workers > slots:
        raise CapacityError(
            f"{spec.required_workers} workers x {cpus} CPU"
            + (f" x {spec.gpus_per_worker:g} GPU" if spec.gpus_per_worker else ""),
            f"{cap.executors} executors of {cap.cores_per_executor} cores"
            + (f" and {cap.gpus_per_executor:g} GPUs" if cap.gpus_per_executor else "")
            + f" fit {slots} such workers{head}",
            f"ask for workers <= {slots}, fewer CPUs per worker, or more executors",
        )


def resource_profile(spark: SparkSession, cpus: int, gpus: float) -> Any:
    """A task-level ResourceProfile asking Spark for ``cpus`` and ``gpus``
    per task (stage-level scheduling), so each Ray node's Spark task holds
    exactly the resources the node announces to Ray."""
    return side_of(spark).resource_profile(cpus, gpus)
