"""How many worker nodes a cluster runs: by request, or following Ray's demand.

Ray reports what it cannot place (:mod:`raydist.engine.node.demand`); :func:`decide`
turns that, and how long each node has been idle, into a number of worker
nodes and the reason for it (pure rules: no Spark, Ray or clock), and
:class:`Scaler` applies a number to a cluster's :class:`WorkerPool`.

* Up: the pending bundles are packed onto new nodes of the cluster's worker
  shape (first fit, largest first); nodes already starting absorb that many
  first. Bundles no worker node could ever hold (more CPUs or GPUs than a
  node has, a resource no node offers) are left out: adding nodes cannot
  help them.
* Down: with nothing pending, each node idle for ``idle_timeout_s`` or more
  (Ray's own idle count, which an object or a running task resets) is
  removed, down to ``min_workers``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raydist.engine.cluster.slot import WorkerPool, WorkerSlot
    from raydist.spec import ClusterSpec

__all__ = ["Decision", "Scaler", "decide", "elastic", "nodes_for"]

_SHAPE_KEYS = ("CPU", "GPU")


@dataclass(frozen=True)
class Decision:
    """The worker count to run, the reason, and (when shrinking) which nodes go."""

    workers: int
    reason: str
    remove: tuple[str, ...] = ()


def elastic(spec: ClusterSpec) -> bool:
    """Whether ``spec`` follows demand (``min_workers < max_workers``)."""
    return spec.required_workers < spec.desired_workers


def nodes_for(pending: Sequence[tuple[Mapping[str, float], int]], cpus: int, gpus: float) -> tuple[int, int]:
    """(new worker nodes of ``cpus`` CPUs and ``gpus`` GPUs that would hold
    the ``pending`` bundles, bundles no such node can hold)."""
    bundles: list[dict[str, float]] = []
    impossible = 0
    for bundle, count in pending:
        need = {k: float(v) for k, v in bundle.items() if float(v) > 0 and not k.startswith("node:")}
        fits = (need.get("CPU", 0.0) <= cpus and need.get("GPU", 0.0) <= gpus
                and all(k in _SHAPE_KEYS or k == "memory" or k == "object_store_memory" for k in need))
        if not fits:
            impossible += count
            continue
        bundles += [need] * count
    bundles.sort(key=lambda b: (b.get("GPU", 0.0), b.get("CPU", 0.0)), reverse=True)
    free: list[list[float]] = []  # per new node: [cpus left, gpus left]
    for need in bundles:
        c, g = need.get("CPU", 0.0), need.get("GPU", 0.0)
        for node in free:
            if node[0] >= c - 1e-9 and node[1] >= g - 1e-9:
                node[0] -= c
                node[1] -= g
                break
        else:
            free.append([cpus - c, gpus - g])
    return len(free), impossible


def decide(
    *,
    pending: Sequence[tuple[Mapping[str, float], int]],
    idle_ms: Mapping[str, int],
    active: int,
    up: int,
    min_workers: int,
    max_workers: int,
    cpus: int,
    gpus: float,
    idle_timeout_s: float,
) -> Decision | None:
    """The change to make to an elastic cluster of ``active`` wanted worker
    nodes (``up`` of them running), or None to keep it as it is. ``idle_ms``
    maps each running node's key to how long Ray has counted it idle."""
    needed, _ = nodes_for(pending, cpus, gpus)
    starting = max(0, active - up)
    if needed > starting and active < max_workers:
        target = min(max_workers, active + needed - starting)
        waiting = sum(count for bundle, count in pending)
        return Decision(target, f"{waiting} resource request(s) wait that no node can take now "
                                f"({_describe(pending)}); {target - active} more node(s)")
    if needed:
        return None  # demand that new or starting nodes will take: nothing is idle for long
    # Nothing waits: nodes idle past the timeout go. A node still starting is
    # left to come up (a reading between a task's lease requests can show no
    # demand for a moment); once up and idle, the timeout takes it.
    idle = sorted(key for key, ms in idle_ms.items() if ms >= idle_timeout_s * 1000)
    removable = max(0, min(len(idle), active - min_workers))
    if removable:
        gone = tuple(idle[:removable])
        return Decision(active - removable, f"idle for {idle_timeout_s:g} s or more: {', '.join(gone)}", gone)
    return None


def _describe(pending: Sequence[tuple[Mapping[str, float], int]]) -> str:
    parts = []
    for bundle, count in pending[:3]:
        shape = ", ".join(f"{k}: {v:g}" for k, v in sorted(bundle.items()) if not k.startswith("node:"))
        parts.append(f"{count} x {{{shape}}}")
    return "; ".join(parts) + (" ..." if len(pending) > 3 else "")


class Scaler:
    """Applies worker counts to a cluster's pool; the cluster's lock is held
    by every caller. ``start(slot)`` starts a new slot's Spark job loop,
    ``cancel(slot)`` cancels a leaving slot's job, ``record`` writes an event."""

    def __init__(self, pool: WorkerPool, *, start: Callable[[WorkerSlot], None],
                 cancel: Callable[[WorkerSlot], None], record: Callable[[str], None]) -> None:
        self._pool = pool
        self._start = start
        self._cancel = cancel
        self._record = record

    def scale(self, target: int, reason: str, prefer: tuple[str, ...] = ()) -> bool:
        """Run ``target`` worker nodes: start new slots, or retire some
        (``prefer`` first, then nodes not up yet, then the newest): each
        retired node is told to stop and its Spark job cancelled. Returns
        whether anything changed; every change is an event with its reason."""
        active = self._pool.active()
        if target == len(active):
            return False
        self._record(f"scaling from {len(active)} to {target} worker(s): {reason}")
        if target > len(active):
            for slot in self._pool.add(target - len(active)):
                self._start(slot)
        else:
            for slot in self._pool.pick_to_retire(len(active) - target, prefer):
                slot.retired.set()
                if slot.link is not None:
                    slot.link.stop()
                self._cancel(slot)
        self._pool.prune()
        return True

    def on_demand(self, reading: Mapping[str, Any], spec: ClusterSpec, cpus: int, *, ready: bool) -> bool:
        """Note each node's idle time from a head's demand reading; for an
        elastic cluster that is ready, grow or shrink as :func:`decide` says.
        Returns whether the size changed."""
        if "error" in reading:
            return False
        idle = reading.get("idle", {})
        active = self._pool.active()
        for slot in active:
            slot.idle_ms = int(idle.get(slot.key, 0))
        self._pool.prune()
        if not elastic(spec) or not ready:
            return False
        decision = decide(
            pending=[(dict(b), int(c)) for b, c in reading.get("pending", [])],
            idle_ms={s.key: s.idle_ms for s in active if s.up},
            active=len(active), up=sum(s.up for s in active), min_workers=spec.required_workers,
            max_workers=spec.desired_workers, cpus=cpus, gpus=spec.gpus_per_worker,
            idle_timeout_s=spec.idle_timeout_s,
        )
        return decision is not None and self.scale(decision.workers, decision.reason, decision.remove)
