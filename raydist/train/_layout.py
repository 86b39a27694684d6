"""Each rank's devices and local rank, as Spark's distributors hand them out.

pyspark runs one ``torchrun`` per Spark task, with that task's GPUs in
``CUDA_VISIBLE_DEVICES``: the ranks of one task share its devices, and
``LOCAL_RANK`` (0 .. the task's GPU count - 1) indexes them, so
``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` picks the rank's own
device and no two ranks pick the same one.

raydist runs one Ray node per Spark task, so the ranks that share a task's
GPUs are exactly the ranks on one Ray node. Ray Train counts local ranks per
host *IP* instead, which on a host with several executors, or one executor
with several GPU tasks, hands rank 1 ``LOCAL_RANK=1`` beside a single visible
device. :func:`torchrun_layout` says what each rank gets, by Ray node; it is
pure, and :func:`layout_callback` applies it to a Ray Train worker group
before the training function runs (on every start and restart of the group).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Placed", "torchrun_layout", "layout_callback", "LAYOUT_KEYS"]

#: What :func:`torchrun_layout` sets in each rank (besides CUDA_VISIBLE_DEVICES).
LAYOUT_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
               "GROUP_WORLD_SIZE")


@dataclass(frozen=True)
class Placed:
    """One worker as Ray placed it: its Ray node and the GPU ids Ray gave it."""

    node: str
    gpus: tuple[str, ...] = ()


def _device_order(gpu: str) -> tuple[int, int | str]:
    return (0, int(gpu)) if gpu.isdigit() else (1, gpu)


def torchrun_layout(workers: Sequence[Placed], *, use_gpu: bool) -> list[dict[str, str]]:
    """The torchrun environment of each worker, in world-rank order.

    Workers on one Ray node form one "torchrun node" (a Spark task): they
    share one ``CUDA_VISIBLE_DEVICES`` (every GPU Ray gave any of them, each
    worker's own first, in rank order, so ``LOCAL_RANK`` indexes its own
    device), ``LOCAL_RANK`` counts them in rank order and ``NODE_RANK`` numbers
    the nodes in the order their first rank comes. A CPU run gets
    ``CUDA_VISIBLE_DEVICES=""``, as under pyspark.
    """
    nodes: dict[str, list[int]] = {}
    for rank, worker in enumerate(workers):
        nodes.setdefault(worker.node, []).append(rank)
    envs: list[dict[str, str]] = [{} for _ in workers]
    for node_rank, ranks in enumerate(nodes.values()):
        owned = [workers[r].gpus for r in ranks]
        devices: list[str] = [gpus[0] for gpus in owned if gpus]
        rest = {g for gpus in owned for g in gpus} - set(devices)
        devices += sorted(rest, key=_device_order)
        for local_rank, rank in enumerate(ranks):
            envs[rank] = {
                "RANK": str(rank),
                "WORLD_SIZE": str(len(workers)),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(len(ranks)),
                "NODE_RANK": str(node_rank),
                "GROUP_RANK": str(node_rank),
                "GROUP_WORLD_SIZE": str(len(nodes)),
                "CUDA_VISIBLE_DEVICES": ",".join(devices) if use_gpu else "",
            }
    return envs


def _set_env(env: dict[str, str]) -> None:
    os.environ.update(env)


def layout_callback(use_gpu: bool) -> Any:
    """A Ray Train worker-group callback that gives each worker its
    :func:`torchrun_layout` environment before the train context (and so the
    training function) starts, on every start of the group."""
    import ray
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback

    class TorchrunLayout(WorkerGroupCallback):
        def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
            placed = [Placed(w.metadata.node_id, tuple(str(g) for g in w.metadata.gpu_ids)) for w in workers]
            envs = torchrun_layout(placed, use_gpu=use_gpu)
            ray.get([w.execute_async(_set_env, env) for w, env in zip(workers, envs, strict=True)])
            return {}

    return TorchrunLayout()

