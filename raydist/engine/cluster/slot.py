"""One worker node's place in a cluster, across restarts, and the pool of them.

What keeps a slot's Spark job running is :mod:`raydist.engine.cluster.node_jobs`;
what a slot's link events mean for it is :meth:`WorkerSlot.on_link`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from raydist.engine.link.nodelink import NodeLink
from raydist.spec import NodeStatus

__all__ = ["NodeCounters", "WorkerPool", "WorkerSlot", "first_error_line"]


#: Upper bounds (seconds) of the node start-time histogram's buckets.
#: At most one "starting" event a slot per this many seconds (its later hellos are counted in the next).
HELLO_EVENT_S = 10.0
START_BUCKETS = (1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


@dataclass
class NodeCounters:
    """A cluster's worker-node history, for its metrics: nodes that came up,
    nodes lost while the cluster wanted them, task reruns, and how long each
    start took (from its supervisor's hello to Ray's "started"), as a
    cumulative histogram over :data:`START_BUCKETS`."""

    starts: int = 0
    losses: int = 0
    restarts: int = 0
    #: Starts that took at most each bound of START_BUCKETS, in its order.
    start_buckets: list[int] = field(default_factory=lambda: [0] * len(START_BUCKETS))
    start_seconds_sum: float = 0.0

    def observe_start(self, seconds: float) -> None:
        self.starts += 1
        self.start_seconds_sum += seconds
        for i, bound in enumerate(START_BUCKETS):
            if seconds <= bound:
                self.start_buckets[i] += 1


@dataclass
class WorkerSlot:
    """One worker node's place in the cluster, across its restarts."""

    index: int
    key: str
    link: NodeLink | None = None
    up: bool = False
    restarts: int = 0
    up_since: float = 0.0
    last_reason: str = ""
    #: Whether a Spark job of this slot runs, waits for a task slot, or is
    #: due to be submitted again (the jobs' thread sets it).
    in_spark: bool = False
    #: Set when the cluster no longer wants this node (it shrank): its job is
    #: not submitted again, and the slot leaves the pool once its thread ends.
    retired: threading.Event = field(default_factory=threading.Event)

    idle_ms: int = 0  # how long Ray has counted the node idle (elastic clusters' head reports it)
    counters: NodeCounters = field(default_factory=NodeCounters)  # the pool's, shared by its slots
    hello_at: float = 0.0  # when the current supervisor said hello (monotonic)
    #: When a hello was last written to the cluster's events, and how many
    #: since were not: a node that reconnects in a loop (a valid key, a bug or
    #: a hostile peer) writes one event row per HELLO_EVENT_S, not one per hello.
    hello_said_at: float = float("-inf")
    hellos_unsaid: int = 0

    @property
    def tag(self) -> str:
        """Suffix of the Spark job tag of this slot's jobs (cancelled alone when it retires)."""
        return f"slot-{self.key}"


    def status(self) -> NodeStatus:
        link = self.link
        info = link.info if link else {}
        return NodeStatus(
            key=self.key, up=self.up, host=link.host if link else "", node_ip=link.node_ip if link else "",
            cpus=int(info.get("cpus", 0)), gpus=int(info.get("gpus", 0)), gpu_ids=tuple(info.get("gpu_ids", ())),
            restarts=self.restarts, message=self.last_reason, idle_s=self.idle_ms / 1000,
            ray_node_id=str(info.get("node_id", "")),
        )

    def on_link(self, event: str, link: NodeLink, *, stopping: bool) -> tuple[str, str] | None:
        """Apply one event of a supervisor's link to this slot. Returns None
        when nothing changed, else (what to record, the loss to report or
        "") for the cluster to derive its state from."""
        if event == "hello":
            # A new supervisor for this slot means Spark ran the node's task
            # again: the old node is gone even if its own "stopped" arrives
            # later (or never, from a dead executor).
            replaced = self.up
            if self.link is not None:
                # Counted here, whether Spark retried the task inside its job
                # or raydist resubmitted the job.
                self.restarts += 1
                self.counters.restarts += 1
            self.link, self.up, self.hello_at = link, False, time.monotonic()
            if replaced and not stopping:
                self.last_reason = "Spark ran its task again (the previous executor was lost)"
                self.counters.losses += 1
                return self._hello_event(link), f"worker {self.key} lost: {self.last_reason}"
            return self._hello_event(link), ""
        if event == "started" and link is self.link:
            self.up, self.up_since = True, time.monotonic()
            self.counters.observe_start(self.up_since - self.hello_at)
            return f"worker {self.key} up on {link.host} ({link.node_ip})", ""
        if event in ("stopped", "closed") and link is self.link and self.up:
            self.up = False
            if stopping:
                return None
            self.last_reason = f"its Ray node stopped: {link.ended_why()}"
            self.counters.losses += 1
            return "", f"worker {self.key} lost: {self.last_reason}"
        return None

    def _hello_event(self, link: NodeLink) -> str:
        """What to record of a hello: "" within HELLO_EVENT_S of the last one recorded."""
        if self.hello_at - self.hello_said_at < HELLO_EVENT_S:
            self.hellos_unsaid += 1
            return ""
        unsaid, self.hellos_unsaid, self.hello_said_at = self.hellos_unsaid, 0, self.hello_at
        more = f" ({unsaid} more hello(s) before it not recorded)" if unsaid else ""
        return f"worker {self.key} starting on {link.host}{more}"

    def log_tail(self) -> list[str]:
        """The last lines of the current node's ``ray start`` output."""
        return list(self.link.log_tail) if self.link is not None else []


class WorkerPool:
    """A cluster's worker slots: the ones it wants (active) and the ones
    leaving (retired, until their Spark job has ended). Keys are never
    reused, so a late message from a removed node cannot land on a new one.
    The cluster's lock guards it."""

    def __init__(self, initial: int) -> None:
        self._all: list[WorkerSlot] = []
        self._by_key: dict[str, WorkerSlot] = {}
        self._next = 0
        self.counters = NodeCounters()
        self.add(initial)

    def add(self, count: int) -> list[WorkerSlot]:
        """``count`` new active slots (their threads are the caller's to start)."""
        new = [WorkerSlot(self._next + i, f"w{self._next + i}", counters=self.counters) for i in range(count)]
        self._next += count
        self._all += new
        self._by_key.update((s.key, s) for s in new)
        return new

    def active(self) -> list[WorkerSlot]:
        return [s for s in self._all if not s.retired.is_set()]

    def every(self) -> list[WorkerSlot]:
        """Active and retiring slots."""
        return list(self._all)

    def find(self, key: str) -> WorkerSlot | None:
        return self._by_key.get(key)

    def pick_to_retire(self, count: int, prefer: tuple[str, ...] = ()) -> list[WorkerSlot]:
        """``count`` active slots to remove: the named ones first, then nodes
        not up yet, then the newest."""
        active = self.active()
        order = ([s for s in active if s.key in prefer] + [s for s in reversed(active) if not s.up]
                 + list(reversed(active)))
        picked: list[WorkerSlot] = []
        for slot in order:
            if slot not in picked and len(picked) < count:
                picked.append(slot)
        return picked

    def prune(self) -> None:
        """Forget retired slots whose Spark job has ended."""
        self._all = [s for s in self._all if not (s.retired.is_set() and not s.in_spark)]
        if len(self._by_key) != len(self._all):
            self._by_key = {s.key: s for s in self._all}


def first_error_line(exc: BaseException) -> str:
    """The line of a (often very long, py4j- or Connect-wrapped) Spark error
    that says what went wrong: the Python exception a task's traceback ends
    with when there is one (``ModuleNotFoundError: No module named ...``),
    else the first line that names an error."""
    text = str(exc).strip().splitlines()
    for at, line in enumerate(text):
        if "Traceback (most recent call last)" in line:
            for after in text[at + 1:]:
                if after.strip() and not after[:1].isspace() and ": " in after:
                    return after.strip()[:300]
            break
    for line in text:
        if "Error" in line or "Exception" in line or "Lost" in line:
            return line.strip()[:300]
    return (text[0] if text else type(exc).__name__)[:300]
