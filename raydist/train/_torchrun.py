"""A fresh Ray Train run whose workers look like torchrun's processes.

Code written for pyspark's ``TorchDistributor`` (and DeepSpeed's and
Horovod's launchers) runs under ``torchrun``: it finds ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its
environment, picks its device with ``LOCAL_RANK`` and calls
``torch.distributed.init_process_group`` itself. So the run makes no process
group of its own: a plain ``DataParallelTrainer`` (not Ray's
``TorchTrainer``, whose NCCL group on a GPU run would only be torn down
again, and fails outright where torch has no NCCL), each worker given its
layout by :mod:`raydist.train._layout` and a rendezvous agreed through Ray
Train's ``broadcast_from_rank_zero``. A run may hand each rank its own input
(:mod:`raydist.train._inputs`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from raydist.train._base import Facade
from raydist.train._inputs import RankInputs
from raydist.train._mlflow import carry_mark
from raydist.train.warm_run import TORCHRUN_PRIORITY_ENV

__all__ = ["TorchrunTrainer", "rendezvous"]


def rendezvous() -> dict[str, str]:
    """In a Ray Train worker: rank 0's address and a fresh port there, the
    same in every rank (``MASTER_ADDR``, ``MASTER_PORT``)."""
    import ray
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    from raydist.engine.ports import free_port

    mine = None
    if ray.train.get_context().get_world_rank() == 0:
        addr = ray.util.get_node_ip_address()
        mine = (addr, free_port(addr))
    addr, port = broadcast_from_rank_zero(mine)
    return {"MASTER_ADDR": str(addr), "MASTER_PORT": str(port)}


def _worker(job: Callable[[], Any]) -> Callable[[Any], Any]:
    def run(config: Any) -> Any:
        import ray.train

        from raydist.train._env import scoped_env
        from raydist.train._fork import keep_destroyed_groups
        from raydist.train._inputs import staged

        os.environ.update(rendezvous())
        try:
            import torch.distributed  # noqa: F401 - so the groups the job destroys stay referenced
        except ImportError:
            pass
        keep_destroyed_groups()  # this worker ends with the run; see raydist.train._fork
        with staged(config.get(_INPUTS), ray.train.get_context().get_world_rank()) as input_env:
            with scoped_env(input_env):
                return job()

    return carry_mark(run, job)  # a job that carries MLflow's context is not wrapped again


#: Where the run's config carries each rank's inputs.
_INPUTS = "raydist_inputs"


class TorchrunTrainer(Facade):
    """Run ``job()`` once in each of ``workers`` fresh Ray Train workers set
    up as torchrun's processes (see the module docstring); rank 0's value
    from :meth:`run`. ``resources_per_worker``: what each rank takes of its
    node (a GPU rank: one GPU and its share of its Spark task's CPUs).
    """

    def __init__(
        self,
        job: Callable[[], Any],
        *,
        workers: int,
        use_gpu: bool,
        resources_per_worker: dict[str, float],
        max_failures: int = 0,
        cluster: Any = None,
        keep_warm_s: float | None = None,
        inputs: RankInputs | None = None,
    ) -> None:
        from ray.train import FailureConfig, RunConfig

        self.inputs = inputs

        super().__init__(
            _worker(job),
            workers=workers,
            use_gpu=use_gpu,
            resources_per_worker=resources_per_worker,
            failure_config=FailureConfig(max_failures=max_failures),
            run_config=RunConfig(worker_runtime_env=TORCHRUN_PRIORITY_ENV),
            cluster=cluster,
            keep_warm_s=keep_warm_s,
        )

    def _loop_config(self) -> dict[str, Any]:
        # Called once connected: the inputs go into that cluster's object store.
        if self.inputs is None:
            return self.config
        return {**self.config, _INPUTS: self.inputs.put()}

    def _ray_trainer_class(self) -> Any:
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        return DataParallelTrainer

    def build_run_config(self) -> Any:
        from raydist.train._layout import layout_callback

        run = super().build_run_config()
        return dataclasses.replace(run, callbacks=[*(run.callbacks or []), layout_callback(self.use_gpu)])
