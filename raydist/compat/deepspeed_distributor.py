"""[Experimental] ``DeepspeedTorchDistributor`` with pyspark's signature, on Ray Train."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

from raydist.compat._torchrun import run_script
from raydist.compat.torch_distributor import TorchDistributor, _function_worker
from raydist.errors import ClusterFailedError, TrainingConfigError
from raydist.train.deepspeed import load_deepspeed_config

__all__ = ["DeepspeedTorchDistributor", "deepspeed_config"]

_CONFIG_ENV = "RAYDIST_DEEPSPEED_CONFIG"


def deepspeed_config() -> dict[str, Any] | None:
    """Inside a training function run by :class:`DeepspeedTorchDistributor`:
    the DeepSpeed config given to the distributor (None if there was none)."""
    text = os.environ.get(_CONFIG_ENV)
    return json.loads(text) if text else None


def _with_config(fn: Callable[[], Any], config: dict[str, Any] | None) -> Callable[[], Any]:
    def run() -> Any:
        if config is not None:
            os.environ[_CONFIG_ENV] = json.dumps(config)
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if not _has_cuda() else "cuda")
        return fn()

    return run


def _script_with_config(path: str, args: tuple[Any, ...], config: dict[str, Any] | None) -> Callable[[], None]:
    def run() -> None:
        extra: list[str] = []
        with tempfile.TemporaryDirectory(prefix="raydist-ds-") as tmp:
            if config is not None:
                conf_path = os.path.join(tmp, "deepspeed_config.json")
                with open(conf_path, "w") as f:
                    json.dump(config, f)
                # The flags Spark's distributor passes; the file is removed afterwards.
                extra = ["--deepspeed", "--deepspeed_config", conf_path]
            code = run_script(path, [str(a) for a in args] + extra)
        if code != 0:
            raise ClusterFailedError(f"training script {path} exited with code {code}")

    return run


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class DeepspeedTorchDistributor(TorchDistributor):
    """[Experimental] Drop-in for
    ``pyspark.ml.deepspeed.deepspeed_distributor.DeepspeedTorchDistributor``.

    Runs ``numGpus * nnodes`` Ray Train workers. Unlike Spark's class, the
    DeepSpeed config reaches a training *function* too:
    :func:`raydist.compat.deepspeed_config` returns it inside the function. A
    training *script* gets ``--deepspeed --deepspeed_config <file>`` as with
    Spark, and the file is removed when the script ends.

    Mapping of arguments to Ray:
        numGpus: processes per node (GPUs per node when ``useGpu``).
        nnodes: nodes; ``numGpus * nnodes`` workers in all.
        localMode: accepted; workers always run on the cluster's Ray nodes.
        useGpu: one GPU per worker (CUDA and NCCL), else CPU and gloo.
        deepspeedConfig: a dict or a JSON file path.

    Every run gets fresh worker processes: DeepSpeed keeps process-wide
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
        if isinstance(train_object, str):
            if not os.path.isfile(train_object):
                raise TrainingConfigError("train_object", train_object, "no such training script")
            return self._fit(_script_with_config(os.path.abspath(train_object), args, self.deepspeed_config))
        if not callable(train_object):
            raise TrainingConfigError("train_object", train_object, "expected a function or a script path")
        return self._fit(_with_config(_function_worker(train_object, args, kwargs), self.deepspeed_config))
