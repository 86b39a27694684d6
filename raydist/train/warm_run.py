"""A Ray Train run kept warm between jobs.

Every ``TorchTrainer.fit`` starts a controller and fresh worker processes,
and each new worker imports torch and Ray Train before the user's code runs:
on a small machine that is most of a short job's wall time. A
:class:`WarmRun` starts one Ray Train run whose workers stay up and take
jobs (plain functions) from a :mod:`job board <raydist.train._board>` until
they have been idle ``keep_warm_s`` seconds. A second job then starts in the
processes the first one warmed.

What Ray Train still does: places the workers, restarts the whole group
when a worker is lost (``max_failures``), and streams the workers' output to
the driver. It makes no process group: each job makes its own, as under
torchrun. A lost worker makes the new group
run the unfinished job again from its start, as a fresh run would.

Each job runs in a child process forked from its warm worker: it starts with
torch (and whatever the job's function needs) already imported, and leaves
nothing behind for the next job, as a fresh process would. It gets torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, a
fresh ``MASTER_PORT``...). The job cannot use Ray's own APIs (the child is not
a Ray worker): this is for functions written for torchrun or Spark, not for
``ray.train.report``. A job that dies without an outcome (a signal, a crash)
counts as a lost worker.
"""

from __future__ import annotations

import logging
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raydist.engine.connection import connected_address, process_ray, same_address
from raydist.errors import ClusterFailedError
from raydist.train._inputs import RankInputs

__all__ = ["WarmRun", "WarmRuns", "TORCHRUN_PRIORITY_ENV"]

log = logging.getLogger(__name__)

_POLL_S = 2.0
#: How long ending a run before a disconnect waits for each step.
_ABANDON_JOIN_S = 10.0

#: The runtime env of workers that train like torchrun's processes. Ray
#: starts workers at nice 15; torchrun (and so Spark's distributor) trains at
#: the executor's own priority, and at 15 the training loses CPU to every
#: other process on the host. Ray Train also routes ``print`` through its
#: logger, which shows each line twice on the driver; torchrun leaves
#: ``print`` alone.
TORCHRUN_PRIORITY_ENV = {"env_vars": {"RAY_worker_niceness": "0", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}}
#: Jobs do not call ray.train.report, so the controller need not poll its
#: idle workers often (raydist's facades poll at 0.2 s).
_IDLE_HEALTH_CHECK = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2"}


def _serve(config: dict[str, Any]) -> None:
    """The training function of a warm run: take jobs until told to end.
    Each job runs in a child forked from this warm worker
    (:mod:`raydist.train._fork`)."""
    import ray
    import ray.train
    import torch  # noqa: F401 - imported once here, so every job's fork starts with it
    from ray import cloudpickle
    from ray.train.collective import broadcast_from_rank_zero

    from raydist.engine.ports import free_port
    from raydist.train._fork import ERROR, LOST, OK, pickle_error, run_forked
    from raydist.train._inputs import staged

    board = config["board"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    # Each worker group (a restart makes a new one) is a generation of the board.
    gen = broadcast_from_rank_zero(ray.get(board.new_generation.remote(world)) if rank == 0 else None)
    ray.get(board.register.remote(gen, rank, ray.get_runtime_context().current_actor,
                                  ray.util.get_current_placement_group()))
    # This worker's torchrun layout (RANK, LOCAL_RANK, CUDA_VISIBLE_DEVICES...)
    # is in its environment (the run's layout callback, raydist.train._layout):
    # every job's child inherits it, and gets only the job's rendezvous on top.
    after = 0
    while True:
        job = ray.get(board.next_job.remote(gen, after))
        if job is None:
            return
        seq, payload, inputs = job
        after = seq
        if rank == 0:
            addr = ray.util.get_node_ip_address()
            port = free_port(addr)
            ray.get(board.publish_rendezvous.remote(gen, seq, addr, port))
        else:
            found = ray.get(board.get_rendezvous.remote(gen, seq))
            if found is None:
                continue
            addr, port = found
        try:
            fn = cloudpickle.loads(payload)  # imports what the job needs here, once, before the fork
            _check_cuda_untouched()
        except BaseException as e:  # noqa: BLE001 - reported like the job's own error
            ray.get(board.report.remote(gen, seq, rank, False, pickle_error(e)))
            continue
        try:
            with staged(inputs, rank) as input_env:
                kind, value = run_forked(
                    fn,
                    {"MASTER_ADDR": str(addr), "MASTER_PORT": str(port), **input_env},
                    still_wanted=lambda seq=seq: bool(ray.get(board.job_active.remote(gen, seq))),
                )
        except Exception as e:  # noqa: BLE001 - this rank's input could not be had: the job's error
            ray.get(board.report.remote(gen, seq, rank, False, pickle_error(e)))
            continue
        if kind == LOST:
            # Like a lost worker: Ray Train replaces the group (max_failures)
            # and the new group runs the job again.
            raise RuntimeError(f"the process running rank {rank}'s job {value}")
        if kind in (OK, ERROR):
            ray.get(board.report.remote(gen, seq, rank, kind == OK, value if kind == ERROR or rank == 0 else b""))


def _check_cuda_untouched() -> None:
    """A CUDA context does not survive a fork: a warm worker never starts
    CUDA itself (importing torch does not), each job's child does. Should
    something the job's pickle imported have started it here, the job fails
    with why instead of every child failing in CUDA."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised in the warm training worker itself (by a module the job "
                           "imports?), so jobs forked from it cannot use the GPU; run with keep_warm_s=0")


class WarmRun:
    """One warm Ray Train run of ``workers`` workers that runs jobs in turn.

    ``run(job)`` runs ``job()`` on every worker and returns rank 0's value;
    the first worker's error is raised in the caller, with the worker's
    traceback as a note, and the other workers' copies of the job are
    stopped; the workers stay warm. Jobs run one at a time; ``close()`` ends
    the run. With ``use_gpu`` each worker holds one GPU; the worker itself
    never starts CUDA, so each job's child (forked before any CUDA call)
    starts it afresh. Each worker's devices and local rank come from
    :mod:`raydist.train._layout`.
    """

    def __init__(
        self,
        *,
        workers: int,
        resources_per_worker: Mapping[str, float] | None = None,
        use_gpu: bool = False,
        max_failures: int = 0,
        keep_warm_s: float,
        raydist_cluster: bool = True,
    ) -> None:
        self.workers = workers
        self.use_gpu = use_gpu
        self.raydist_cluster = raydist_cluster
        self.resources_per_worker = dict(resources_per_worker or {"CPU": 1})
        self.max_failures = max_failures
        self.keep_warm_s = keep_warm_s
        self.result: Any = None
        """Ray Train's Result of the run, once it has ended."""
        self._board: Any = None
        self._thread: threading.Thread | None = None
        self._fit_error: BaseException | None = None
        self._abandoned = False
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = 300.0, still_wanted: Callable[[], bool] | None = None) -> None:
        """Start the Ray Train run in a background thread; returns once its
        workers are up (or the run ended, or ``timeout_s`` passed: then the
        first ``run`` reports what happened). When ``still_wanted()`` says no
        before that, the run is ended (``abandon``)."""
        import contextvars
        import time

        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        from raydist.train._board import board_actor
        from raydist.train._env import run_settings
        from raydist.train._fit import fit_ready
        from raydist.train._layout import layout_callback

        self._board = board_actor(self.keep_warm_s)
        # Not TorchTrainer: each job makes its own process group, as under
        # torchrun, so Ray Train's would only be torn down again; and without
        # its torch backend neither this process nor the run's controller
        # imports torch (seconds of CPU before the first job, on a small host).
        trainer = fit_ready(DataParallelTrainer(
            _serve,
            train_loop_config={"board": self._board},
            scaling_config=ScalingConfig(
                num_workers=self.workers, use_gpu=self.use_gpu, resources_per_worker=self.resources_per_worker
            ),
            run_config=RunConfig(
                name=f"raydist-warm-run-{uuid.uuid4().hex[:8]}",
                failure_config=FailureConfig(max_failures=self.max_failures),
                worker_runtime_env=TORCHRUN_PRIORITY_ENV,
                callbacks=[_controller_on_board(self._board), layout_callback(self.use_gpu)],
            ),
        ), raydist_cluster=self.raydist_cluster)
        # The run's controller gets its settings from the context the run starts in.
        with run_settings(_IDLE_HEALTH_CHECK):
            context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._fit, trainer), name="raydist-warm-run",
                                        daemon=True)
        self._thread.start()
        started = time.monotonic()
        deadline = started + timeout_s
        with process_ray().calling():
            while self.alive and time.monotonic() < deadline and not self._abandoned:
                if ray.get(self._board.ready.remote()):
                    log.info("warm run of %d workers ready in %.1f s", self.workers, time.monotonic() - started)
                    break
                if still_wanted is not None and not still_wanted():
                    log.info("a warm run of %d workers is no longer wanted; ending it", self.workers)
                    break
                time.sleep(0.2)
            else:
                return
        if still_wanted is not None and not still_wanted() and not self._abandoned:
            self.abandon()

    def _fit(self, trainer: Any) -> None:
        # Inside Ray until the run ends: a disconnect waits for that (abandon() ends it first).
        with process_ray().calling():
            try:
                self.result = trainer.fit()
            except BaseException as e:  # noqa: BLE001 - reported by the next run() call
                self._fit_error = e

    def run(self, job: Callable[[], Any], inputs: RankInputs | None = None) -> Any:
        """Run ``job()`` on every worker; rank 0's return value. ``inputs``:
        each rank's own input, staged for its job (:mod:`raydist.train._inputs`).
        Interrupted here (Ctrl-C), the workers drop the job and stay warm."""
        import ray
        from ray import cloudpickle

        with self._lock:
            board = self._board
            if board is None or not self.alive:
                raise ClusterFailedError("the warm training run has ended; start a new one")
            with process_ray().calling():
                put = inputs.put() if inputs is not None else None
                seq = ray.get(board.submit.remote(cloudpickle.dumps(job), put))
                del put  # the board holds the inputs while the job is on it
                try:
                    return self._wait(board, seq)
                except BaseException as e:
                    if self._abandoned:
                        # The run's cluster is going under the job (abandon()).
                        raise ClusterFailedError("the training run's cluster was torn down during the job") from e
                    self._cancel(board, seq)
                    raise

    def _cancel(self, board: Any, seq: int) -> None:
        import ray

        if not ray.is_initialized():
            return
        try:
            ray.get(board.cancel.remote(seq), timeout=10)
        except Exception as e:  # noqa: BLE001 - the run or the connection is gone already
            log.debug("cancelling job %d: %s", seq, e)

    def _wait(self, board: Any, seq: int) -> Any:
        import ray
        from ray import cloudpickle

        while True:
            if self._abandoned:
                raise ClusterFailedError("the training run's cluster was torn down during the job")
            state, value = ray.get(board.wait.remote(seq, _POLL_S))
            if state == "ok":
                return cloudpickle.loads(value)
            if state == "error":
                rank, payload = value
                if not payload:
                    raise ClusterFailedError("the warm training run lost its job")
                error, text = cloudpickle.loads(payload)
                error.add_note(f"raised by training worker rank {rank}; its traceback:\n{text}")
                raise error
            if not self.alive:
                raise ClusterFailedError(f"the training run ended before the job finished: {self._ended_why()}")

    def _ended_why(self) -> str:
        if self._fit_error is not None:
            return f"{type(self._fit_error).__name__}: {self._fit_error}"
        error = getattr(self.result, "error", None)
        return f"{type(error).__name__}: {error}" if error is not None else "it stopped"

    def keep_warm(self, keep_warm_s: float) -> None:
        """Change how long the workers stay warm without a job."""
        import ray

        if self._board is not None and keep_warm_s != self.keep_warm_s:
            ray.get(self._board.set_keep_warm.remote(keep_warm_s))
            self.keep_warm_s = keep_warm_s

    def abandon(self) -> None:
        """End the run at once because this process is about to disconnect
        from its cluster, a job on it or not: a job waiting here raises
        ClusterFailedError. Returns once the run's threads here are out of
        Ray (bounded), since Ray frees its core worker on disconnect under
        any thread still waiting in it. The run's controller is killed (its
        workers go with it; a graceful end would wait for the controller's
        next poll) and its placement group removed: a killed controller
        leaves it behind, and while this process stays connected (a session
        cluster shrunk to its head) it would take the CPUs of the next run's
        nodes as soon as they came up."""
        import ray

        self._abandoned = True
        board = self._board
        if board is None or not ray.is_initialized():
            return
        try:
            controller = ray.get(board.get_controller.remote(), timeout=_ABANDON_JOIN_S)
        except Exception as e:  # noqa: BLE001 - the run or its cluster is gone already
            log.debug("finding the warm run's controller: %s", e)
            controller = None
        if controller is None:  # still starting: end it as close() does
            self.close(timeout=_ABANDON_JOIN_S)
            return
        self._board = None
        try:
            # Stopped first, the workers and a job's wait here return quietly
            # (not with the board's death), and the board ends with the connection.
            placement_group = ray.get(board.get_placement_group.remote(), timeout=_ABANDON_JOIN_S)
            ray.get(board.stop.remote(), timeout=_ABANDON_JOIN_S)
            ray.kill(controller, no_restart=True)
            if placement_group is not None:
                ray.util.remove_placement_group(placement_group)
        except Exception as e:  # noqa: BLE001 - gone already
            log.debug("ending the warm run: %s", e)
        if self._thread is not None:
            self._thread.join(_ABANDON_JOIN_S)

    def close(self, *, timeout: float = 30.0) -> None:
        """End the run: idle workers return at once; workers that do not
        return within ``timeout`` are killed."""
        import ray

        if self._board is None:
            return
        board, self._board = self._board, None
        if not ray.is_initialized():
            return  # disconnected: the run's actors ended with this driver's job
        try:
            ray.get(board.stop.remote(), timeout=10)
            if self._thread is not None:
                self._thread.join(timeout)
                if self._thread.is_alive():
                    for actor in ray.get(board.worker_actors.remote(), timeout=10):
                        ray.kill(actor, no_restart=True)
                    self._thread.join(timeout)
        except Exception as e:  # noqa: BLE001 - closing after the cluster or connection is gone
            log.debug("closing a warm run: %s", e)
        finally:
            try:
                ray.kill(board)
            except Exception:  # noqa: BLE001
                pass


def _controller_on_board(board: Any) -> Any:
    """A Ray Train controller callback that puts the controller's own actor
    handle on ``board`` when the run starts (see WarmRun.abandon)."""
    import ray
    from ray.train.v2._internal.execution.callback import ControllerCallback

    class ControllerOnBoard(ControllerCallback):
        def after_controller_start(self, train_run_context: Any) -> None:
            board.set_controller.remote(ray.get_runtime_context().current_actor)

    return ControllerOnBoard()


def _key(workers: int, resources_per_worker: Mapping[str, float], use_gpu: bool, max_failures: int) -> tuple[Any, ...]:
    """What makes a warm run fit a job: its cluster and its workers."""
    return connected_address(), workers, tuple(sorted(resources_per_worker.items())), use_gpu, max_failures


@dataclass(eq=False)
class _Kept:
    """The warm run, what it was started for, and whether a job is on it now."""

    key: tuple[Any, ...]
    run: WarmRun
    in_use: bool = True


class WarmRuns:
    """This process's warm run: at most one, leased a job at a time.

    Its workers hold the CPUs another run would need, so there is one: a job
    for the same workers takes it (after another thread's job on it), a job
    for other workers ends it and starts its own (likewise after the job on
    it), and a run with workers of its own ends it first (:meth:`release`).
    When this process is about to disconnect from its cluster, it ends a job
    on it or not (:meth:`let_go`), and its threads here leave Ray first.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()  # guards _kept; never held while calling out
        self._kept: _Kept | None = None

    def run(self, job: Callable[[], Any], *, workers: int, resources_per_worker: Mapping[str, float],
            max_failures: int, keep_warm_s: float, use_gpu: bool = False, raydist_cluster: bool = True,
            inputs: RankInputs | None = None) -> Any:
        """Run ``job()`` on the warm run for these settings on the
        connected cluster (started if needed; ``raydist_cluster``: that
        cluster is raydist's own); rank 0's return value. ``inputs``: each
        rank's own. One that differs only in ``keep_warm_s`` takes the new
        value."""
        kept = self._take(_key(workers, resources_per_worker, use_gpu, max_failures), workers, resources_per_worker,
                          use_gpu, max_failures, keep_warm_s, raydist_cluster)
        try:
            kept.run.keep_warm(keep_warm_s)
            return kept.run.run(job, inputs)
        finally:
            with self._changed:
                kept.in_use = False
                self._changed.notify_all()

    def prepare(self, *, workers: int, resources_per_worker: Mapping[str, float], keep_warm_s: float,
                still_wanted: Callable[[], bool] | None = None) -> None:
        """Start the warm run a CPU job of ``workers`` workers would take on
        the connected cluster (raydist's own), with no job on it: the session
        cluster's warm-up for the next run. It is given up as soon as
        ``still_wanted()`` says no (its nodes' slots went back to Spark)."""
        kept = self._take(_key(workers, resources_per_worker, False, 0), workers, resources_per_worker, False, 0,
                          keep_warm_s, True, still_wanted)
        with self._changed:
            kept.in_use = False
            self._changed.notify_all()

    def ready_on(self, address: str) -> bool:
        """Whether a warm run is up on the cluster at ``address``, its
        workers waiting for a job."""
        with self._changed:
            kept = self._kept
            return (kept is not None and bool(kept.key[0]) and same_address(kept.key[0], address)
                    and kept.run.alive and not kept.in_use)

    def _take(self, key: tuple[Any, ...], workers: int, resources_per_worker: Mapping[str, float],
              use_gpu: bool, max_failures: int, keep_warm_s: float, raydist_cluster: bool,
              still_wanted: Callable[[], bool] | None = None) -> _Kept:
        with self._changed:
            self._changed.wait_for(lambda: self._kept is None or not self._kept.in_use)
            old = self._kept
            if old is not None and old.key == key and old.run.alive:
                old.in_use = True
                return old
            new = _Kept(key, WarmRun(workers=workers, resources_per_worker=resources_per_worker,
                                         use_gpu=use_gpu, max_failures=max_failures, keep_warm_s=keep_warm_s,
                                         raydist_cluster=raydist_cluster))
            self._kept = new
        if old is not None:
            old.run.close()
        try:
            new.run.start(still_wanted=still_wanted)
        except BaseException:
            with self._changed:
                if self._kept is new:
                    self._kept = None
                self._changed.notify_all()
            raise
        return new

    def release(self) -> None:
        """End the warm run, if any, once no job is on it, so its
        workers' CPUs are free."""
        with self._changed:
            self._changed.wait_for(lambda: self._kept is None or not self._kept.in_use)
            kept, self._kept = self._kept, None
            self._changed.notify_all()
        if kept is not None:
            kept.run.close()

    def let_go(self, address: str) -> None:
        """This process is about to disconnect from ``address`` (hooked into
        :func:`raydist.engine.connection.process_ray`): the run there ends
        now; a job on it (another thread's) fails with why."""
        with self._changed:
            kept = self._kept
            if kept is None or not kept.key[0] or not same_address(kept.key[0], address):
                return
            self._kept = None
            self._changed.notify_all()
        kept.run.abandon()

    def close(self) -> None:
        """End the warm run now, a job on it or not (at exit nothing waits)."""
        with self._changed:
            kept, self._kept = self._kept, None
            self._changed.notify_all()
        if kept is not None:
            kept.run.close()
