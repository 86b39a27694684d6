"""[Experimental] ``DeepspeedTorchDistributor`` with pyspark's signature, on Ray Train."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from raydist.compat._jobs import DEEPSPEED_CONFIG_ENV, with_deepspeed_args
from raydist.compat.torch_distributor import TorchDistributor
from raydist.errors import TrainingConfigError
from raydist.train.deepspeed import load_deepspeed_config

__all__ = ["DeepspeedTorchDistributor", "deepspeed_config"]


def deepspeed_config() -> dict[str, Any] | None:
    """Inside a training function run by :class:`DeepspeedTorchDistributor`:
    the DeepSpeed config given to the distributor (None if there was none).
    A convenience: Spark's way, ``--deepspeed_config`` in ``sys.argv``, works
    too."""
    text = os.environ.get(DEEPSPEED_CONFIG_ENV)
    return json.loads(text) if text else None


class DeepspeedTorchDistributor(TorchDistributor):
    """[Experimental] Drop-in for
    ``pyspark.ml.deepspeed.deepspeed_distributor.DeepspeedTorchDistributor``.

    Runs ``numGpus * nnodes`` processes. As under Spark, every process, for
    a training function as for a script, sees ``--deepspeed
    --deepspeed_config <file>`` at the end of ``sys.argv`` (``--deepspeed``
    alone without a config), so code that calls
    ``deepspeed.add_config_arguments(parser)`` and
    ``deepspeed.initialize(args=args, ...)`` runs unchanged. The file holds
    the config given and is removed when the process's job ends.

    Mapping of arguments:
        numGpus: processes per node (GPUs per node when ``useGpu``).
        nnodes: nodes; ``numGpus * nnodes`` processes in all.
        localMode: as for :class:`TorchDistributor`: True runs the processes
            on this machine, False on Ray Train workers.
        useGpu: one GPU per process (CUDA and NCCL), else CPU and gloo
            (``DS_ACCELERATOR`` is set accordingly unless already set).
        deepspeedConfig: a dict or a JSON file path.

    Runs on Ray get fresh worker processes: DeepSpeed keeps process-wide
    state (its communication backend, accelerator) that a later run in the
    same process would inherit.
    """

    _warm_capable = False

    def __init__(
        self,
        numGpus: int = 1,  # noqa: N803 - Spark's own argument name
        nnodes: int = 1,
        localMode: bool = True,  # noqa: N803 - Spark's own argument name
        useGpu: bool = True,  # noqa: N803 - Spark's own argument name
        deepspeedConfig: dict[str, Any] | str | None = None,  # noqa: N803 - Spark's own argument name
        *,
        cluster: Any = None,
        max_failures: int = 0,
    ) -> None:
        for field, value in (("numGpus", numGpus), ("nnodes", nnodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrainingConfigError(field, value, "expected a whole number of at least 1")
        super().__init__(
            num_processes=numGpus * nnodes,
            local_mode=localMode,
            use_gpu=useGpu,
            cluster=cluster,
            max_failures=max_failures,
        )
        self.num_gpus = numGpus
        self.nnodes = nnodes
        self.deepspeed_config = None if deepspeedConfig is None else load_deepspeed_config(deepspeedConfig)

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        job = self._job(train_object, args, kwargs)  # checks the input as TorchDistributor.run does
        return self._fit(with_deepspeed_args(job, self.deepspeed_config, self.use_gpu))
