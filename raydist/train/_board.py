"""The job board a warm Ray Train run takes its jobs from.

One small async actor per warm run. The driver posts a job and waits for
its outcome; every training worker takes the job, runs it, and posts its
outcome. The board also carries the little state the workers must agree on:

- the *generation* of the worker group: Ray Train replaces the whole group
  after a worker is lost, and outcomes from a replaced group are ignored, so
  the new group runs the unfinished job again from the start;
- each job's rendezvous (rank 0's address and a fresh port), as torchrun
  would give it;
- when to let the run end: on ``stop()``, or after ``keep_warm_s`` with no
  job, so idle workers give their CPUs back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

#: What ``wait`` answers while a job is still running.
PENDING = "pending"


class JobBoard:
    """Actor class (made remote by :func:`board_actor`); all methods are
    coroutines, so a worker blocked in ``next_job`` never blocks the driver."""

    def __init__(self, keep_warm_s: float) -> None:
        self.keep_warm_s = keep_warm_s
        self.generation = 0
        self.world = 0
        self.workers: dict[int, Any] = {}
        self.seq = 0
        # The one unfinished job: its number, pickled function and inputs
        # (raydist.train._inputs.PutInputs, or None).
        self.job: tuple[int, bytes, Any] | None = None
        self.outcomes: dict[int, tuple[bool, bytes]] = {}
        self.failure: tuple[int, bytes] | None = None
        self.rendezvous: dict[tuple[int, int], tuple[str, int]] = {}
        self.stopped = False
        self.last_active = time.monotonic()
        self.controller: Any = None  # the run's Ray Train controller actor, once it runs
        self.placement_group: Any = None  # the worker group's, once a worker registered
        self._changed = asyncio.Event()

    async def _notify(self) -> None:
        """Wake every waiter; each checks again what it waits for. (An Event
        replaced on each change, not a Condition: no lock to re-acquire
        after a timeout.)"""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _changes(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=max(0.05, timeout_s))
        except TimeoutError:
            pass

    # worker group ------------------------------------------------------------

    async def new_generation(self, world: int) -> int:
        """Rank 0 of a (re)started worker group: outcomes of the group before
        are dropped, and the unfinished job starts again."""
        self.generation += 1
        self.world = world
        self.workers = {}
        self.outcomes = {}
        self.last_active = time.monotonic()
        await self._notify()
        return self.generation

    async def register(self, generation: int, rank: int, actor: Any, placement_group: Any = None) -> None:
        """A worker of the current group is up (its actor, and the placement
        group Ray Train put the group in)."""
        if generation == self.generation:
            self.workers[rank] = actor
            if placement_group is not None:
                self.placement_group = placement_group

    async def get_placement_group(self) -> Any:
        """The current group's placement group (None before a worker registered)."""
        return self.placement_group

    async def worker_actors(self) -> list[Any]:
        return list(self.workers.values())

    async def set_controller(self, actor: Any) -> None:
        self.controller = actor

    async def get_controller(self) -> Any:
        """The run's controller (None until it runs): killing it ends the
        driver's wait on the run at once (its workers go with it)."""
        return self.controller

    async def ready(self) -> bool:
        return self.world > 0 and len(self.workers) == self.world

    async def next_job(self, generation: int, after: int) -> tuple[int, bytes, Any] | None:
        """The job after ``after`` for this generation; None when the run
        should end (stopped, idle too long, or the group was replaced)."""
        while True:
            if self.stopped or generation != self.generation:
                return None
            if self.job is not None and self.job[0] > after and self.failure is None:
                return self.job
            idle = time.monotonic() - self.last_active
            if self.job is None and idle >= self.keep_warm_s:
                self.stopped = True
                await self._notify()
                return None
            await self._changes(self.keep_warm_s - idle)

    async def job_active(self, generation: int, seq: int) -> bool:
        """Whether a worker should go on with job ``seq``: false once the
        job failed on another rank, the group was replaced, or the run stops."""
        return (
            not self.stopped
            and generation == self.generation
            and self.job is not None
            and self.job[0] == seq
            and self.failure is None
        )

    async def publish_rendezvous(self, generation: int, seq: int, addr: str, port: int) -> None:
        self.rendezvous = {k: v for k, v in self.rendezvous.items() if k[1] >= seq}
        self.rendezvous[(generation, seq)] = (addr, port)
        await self._notify()

    async def get_rendezvous(self, generation: int, seq: int) -> tuple[str, int] | None:
        while (generation, seq) not in self.rendezvous:
            if self.stopped or generation != self.generation or self.job is None or self.job[0] != seq:
                return None  # the run ends, the group was replaced, or the job was cancelled
            await self._changes(60.0)
        return self.rendezvous[(generation, seq)]

    async def report(self, generation: int, seq: int, rank: int, ok: bool, payload: bytes) -> None:
        """A worker's outcome: rank 0's return value, or any rank's error."""
        if generation != self.generation or self.job is None or self.job[0] != seq:
            return
        if ok:
            self.outcomes[rank] = (ok, payload)
        elif self.failure is None:
            self.failure = (rank, payload)
        await self._notify()

    # driver -----------------------------------------------------------------

    async def submit(self, payload: bytes, inputs: Any = None) -> int:
        """Post a job (its pickled function, and each rank's inputs, which
        the board holds until the job is done); its number."""
        if self.stopped:
            raise RuntimeError("the warm run has ended")
        self.seq += 1
        self.job = (self.seq, payload, inputs)
        self.outcomes, self.failure = {}, None
        self.last_active = time.monotonic()
        await self._notify()
        return self.seq

    async def wait(self, seq: int, timeout_s: float) -> tuple[str, Any]:
        """("ok", rank 0's payload) once every rank succeeded, ("error",
        (rank, payload)) on the first failure, or (PENDING, None) after
        ``timeout_s`` so the driver can check that the run is still alive."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.stopped or self.job is None or self.job[0] != seq:
                return ("error", (-1, b""))
            if self.failure is not None:
                failure = self.failure
                self._finish()
                return ("error", failure)
            if self.world and len(self.outcomes) == self.world:
                value = self.outcomes[0][1]
                self._finish()
                return ("ok", value)
            left = deadline - time.monotonic()
            if left <= 0:
                return (PENDING, None)
            await self._changes(left)

    async def cancel(self, seq: int) -> None:
        """The driver gave up on job ``seq`` (interrupted): every worker
        drops it (its forked child is killed) and waits for the next one."""
        if self.job is not None and self.job[0] == seq:
            self._finish()
            await self._notify()

    def _finish(self) -> None:
        self.job = None
        self.outcomes = {}
        self.last_active = time.monotonic()

    async def set_keep_warm(self, keep_warm_s: float) -> None:
        """How long idle workers now wait for a job before the run ends
        (counted from now: the driver says so just before a job)."""
        self.keep_warm_s = keep_warm_s
        self.last_active = time.monotonic()
        await self._notify()

    async def stop(self) -> None:
        self.stopped = True
        await self._notify()


def board_actor(keep_warm_s: float) -> Any:
    """Start a board actor owned by this driver (no CPU; it only waits)."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=1000)(JobBoard).remote(keep_warm_s)
