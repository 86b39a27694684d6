"""A run's ranks in Spark barrier tasks, with no Ray: the way pyspark runs them.

pyspark's distributors run a job as one barrier stage of Spark tasks, each
starting ``torchrun`` for its share of the ranks. A first run that waits for
a Ray cluster pays the head's, the nodes' and Ray Train's starts before any
rank runs; one in Spark's tasks pays none of them. :func:`run_in_spark_tasks`
runs a job that way, with the contract of a run on Ray: every rank gets
torchrun's environment as :func:`raydist.train._layout.torchrun_layout`
gives it (so ``LOCAL_RANK`` indexes the task's own ``CUDA_VISIBLE_DEVICES``),
rank 0's value comes back, the first failing rank's error is raised as
itself, with the rank and its traceback as a note, and what each rank
prints reaches the driver's console as it prints it, as pyspark streams
torchrun's (on a classic session; from a Connect client, when the run ends:
:mod:`raydist.train._rank_output`).

In each task the Spark Python worker forks one child per rank
(:mod:`raydist.train._fork`), after importing the run's ``preload`` (torch)
itself: Spark reuses its Python workers, so a later run's ranks fork from a
process that has. A
worker that ran TensorFlow (the user's own Spark work) cannot be forked
safely: its ranks start as fresh interpreters.

The tasks meet at task 0 (:mod:`raydist.engine.spark.meeting`; Spark's own
``allGather`` takes a second or more a round): before any rank starts, to
share rank 0's port and task 0's host, and at the end, to agree how the run
ended. When a rank fails anywhere, every task kills its own ranks at once
(they would wait for the dead one in a collective) and all tasks end
normally, so Spark never retries the stage and the error reaches the driver
whole, on a classic session and on Connect alike (no task dials the driver).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib
import os
import select
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from raydist.train._inputs import FrameInputs, RankInputs
from raydist.train._layout import Placed, torchrun_layout
from raydist.train._rank_output import OutputSender, Where, streamed_output

__all__ = ["OUTPUT_LIMIT", "PeersEnv", "run_in_spark_tasks", "task_ranks"]

#: The most of one rank's output (bytes, its last) that reaches the driver.
OUTPUT_LIMIT = 1 << 20

#: Every rank's ``host:port`` (rank order) and a rank: that rank's added environment.
PeersEnv = Callable[[list[str], int], dict[str, str]]


def task_ranks(ranks: int, per_task: int) -> list[range]:
    """The world ranks of each task: ``per_task`` consecutive ranks a task,
    the last task taking what is left."""
    return [range(start, min(ranks, start + per_task)) for start in range(0, ranks, per_task)]


def run_in_spark_tasks(
    job: Callable[[], Any],
    *,
    spark: Any,
    ranks: int,
    per_task: int = 1,
    use_gpu: bool = False,
    env: dict[str, str] | None = None,
    inputs: RankInputs | FrameInputs | None = None,
    group: str = "",
    description: str = "raydist: training ranks",
    peers_env: PeersEnv | None = None,
    preload: tuple[str, ...] = ("torch",),
) -> Any:
    """Run ``job()`` in ``ranks`` processes, ``per_task`` to a task of one
    barrier stage on ``spark`` (classic or Connect); rank 0's value.

    ``env`` is added to every rank's environment (over the executor's own,
    under the layout's). ``inputs``: each rank's own, travelling with the
    stage (keep them small: every task gets the stage's closure) and staged
    in the rank's task as on Ray; or a DataFrame's partitions, one a rank
    (one rank a task), the stage then running over the DataFrame itself. ``peers_env``: for frameworks that dial
    every peer rather than rank 0 (TensorFlow's ``TF_CONFIG``), each rank's
    added environment from every rank's ``host:port`` (a port free on the
    rank's host, in rank order) and its own rank. ``preload``: modules each
    task's Python worker imports before it forks the ranks (Spark reuses the
    worker: later runs' ranks start with them); none that makes forking
    unsafe (TensorFlow). ``group`` labels the Spark job, so that cancelling
    it ends the run. The tasks take Spark's default task resources, as
    pyspark's distributors' do; a GPU run's ranks share their task's GPUs.
    """
    import secrets

    from pyspark import cloudpickle

    from raydist.engine.spark.sides import side_of
    from raydist.train._fork import CANCELLED, rank0_or_raise

    frame = inputs if isinstance(inputs, FrameInputs) else None
    if frame is not None and per_task != 1:
        inputs, frame = frame.collect(), None  # a task's one partition cannot feed several ranks
    side = side_of(spark)
    group = group or f"raydist-ranks-{os.getpid()}-{time.monotonic_ns()}"
    with streamed_output(side) as where:
        body = functools.partial(_task_body, cloudpickle.dumps(job), ranks, per_task, use_gpu, dict(env or {}),
                                 cloudpickle.dumps(inputs) if isinstance(inputs, RankInputs) else b"",
                                 cloudpickle.dumps(peers_env) if peers_env is not None else b"", where,
                                 preload, cloudpickle.dumps(frame.stage) if frame is not None else b"",
                                 secrets.token_hex(16))
        try:
            if frame is not None:
                said = side.run_over(frame.df, body, group=group, description=description)
            else:
                said = side.run_tasks(body, len(task_ranks(ranks, per_task)), group=group,
                                      description=description, barrier=True)
        except BaseException:
            side.cancel(group=group)  # an interrupted run: its tasks (and their ranks) end too
            raise
    outcomes: dict[int, tuple[str, Any]] = {}
    ended: dict[int, float] = {}
    printed: dict[int, str] = {}
    for line in said:
        ranks_said, output = cloudpickle.loads(base64.b64decode(line))
        for rank, kind, payload, at in ranks_said:
            outcomes[rank], ended[rank] = (kind, payload), at
        printed.update(output)
    for rank in sorted(printed):  # what did not stream (Connect; a refused dial): on this console now
        if printed[rank]:
            sys.stdout.write(printed[rank] if printed[rank].endswith("\n") else printed[rank] + "\n")
    sys.stdout.flush()
    # The rank that failed first, not one that failed because it did.
    # (A rank no task ran, of a DataFrame with too few partitions, was cancelled by the refusal.)
    return rank0_or_raise([outcomes.get(r, (CANCELLED, None)) for r in range(ranks)], cloudpickle,
                          order=sorted(ended, key=ended.get))


# ------------------------------------------------------------- in a task


def _task_body(payload: bytes, ranks: int, per_task: int, use_gpu: bool, env: dict[str, str],
               inputs: bytes = b"", peers: bytes = b"", output_to: Where | None = None,
               preload: tuple[str, ...] = (), frame: bytes = b"", key: str = "",
               batches: Iterator[Any] | None = None) -> str:
    """One task of the stage: fork this task's ranks, wait with the other
    tasks for the run to end, and say each rank's outcome. ``frame``: the
    stager of a run over a DataFrame, whose partition here is ``batches``.
    ``key``: the run's, which task 0 asks of every task that dials it."""
    from pyspark import BarrierTaskContext, cloudpickle

    ctx = BarrierTaskContext.get()
    task = ctx.partitionId()
    rank_inputs: RankInputs | None = cloudpickle.loads(inputs) if inputs else None
    with contextlib.ExitStack() as staged:
        own_env, refused = {}, None
        if rank_inputs is not None:
            for rank in task_ranks(ranks, per_task)[task]:
                where = staged.enter_context(tempfile.TemporaryDirectory(prefix=f"raydist-rank{rank}-"))
                own_env[rank] = dict(rank_inputs.stage(rank_inputs.values[rank], where))
        if frame:
            where = staged.enter_context(tempfile.TemporaryDirectory(prefix=f"raydist-rank{task}-"))
            try:
                own_env[task] = dict(cloudpickle.loads(frame)(batches, where, task, len(ctx.getTaskInfos())))
            except Exception as exc:  # noqa: BLE001 - the partition will not do: the run's error, said by all
                refused = exc
        sender = staged.enter_context(contextlib.closing(OutputSender(output_to))) if output_to else None
        return _ranks_in_task(payload, ranks, per_task, use_gpu, env, own_env,
                              cloudpickle.loads(peers) if peers else None, sender, preload, refused, key)


def _ranks_in_task(payload: bytes, ranks: int, per_task: int, use_gpu: bool, env: dict[str, str],
                   own_env: dict[int, dict[str, str]], peers_env: PeersEnv | None = None,
                   sender: OutputSender | None = None, preload: tuple[str, ...] = (),
                   refused: BaseException | None = None, key: str = "") -> str:
    """:func:`_task_body` once each rank's input is staged (``own_env``: the
    variables that say where). ``refused``: why this task's input will not
    do; when any task has such a reason, no rank runs anywhere."""
    from pyspark import BarrierTaskContext, cloudpickle

    from raydist.engine.ports import free_port
    from raydist.engine.spark.meeting import Chair, Seat, meeting_ports
    from raydist.train._fork import LOST, Ranks, fork_job, fork_unsafe, learn_imports, spawn_job

    ctx = BarrierTaskContext.get()
    task = ctx.partitionId()
    groups = task_ranks(ranks, per_task)
    mine = groups[task] if task < len(groups) else range(0)  # a task past the ranks: refused below
    infos = ctx.getTaskInfos()
    master, host = infos[0].address.rsplit(":", 1)[0], infos[task].address.rsplit(":", 1)[0]
    taken: set[int] = set()
    own_ports = [free_port(host, avoid=taken) for _ in mine] if peers_env is not None else []
    chair = Chair(master, key, len(infos), meeting_ports(key)) if task == 0 else None
    waits = False  # whether task 0, as it leaves the chair, waits for every task to say how its ranks ended
    with contextlib.ExitStack() as leaving:  # the seat first, then the chair
        if chair is not None:
            leaving.callback(lambda c=chair: c.close(wait=waits))  # waits: as it is then
        # What the tasks share before any rank starts: rank 0's port, each rank's own
        # where peers dial each other, and whether a task's input was refused.
        try:
            seat = Seat.join(master, [chair.port] if chair is not None else meeting_ports(key), key, task, {
                "master_port": str(free_port(master)) if task == 0 else "",
                "peers": [f"{host}:{p}" for p in own_ports], "refused": refused is not None})
        except OSError as exc:  # task 0 stops the others once it has waited for this one
            now = time.time()
            lost = [(rank, LOST, f"could not meet task 0 of its run at {master}: {exc}", now) for rank in mine]
            return base64.b64encode(cloudpickle.dumps((lost, {}))).decode()
        leaving.callback(seat.close)
        said = seat.everyone
        if any(one["refused"] for one in said):
            return _refusal(mine, refused, cloudpickle)
        port, peers = said[0]["master_port"], [address for one in said for address in one["peers"]]
        gpus = _task_gpus(ctx) if use_gpu else []
        own = dict(zip(mine, gpus, strict=False))  # each rank's own device, the first ones the task's ranks'
        placed = [Placed(f"task-{r // per_task}", (own[r],) if r in own else ()) for r in range(ranks)]
        layout = torchrun_layout(placed, use_gpu=use_gpu)
        # Spark reuses its Python workers, for the user's own Spark work too: one
        # that ran TensorFlow cannot be forked (the child inherits its runtime's
        # threads dead), so its ranks start as fresh interpreters instead.
        unsafe = fork_unsafe()
        if unsafe:
            print(f"[raydist: this Spark Python worker has imported {', '.join(unsafe)}, which a forked process "
                  "cannot use: ranks start as fresh interpreters]", file=sys.stderr, flush=True)
        else:
            for name in preload:  # once in the (reused) Python worker, not in every rank
                try:
                    importlib.import_module(name)
                except ImportError:
                    pass
        children, output = [], {}
        for rank in mine:
            rank_env = {**env, **own_env.get(rank, {}), **layout[rank], "MASTER_ADDR": master, "MASTER_PORT": port}
            if peers_env is not None:
                rank_env.update(peers_env(peers, rank))
            if use_gpu and not gpus:
                rank_env.pop("CUDA_VISIBLE_DEVICES", None)  # Spark gave the task no GPUs: the executor's own
            read_end, write_end = os.pipe()
            if unsafe:
                children.append(spawn_job(payload, rank_env, pickler="pyspark.cloudpickle", output_fd=write_end))
            else:
                children.append(fork_job(functools.partial(_unpickled, payload), rank_env, pickler=cloudpickle,
                                         output_fd=write_end))
            os.close(write_end)
            output[read_end] = _Output(rank, sender)
        ranks_here = Ranks(children, cloudpickle)
        waits = True
        try:
            # Until this task's ranks end, one fails, or task 0 says one failed elsewhere.
            while not ranks_here.done and not ranks_here.failed and not seat.stopped:
                watched = ranks_here.fds() + [fd for fd, o in output.items() if o.open] + [seat.fileno()]
                ready, _, _ = select.select(watched, [], [], 1.0)
                for fd in ready:
                    if fd in output:
                        output[fd].read(fd)
                if seat.fileno() in ready:
                    seat.read()
                ranks_here.read(ready)
            seat.say(ranks_here.done and not ranks_here.failed)
        finally:
            ranks_here.kill_rest()
            _drain(output)
    learn_imports(sorted(ranks_here.imported))
    late = time.time()  # a killed rank ended after every failure that killed it
    said = [(rank, *outcome, ranks_here.ended.get(index, late))
            for index, (rank, outcome) in enumerate(zip(mine, ranks_here.results(), strict=True))]
    said_out = {out.rank: out.text() for out in output.values()}
    return base64.b64encode(cloudpickle.dumps((said, said_out))).decode()


def _refusal(mine: range, refused: BaseException | None, pickler: Any) -> str:
    """What a task of a refused run says: its own reason as its ranks'
    error, or (the reason was another task's) its ranks cancelled."""
    import traceback

    from raydist.train._fork import CANCELLED, ERROR

    now = time.time()
    if refused is None:
        said = [(rank, CANCELLED, None, now) for rank in mine]
    else:
        text = "".join(traceback.format_exception(refused))
        said = [(rank, ERROR, pickler.dumps((refused, text)), now) for rank in mine]
    return base64.b64encode(pickler.dumps((said, {}))).decode()


def _drain(output: dict[int, _Output], within_s: float = 2.0) -> None:
    """Read what the ranks left in their pipes. Every rank has ended; a
    process a rank started may still hold its pipe open, so this reads for
    ``within_s`` at most, then closes what is left."""
    deadline = time.monotonic() + within_s
    while (open_fds := [fd for fd, out in output.items() if out.open]) and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            output[fd].read(fd)
    for fd, out in output.items():
        if out.open:
            out.open = False
            os.close(fd)


class _Output:
    """What one rank printed (stdout and stderr, as they came): sent to the
    driver as it comes where ``sender`` can, else kept, its last
    :data:`OUTPUT_LIMIT` bytes."""

    def __init__(self, rank: int, sender: OutputSender | None = None) -> None:
        self.rank = rank
        self.open = True
        self._sender = sender
        self._data = bytearray()
        self._dropped = 0

    def read(self, fd: int) -> None:
        chunk = os.read(fd, 65536)
        if not chunk:
            self.open = False
            os.close(fd)
            return
        if self._sender is not None and self._sender.send(self.rank, chunk):
            return
        self._data += chunk
        if len(self._data) > OUTPUT_LIMIT:
            cut = len(self._data) - OUTPUT_LIMIT
            self._dropped += cut
            del self._data[:cut]

    def text(self) -> str:
        head = f"[raydist: the first {self._dropped} bytes of rank {self.rank}'s output were dropped]\n"
        return (head if self._dropped else "") + self._data.decode(errors="replace")


def _unpickled(payload: bytes) -> Any:
    from pyspark import cloudpickle

    return cloudpickle.loads(payload)()


def _task_gpus(ctx: Any) -> list[str]:
    """The devices CUDA should see for this task's GPUs (Spark's addresses,
    mapped through an executor's own ``CUDA_VISIBLE_DEVICES``)."""
    from raydist.engine.sizing import visible_gpus

    resources = ctx.resources()
    addresses = list(resources["gpu"].addresses) if "gpu" in resources else []
    return visible_gpus(addresses, os.environ.get("CUDA_VISIBLE_DEVICES"))
