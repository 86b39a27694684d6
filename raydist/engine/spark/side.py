"""What the engine asks of a SparkSession, behind one small interface.

A SparkSession is either classic (a SparkContext in this process, reached
through py4j) or a Spark Connect client (``SparkSession.builder.remote(...)``:
no SparkContext, no JVM here, only the DataFrame API over gRPC). The engine
needs the same few things from both: run a few long tasks with given
resources, cancel them by label, read settings and executors, and see
whether other Spark work waits for task slots. :func:`raydist.engine.spark.sides.side_of`
picks the implementation from the session itself, so the rest of the engine
never asks which kind it holds.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any, ClassVar

__all__ = ["AnnouncingBody", "PartitionBody", "SparkJob", "SparkSide", "TaskBody", "is_connect", "missing_raydist"]

#: A task's work: runs once in a Spark task and says how it ended, in one line.
TaskBody = Callable[[], str]
#: A task's work over its partition of a DataFrame (the partition's Arrow
#: record batches, as ``mapInArrow`` hands them): says how it ended, in one line.
PartitionBody = Callable[[Iterator[Any]], str]
#: A task's work that may also say one line to the driver while it still runs
#: (calling its argument once): where it can be reached, say.
AnnouncingBody = Callable[[Callable[[str], None]], str]


class SparkJob(abc.ABC):
    """A Spark job submitted without waiting for it (:meth:`SparkSide.submit`)."""

    @abc.abstractmethod
    def ended(self) -> bool:
        """Whether the job has ended, however it ended."""

    @abc.abstractmethod
    def error(self) -> str:
        """Once ended: why it failed ("" when its tasks simply ended)."""


class _ThreadJob(SparkJob):
    """A job run by a blocking call in a thread of its own: for sessions
    whose API has no way to submit a job and watch it later (Connect's)."""

    def __init__(self, run: Callable[[], object], name: str) -> None:
        self._done = threading.Event()
        self._error = ""

        def target() -> None:
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - the job's end, whatever it was, is its outcome
                self._error = str(exc) or type(exc).__name__
            finally:
                self._done.set()

        threading.Thread(target=target, daemon=True, name=name).start()

    def ended(self) -> bool:
        return self._done.is_set()

    def error(self) -> str:
        return self._error


class SparkSide(abc.ABC):
    """One SparkSession as the engine sees it.

    Labels: every job belongs to its cluster's ``group`` (one cancel ends a
    cluster) and may carry a ``tag`` of its own (one cancel ends one node,
    even while its job still waits for a slot).
    """

    #: ``"classic"`` or ``"connect"``: for messages and the few places that
    #: must differ by design (where a cluster's head may run).
    kind: ClassVar[str]

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    @abc.abstractmethod
    def stopped(self) -> bool:
        """Whether ``spark.stop()`` has run (cheap: no round trip)."""

    def alive(self) -> bool:
        """Whether the session can still run jobs (a round trip: its JVM or
        server answers). False after ``stop()``, and when what ran it died."""
        return not self.stopped()

    def discard(self) -> None:  # noqa: B027 - most kinds have nothing to let go of
        """Let go of a session that died, so that the next one this process
        asks for is a new one (never raises)."""

    @abc.abstractmethod
    def conf(self, key: str, default: str | None = None) -> str | None:
        """A Spark setting, or ``default`` when it is not set."""

    @property
    @abc.abstractmethod
    def master(self) -> str:
        """The application's master URL (``local-cluster[...]``, ``spark://...``)."""

    @property
    def ui_url(self) -> str:
        """The Spark UI's address, where this session can tell."""
        return ""

    def driver_host(self) -> str:
        return self.conf("spark.driver.host", "127.0.0.1") or "127.0.0.1"

    @abc.abstractmethod
    def executor_hosts(self) -> dict[str, int]:
        """Executors registered now, per host (the driver left out)."""

    @abc.abstractmethod
    def default_parallelism(self) -> int:
        """Spark's default number of task slots."""

    @abc.abstractmethod
    def run_tasks(self, body: TaskBody, n: int = 1, *, group: str, tag: str = "", profile: Any = None,
                  description: str = "", barrier: bool = False) -> list[str]:
        """Run ``body`` in ``n`` tasks of one Spark job (with ``profile``'s
        task resources when given) and return what each said. Blocks until
        the job ends; raises what the job raised (a cancel included).
        ``barrier``: the tasks form one barrier stage, as Spark's own
        distributors run theirs: all start together or none does, each may
        use ``BarrierTaskContext``, and they fail together."""

    def run_over(self, df: Any, body: PartitionBody, *, group: str, description: str = "") -> list[str]:
        """Run ``body`` over ``df``'s partitions, one barrier task each (as
        :meth:`run_tasks` with ``barrier``), and return what each said. Each
        task reads its own partition where Spark computed it: no row passes
        through this process, as none does through pyspark's driver in its
        ``_train_on_dataframe``."""
        with self._job_labels(group, description):
            out = df.mapInArrow(_partition_body(body), "out string", barrier=True)
            return [row.out for row in out.collect()]

    @contextlib.contextmanager
    def _job_labels(self, group: str, description: str) -> Iterator[None]:
        """The calling thread's Spark jobs carry ``group`` (cancel with it)
        while the block runs."""
        raise NotImplementedError(f"a {self.kind} Spark session runs no jobs over DataFrames")
        yield  # pragma: no cover - a generator, for contextmanager

    def submit(self, body: TaskBody, n: int = 1, *, group: str, tag: str = "", profile: Any = None,
               description: str = "") -> SparkJob:
        """Submit ``body`` as a job of one task, as :meth:`run_tasks` runs
        it, and return at once; :meth:`ended` says when it has ended. This
        default runs it in a thread of its own; a session that can watch its
        jobs without a thread each does better."""
        return _ThreadJob(lambda: self.run_tasks(body, n, group=group, tag=tag, profile=profile,
                                                 description=description), name=f"raydist-job-{tag or group}")

    def ended(self, jobs: Collection[SparkJob]) -> list[SparkJob]:
        """Those of ``jobs`` that have ended (one look for all of them where
        the session allows it)."""
        return [job for job in jobs if job.ended()]

    def run_announcing(self, body: AnnouncingBody, *, group: str, tag: str = "", profile: Any = None,
                       description: str = "", on_announce: Callable[[str], None]) -> str:
        """Run ``body`` in one task, as :meth:`run_tasks` does, and call
        ``on_announce`` here with the line the body announces as soon as
        Spark delivers it, while the body runs on. A task's result reaches
        the driver only when the task ends, so this is how a long task says
        where it listens to a driver that executors cannot dial."""
        raise NotImplementedError(f"a {self.kind} Spark session runs no announcing tasks (its driver is reachable)")

    @abc.abstractmethod
    def cancel(self, *, group: str = "", tag: str = "") -> None:
        """Cancel the jobs of ``group`` or with ``tag``, running or waiting.
        Never raises: a stopped session has nothing left to cancel."""

    @abc.abstractmethod
    def waiting_tasks(self, ignore_group: str = "") -> int | None:
        """Tasks of other Spark jobs that wait for a slot now, or None when
        this kind of session cannot tell."""

    @abc.abstractmethod
    def running_tasks(self) -> int | None:
        """Tasks running now in the whole application, or None when this
        kind of session cannot tell."""

    @abc.abstractmethod
    def on_stop(self, hook: Callable[[Any], None]) -> None:
        """Run ``hook(spark)`` inside ``spark.stop()``, before Spark ends the
        tasks (once, however often this is called with the same hook); the
        hook tells its sessions from others with :meth:`same_session`."""

    def same_session(self, other: Any) -> bool:
        """Whether stopping ``other`` stops this session's Spark work."""
        return other is self.spark

    def resource_profile(self, cpus: int, gpus: float) -> Any:
        """A task ResourceProfile for ``cpus`` and ``gpus`` per task."""
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

        req = TaskResourceRequests().cpus(cpus)
        if gpus > 0:
            req = req.resource("gpu", gpus)
        return ResourceProfileBuilder().require(req).build


def _partition_body(body: PartitionBody) -> Any:
    """``mapInArrow`` function that runs ``body`` on the task's partition, once."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        said = body(batches)
        yield pa.RecordBatch.from_pylist([{"out": said}], schema=pa.schema([("out", pa.string())]))

    return run


def missing_raydist(side: SparkSide, reason: str) -> str | None:
    """The message for a task that ended because the executors' Python
    cannot import raydist or Ray (naming that Python and the fix); None when
    ``reason`` says something else."""
    if "No module named 'raydist'" not in reason and "No module named 'ray'" not in reason:
        return None
    python = side.conf("spark.pyspark.python") or "PYSPARK_PYTHON on the Spark side, else python3"
    cause = next((line.strip() for line in reason.splitlines() if "No module named" in line), reason)
    return (f"the executors' Python ({python}) cannot import raydist and Ray ({cause[:200]}): install raydist "
            "there, or set spark.pyspark.python (PYSPARK_PYTHON) to a Python that has it")


def _wrap_stop(owner: Any, spark: Any, hook: Callable[[Any], None]) -> None:
    """``owner.stop()`` (this object only) runs ``hook(spark)`` first, once per hook."""
    hooks: list[Callable[[Any], None]] | None = getattr(owner.stop, "raydist_hooks", None)
    if hooks is None:
        original = owner.stop
        hooks = []

        def stop(*args: Any, **kwargs: Any) -> Any:
            for each in list(hooks):
                each(spark)
            return original(*args, **kwargs)

        stop.raydist_hooks = hooks  # type: ignore[attr-defined]
        owner.stop = stop
    if hook not in hooks:
        hooks.append(hook)


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (never starts anything)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
