"""When the session cluster starts, grows, stays, gives its slots back and goes.

Pure rules over what the training session observes: no Ray, no Spark, no
clock. :class:`~raydist.train.session.TrainingSession` reads the facts, asks
these functions, and does what they answer; the tests ask them every case.

Two rules carry the session's promises:

- a cluster that a run is using is never torn down or replaced under it: a
  run that needs a cluster of another shape waits for the runs on the
  current one to end (a bigger count of the same workers grows it in place,
  without waiting), and runs that come meanwhile queue behind it, so it is
  not kept waiting by a stream of runs that fit;
- an idle cluster goes when it has idled ``keep_warm_s``, or at once when it
  can no longer run (its SparkSession stopped, or it failed); a cluster with
  runs on it stays, even a failing one, until they end;
- when Spark work has waited ``yield_after_s`` for the slots of an idle
  cluster, it gives them back at once, and keeps what holds none: a head on
  the driver (a classic session) stays, with its GCS and this process's
  connection, and only the worker nodes go (*shrink*), so the next run starts
  worker nodes, not a cluster. A head in a Spark task of its own (Connect)
  holds a slot itself: that cluster goes whole.

And one rule says where a distributor's run goes (:func:`where_to_run`): a
run that only a Ray cluster can serve, or that finds the session cluster warm
(its workers up, a warm run on them) or in use, runs on Ray; any other runs
in one barrier stage of Spark's own tasks, as pyspark's distributors run it,
and waits for no Ray cluster, not even one warming up (that one gives its
slots back to the run). The session cluster then starts for the next run
once runs have paused (:func:`warm_up_now`): a sweep of runs back to back
stays in Spark's tasks, whose slots a starting cluster would take, and a run
after a pause finds its workers warm. A warm-up that a run cut short makes
the next one wait twice as long a pause (:data:`WARM_UP_AFTER_S` doubling
to :data:`WARM_UP_AFTER_MOST_S`), so runs that keep coming every few
seconds do not start and stop clusters between them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

__all__ = ["Shape", "Observed", "RunStep", "IdleStep", "RunPlace", "for_run", "while_idle", "where_to_run",
           "warm_up_now", "gpu_run_shape", "YIELD_AFTER_S", "WARM_UP_AFTER_S", "WARM_UP_AFTER_MOST_S"]

#: How long other Spark jobs' tasks must have waited for the slots of an idle
#: session cluster before it gives them back (a job's tasks may show as
#: waiting for an instant before they launch).
YIELD_AFTER_S = 0.3
#: How long runs in Spark's tasks must have paused before the session
#: cluster starts for the next run (runs back to back keep the slots).
WARM_UP_AFTER_S = 5.0
#: The longest pause a warm-up waits for, after runs cut warm-ups short.
WARM_UP_AFTER_MOST_S = 80.0


@dataclass(frozen=True)
class Shape:
    """A cluster's size as runs ask for it: worker nodes, and each one's
    CPUs and GPUs. A run asks for ``workers`` training workers of ``cpus``
    and ``gpus`` each; Ray Train packs them onto the nodes, several to a
    node where it is big enough."""

    workers: int
    cpus: int
    gpus: int = 0

    def per_node(self, want: Shape) -> int:
        """How many of ``want``'s workers one node of this size holds."""
        fit = self.cpus // max(1, want.cpus)
        if want.gpus:
            fit = min(fit, self.gpus // want.gpus)
        return fit

    def covers(self, want: Shape) -> bool:
        """Whether a run asking for ``want`` fits on a cluster of this shape."""
        return self.workers * self.per_node(want) >= want.workers

    def union(self, want: Shape) -> Shape:
        """The smallest cluster of nodes big enough for both that also has
        room for either's workers (a replacement serves the old runs too)."""
        node = Shape(1, max(self.cpus, want.cpus), max(self.gpus, want.gpus))
        return Shape(max(-(-s.workers // node.per_node(s)) for s in (self, want)), node.cpus, node.gpus)

    def same_nodes(self, other: Shape) -> bool:
        """Whether both have nodes of one size (so one can grow into the other in place)."""
        return self.cpus == other.cpus and self.gpus == other.gpus


def gpu_run_shape(ranks: int, task_cpus: int, task_gpus: int) -> tuple[Shape, dict[str, float]]:
    """The session cluster a GPU run of ``ranks`` processes asks for, and
    what each rank takes of its node.

    As pyspark's distributors lay a GPU run out: one node per Spark task of
    ``task_gpus`` GPUs (``spark.task.resource.gpu.amount``) and ``task_cpus``
    CPUs (``spark.task.cpus``), one rank per GPU, the task's CPUs shared by
    its ranks. So each rank sees its task's GPUs, as under pyspark, and the
    ranks of one task share them (NCCL's paths inside a node). A run smaller
    than a task takes one node of just its ranks' GPUs.
    """
    per_node = max(1, min(task_gpus, ranks))
    nodes = -(-ranks // per_node)
    cpus = max(1, task_cpus)
    # Ray counts resources in ten-thousandths: rounded down, per_node ranks always fit.
    return Shape(nodes, cpus, per_node), {"CPU": math.floor(cpus / per_node * 1e4) / 1e4, "GPU": 1.0}


@dataclass(frozen=True)
class Observed:
    """What the session sees of its cluster at one moment."""

    shape: Shape
    usable: bool  # starting or up, and its SparkSession runs
    runs: int  # runs using it now
    idle_s: float  # since the last run on it ended (0 while runs use it)
    spark_waiting_s: float  # how long other Spark tasks have waited for slots (0: none wait)
    replacement_waiting: bool = False  # a run waits for the runs on it to end, to replace it
    head_holds_slot: bool = True  # the head rides a Spark task (Connect), not the driver
    warm: bool = False  # its worker nodes are up with a warm run on them: a run starts at once
    warming: bool = False  # starting for the next run (not a run: Spark work may still take its slots)


class RunStep(enum.Enum):
    """What a run that wants a cluster does next."""

    USE = "use"  # the cluster fits: run on it
    START = "start"  # no usable cluster: start one
    GROW = "grow"  # same nodes, too few: add nodes in place
    REPLACE = "replace"  # other nodes needed, nobody using it: tear it down, start a bigger one
    WAIT = "wait"  # other nodes needed, but runs use it: wait for them to end, then ask again
    QUEUE = "queue"  # another run waits to replace it: wait until that one is done, then ask again


class IdleStep(enum.Enum):
    """What the reaper does with the cluster at one look."""

    KEEP = "keep"
    RETIRE = "retire"
    SHRINK = "shrink"  # give the worker nodes' slots back; the head (holding none) stays


def for_run(current: Observed | None, want: Shape) -> tuple[RunStep, Shape]:
    """The next step for a run that wants ``want``, and the shape to start or
    grow to (a shrunk cluster, of no worker nodes, grows)."""
    if current is None:
        return RunStep.START, want
    if not current.usable:
        # Runs on a failing cluster end with its error; the next one starts anew.
        return (RunStep.WAIT if current.runs else RunStep.START), want
    target = current.shape.union(want)
    if current.replacement_waiting and current.shape.same_nodes(target):
        return RunStep.QUEUE, target  # it would fit (or grow): the run waiting to replace it goes first
    if current.shape.covers(want):
        return RunStep.USE, current.shape
    if current.shape.same_nodes(target):
        return RunStep.GROW, target
    if current.runs:
        return RunStep.WAIT, target
    return RunStep.REPLACE, target


def while_idle(current: Observed, keep_warm_s: float, yield_after_s: float = YIELD_AFTER_S) -> tuple[IdleStep, str]:
    """Whether the reaper keeps the cluster or retires it now, and why."""
    if current.runs:
        return IdleStep.KEEP, ""
    if not current.usable:
        return IdleStep.RETIRE, "it can no longer run (its SparkSession stopped, or it failed)"
    if current.idle_s >= keep_warm_s:
        return IdleStep.RETIRE, f"idle for {keep_warm_s:g} s"
    if current.spark_waiting_s >= yield_after_s:
        if current.head_holds_slot:
            return IdleStep.RETIRE, "other Spark jobs wait for the slots it holds"
        if current.shape.workers:
            return IdleStep.SHRINK, "other Spark jobs wait for its worker nodes' slots (its head holds none)"
    return IdleStep.KEEP, ""


class RunPlace(enum.Enum):
    """Where a distributor's run goes."""

    SPARK_TASKS = "spark-tasks"  # one barrier stage of Spark's own tasks, no Ray (pyspark's way)
    RAY = "ray"  # Ray Train workers on the session cluster (or the cluster the user named)


def where_to_run(current: Observed | None, *, needs_ray: bool, fits_spark: bool) -> RunPlace:
    """Where a run goes. ``needs_ray``: only Ray can serve it (the user named
    a cluster or is connected to one, asked to survive lost workers, or hands
    its ranks data through Ray's object store); ``fits_spark``: its ranks fit
    the SparkSession's task slots at once, as a barrier stage needs."""
    if needs_ray or not fits_spark:
        return RunPlace.RAY
    if current is not None and current.usable and (current.runs or current.warm):
        return RunPlace.RAY  # warm, or in use by runs this one joins
    return RunPlace.SPARK_TASKS


def warm_up_now(current: Observed | None, *, spark_runs: int, paused_s: float, keep_warm_s: float,
                pause_s: float = WARM_UP_AFTER_S, spark_busy: bool = False) -> bool:
    """Whether the session cluster should start (or grow its worker nodes
    back) now, for the next run: no run is in Spark's tasks, they have paused
    ``pause_s``, the user keeps things warm longer than that, no other Spark
    work runs or waits (``spark_busy``: the cluster would take its slots, or
    yield them back at once), and the cluster is not warm, in use or warming
    up already."""
    if spark_runs or spark_busy or paused_s < pause_s or keep_warm_s <= pause_s:
        return False
    return current is None or not current.usable or not (current.warm or current.runs or current.warming)
