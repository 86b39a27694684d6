"""MLflow from every rank: the driver's tracking context follows the run.

Spark users train inside an MLflow run (on Databricks a notebook has one),
and log from the training function: ``mlflow.log_metric(...)`` on rank 0.
Under raydist that function runs in other processes, often on other hosts,
which know neither the tracking server nor the run. So when a run starts,
raydist reads the driver's MLflow context (the tracking URI, the active
run, its experiment, and the credentials MLflow reads from the
environment) and every rank runs its function with it:

- rank 0 logs into the driver's active run (``MLFLOW_RUN_ID``), so its
  ``log_metric``/``log_param``/``log_artifact`` and ``mlflow.*.autolog()``
  land where the user looks;
- with ``configure_mlflow(all_ranks=True)``, every other rank logs into a
  child run of it of its own, tagged ``rank``;
- otherwise the other ranks get the tracking server and credentials only: a
  rank that logs anyway starts a run of its own there, as it would under
  pyspark on Databricks.

A rank never ends the driver's run (MLflow ends the active run when a
process exits; raydist lets go of it first). With no active run nothing is
created, unless ``configure_mlflow(start_run=True)``. A process that never
imported MLflow and set no ``MLFLOW_TRACKING_URI`` pays nothing: MLflow is
not imported for it.

raydist also writes its own figures into the active run (tags
``raydist.class``/``raydist.use_gpu``, metrics ``raydist.workers``,
``raydist.run_wall_s``, ``raydist.cluster_wait_s``, and a small JSON of the
run as an artifact under ``raydist/``); ``configure_mlflow(figures=False)``
turns that off, ``configure_mlflow(enabled=False)`` all of it.

Credentials travel inside the run's pickled function, never in ``argv``,
logs or events; the context's ``repr`` names variables, not values.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MlflowSettings", "configure_mlflow", "mlflow_settings", "MlflowContext", "tracked_run", "note_cluster",
           "carry_mark"]

log = logging.getLogger(__name__)

#: What MLflow (and the stores behind it) read from the environment to find
#: the tracking server and sign in: each rank gets the driver's values.
PASSED_ENV = (
    "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH", "MLFLOW_S3_ENDPOINT_URL", "DATABRICKS_HOST", "DATABRICKS_TOKEN",
    "DATABRICKS_CLIENT_ID", "DATABRICKS_CLIENT_SECRET",
)
#: Marks a function that already carries a context (never wrapped twice).
_CARRIES = "__raydist_mlflow__"


@dataclass(frozen=True)
class MlflowSettings:
    """How raydist treats MLflow in this process (:func:`configure_mlflow`)."""

    #: Pass the driver's MLflow context to the ranks at all.
    enabled: bool = True
    #: Every rank logs: rank 0 into the active run, each other rank into a
    #: child run of its own tagged ``rank``. Off: rank 0 alone gets the run.
    all_ranks: bool = False
    #: With no active run, start one for each training run (and end it after).
    start_run: bool = False
    #: raydist's own figures of each run into the active run.
    figures: bool = True


_settings = MlflowSettings()
_settings_lock = threading.Lock()


def configure_mlflow(**changes: bool) -> MlflowSettings:
    """Change this process's :class:`MlflowSettings` (keyword per field);
    returns the new settings. A misspelt or non-bool setting is a
    TrainingConfigError naming it."""
    from raydist.errors import TrainingConfigError

    global _settings
    known = {f.name for f in dataclasses.fields(MlflowSettings)}
    for key, value in changes.items():
        if key not in known:
            raise TrainingConfigError(key, value, f"one of {', '.join(sorted(known))}")
        if not isinstance(value, bool):
            raise TrainingConfigError(key, value, "True or False")
    with _settings_lock:
        _settings = dataclasses.replace(_settings, **changes)
        return _settings


def mlflow_settings() -> MlflowSettings:
    """This process's settings now."""
    return _settings


@dataclass(frozen=True)
class MlflowContext:
    """The driver's MLflow context for one run, as each rank receives it."""

    env: Mapping[str, str] = field(repr=False)  # secrets among them: never shown
    run_id: str = ""
    experiment_id: str = ""
    all_ranks: bool = False

    def __repr__(self) -> str:
        return (f"MlflowContext(env={sorted(self.env)}, run_id={self.run_id!r}, "
                f"experiment_id={self.experiment_id!r}, all_ranks={self.all_ranks})")

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` run with this context on whatever rank calls it."""
        if getattr(fn, _CARRIES, False):
            return fn
        context = self

        @functools.wraps(fn)  # Ray Train reads the signature (a config argument or none) through this
        def with_mlflow(*args: Any, **kwargs: Any) -> Any:
            return context.run_on_rank(fn, args, kwargs)

        setattr(with_mlflow, _CARRIES, True)
        return with_mlflow

    def run_on_rank(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from raydist.train._env import scoped_env

        rank = _rank()
        env = dict(self.env)
        child = ""
        if self.run_id and rank == 0:
            env["MLFLOW_RUN_ID"] = self.run_id
        elif self.run_id and self.all_ranks:
            with scoped_env(env):
                child = _child_run(self, rank)
            env["MLFLOW_RUN_ID"] = child
        try:
            with scoped_env(env):
                return fn(*args, **kwargs)
        finally:
            if self.run_id:
                _let_go(self.run_id)  # the driver's: this process must not end it as it exits
            if child:
                with scoped_env(self.env):  # the tracking server's, as the child run was made
                    _end_child(child)


def _rank() -> int:
    """This process's world rank: torchrun's ``RANK``, else Ray Train's
    (a TensorFlow worker has ``TF_CONFIG`` only), else 0 (the driver)."""
    if os.environ.get("RANK"):
        return int(os.environ["RANK"])
    if "ray.train" in sys.modules:
        try:
            import ray.train

            return int(ray.train.get_context().get_world_rank())
        except Exception:  # noqa: BLE001 - not in a Ray Train worker
            pass
    return 0


def _child_run(ctx: MlflowContext, rank: int) -> str:
    from mlflow import MlflowClient

    run = MlflowClient().create_run(ctx.experiment_id, run_name=f"rank-{rank}", tags={
        "mlflow.parentRunId": ctx.run_id, "rank": str(rank)})
    return str(run.info.run_id)


def _end_child(run_id: str) -> None:
    _let_go(run_id)
    try:
        from mlflow import MlflowClient

        MlflowClient().set_terminated(run_id)
    except Exception:  # noqa: BLE001 - the rank's work is done; its run's status is a courtesy
        log.warning("could not end this rank's MLflow run %s", run_id, exc_info=True)


def _let_go(run_id: str) -> None:
    """Forget ``run_id`` as this process's active run without ending it."""
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is None:
        return
    try:
        for stack in fluent._active_run_stack.get_all_thread_values().values():
            stack[:] = [run for run in stack if run.info.run_id != run_id]
    except Exception:  # noqa: BLE001 - an MLflow that keeps its runs otherwise: nothing to forget
        log.debug("could not read MLflow's active runs", exc_info=True)


def _absolute(uri: str) -> str:
    """A local store's URI that every rank reads alike, whatever its cwd."""
    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme) and not uri[len(scheme):].startswith("/"):
            return scheme + os.path.abspath(uri[len(scheme):])
    if "://" not in uri and ":" not in uri.split("/")[0] and uri not in ("databricks", ""):
        return os.path.abspath(uri)  # a bare path: MLflow's file store
    return uri


def driver_context(settings: MlflowSettings | None = None) -> tuple[MlflowContext | None, Any]:
    """The driver's context now, or None where MLflow is not in use; and
    the run started here for it (``start_run``), to end after the run."""
    settings = settings or _settings
    if not settings.enabled:
        return None, None
    imported = "mlflow" in sys.modules
    if not (imported or os.environ.get("MLFLOW_TRACKING_URI") or settings.start_run):
        return None, None
    env = {key: os.environ[key] for key in PASSED_ENV if os.environ.get(key)}
    if not imported and not settings.start_run:
        # Configured by the environment only: pass it on, import nothing.
        run_id = os.environ.get("MLFLOW_RUN_ID", "")
        experiment = os.environ.get("MLFLOW_EXPERIMENT_ID", "")
        if experiment:
            env["MLFLOW_EXPERIMENT_ID"] = experiment
        return MlflowContext(env, run_id, experiment, settings.all_ranks), None
    try:
        import mlflow
    except ImportError:
        return None, None
    started = None
    run = mlflow.active_run()
    if run is None and settings.start_run:
        started = run = mlflow.start_run()
    if run is None and "MLFLOW_TRACKING_URI" not in os.environ and not _set_explicitly():
        return None, None  # MLflow imported, nothing set up: the ranks go on as before
    env["MLFLOW_TRACKING_URI"] = _absolute(mlflow.get_tracking_uri())
    experiment = run.info.experiment_id if run is not None else os.environ.get("MLFLOW_EXPERIMENT_ID", "")
    if experiment:
        env["MLFLOW_EXPERIMENT_ID"] = experiment
    return MlflowContext(env, run.info.run_id if run is not None else "", experiment, settings.all_ranks), started


def _set_explicitly() -> bool:
    """Whether the user chose a tracking URI (``mlflow.set_tracking_uri``)."""
    try:
        from mlflow.tracking._tracking_service import utils

        return bool(utils._tracking_uri)
    except Exception:  # noqa: BLE001 - an MLflow without the attribute: count it as chosen
        return True


def carry_mark(wrapper: Callable[..., Any], inner: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``wrapper`` as carrying a context when ``inner`` does, so that
    what wraps a wrapped job does not wrap it again."""
    if getattr(inner, _CARRIES, False):
        setattr(wrapper, _CARRIES, True)
    return wrapper


_cluster: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("raydist_mlflow_cluster",
                                                                               default=None)
#: The context of the tracked run this code is inside (an outer class's run
#: through an inner one: the outer owns the figures and the wrapping).
_current: contextvars.ContextVar[tuple[MlflowContext | None] | None] = contextvars.ContextVar(
    "raydist_mlflow_current", default=None)


def note_cluster(**figures: Any) -> None:
    """What the run's cluster looked like and how long the run waited for it
    (the session's ``connected``), for :func:`tracked_run`'s figures."""
    current = _cluster.get()
    if current is not None:
        current.update(figures)


@contextlib.contextmanager
def tracked_run(kind: str, workers: int, use_gpu: bool) -> Iterator[MlflowContext | None]:
    """Around one training run on the driver: yields the context whose
    ``wrap`` the run's function goes through (None: MLflow not in use), and
    after the run writes raydist's figures into the active run."""
    outer = _current.get()
    if outer is not None:
        yield outer[0]
        return
    settings = _settings
    ctx, started = driver_context(settings)
    cluster: dict[str, Any] = {}
    token = _cluster.set(cluster)
    current = _current.set((ctx,))
    t0 = time.monotonic()
    error = ""
    try:
        yield ctx
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"[:1000]
        raise
    finally:
        _current.reset(current)
        _cluster.reset(token)
        if ctx is not None and ctx.run_id and settings.figures:
            _log_figures(ctx.run_id, kind, workers, use_gpu, time.monotonic() - t0, cluster, error)
        if started is not None:
            import mlflow

            mlflow.end_run("FAILED" if error else "FINISHED")


_runs_logged = 0


def _log_figures(run_id: str, kind: str, workers: int, use_gpu: bool, wall_s: float, cluster: dict[str, Any],
                 error: str) -> None:
    """One batch of tags and metrics, one small artifact; a failure to log
    is a warning, never the run's failure."""
    global _runs_logged
    try:
        from mlflow import MlflowClient
        from mlflow.entities import Metric, RunTag

        _runs_logged += 1
        step = _runs_logged
        now = int(time.time() * 1000)
        metrics = [Metric("raydist.workers", float(workers), now, step),
                   Metric("raydist.run_wall_s", round(wall_s, 3), now, step)]
        if "wait_s" in cluster:
            metrics.append(Metric("raydist.cluster_wait_s", round(float(cluster["wait_s"]), 3), now, step))
        tags = [RunTag("raydist.class", kind), RunTag("raydist.use_gpu", str(bool(use_gpu)).lower())]
        client = MlflowClient()
        client.log_batch(run_id, metrics=metrics, tags=tags)
        record = {"class": kind, "workers": workers, "use_gpu": bool(use_gpu), "wall_s": round(wall_s, 3),
                  "ended_unix_s": round(time.time(), 3), "cluster": cluster, "error": error}
        client.log_text(run_id, json.dumps(record, indent=1, default=str), f"raydist/run-{step}.json")
    except Exception:  # noqa: BLE001 - the figures are a courtesy; the run's own outcome stands
        log.warning("could not write raydist's figures into MLflow run %s", run_id, exc_info=True)
