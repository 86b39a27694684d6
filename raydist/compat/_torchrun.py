"""Making a Ray Train worker look like a torchrun process.

Code written for pyspark's ``TorchDistributor`` runs under ``torchrun``: it
finds ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` in its environment and calls
``torch.distributed.init_process_group`` itself. Ray Train has already made
a process group, so a second ``init_process_group`` would fail: these helpers
agree on a fresh rendezvous port over Ray's group, then drop it, leaving the
worker exactly as torchrun would.
"""

from __future__ import annotations

import os
import socket


def as_torchrun_worker() -> dict[str, str]:
    """Set torchrun's environment in this Ray Train worker; returns it."""
    import ray.train
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    port = [0]
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port[0] = s.getsockname()[1]
    addr = [os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())]
    if dist.is_initialized():
        dist.broadcast_object_list(port, src=0)
        dist.broadcast_object_list(addr, src=0)
        dist.destroy_process_group()
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(ctx.get_world_size()),
        "LOCAL_RANK": str(ctx.get_local_rank()),
        "LOCAL_WORLD_SIZE": str(ctx.get_local_world_size()),
        "NODE_RANK": str(ctx.get_node_rank()),
        "MASTER_ADDR": str(addr[0]),
        "MASTER_PORT": str(port[0]),
    }
    os.environ.update(env)
    return env
