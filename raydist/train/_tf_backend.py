"""``TF_CONFIG`` for TensorFlow training workers, without TensorFlow anywhere else.

Ray Train's own ``TensorflowConfig`` lives in ``ray.train.tensorflow``, whose
package ``__init__`` imports TensorFlow. Ray Train unpickles the backend
config in its TrainController actor, a fresh process each run, so every
TensorFlow run paid a TensorFlow import (8-10 s on a 2-core host) in a process
that never touches a tensor, and the driver paid one more. This config does
the same job (each worker's ``host:port``, then ``TF_CONFIG`` naming them all
and this worker's index, so ``MultiWorkerMirroredStrategy()`` spans them) from
a module that imports nothing of TensorFlow: only the workers load it, when
the user's function does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig

__all__ = ["TfConfig", "worker_address", "set_tf_config"]


def worker_address() -> str:
    """This worker's ``host:port`` for TensorFlow's collective ops: the node's
    address and a port free on it now, outside Ray's worker ports, as every
    port raydist picks (TensorFlow binds it moments later)."""
    import ray.util

    from raydist.engine.ports import free_port

    host = ray.util.get_node_ip_address()
    return f"{host}:{free_port(host)}"


def set_tf_config(addresses: list[str], index: int) -> None:
    """``TF_CONFIG`` of worker ``index`` among ``addresses`` (read by the
    strategy when the user's function builds it)."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": list(addresses)},
                                          "task": {"type": "worker", "index": index}})


class _TfBackend(Backend):
    def on_start(self, worker_group: Any, backend_config: TfConfig) -> None:
        import ray

        addresses = worker_group.execute(worker_address)
        ray.get([worker_group.execute_single_async(index, set_tf_config, addresses, index)
                 for index in range(len(worker_group))])


@dataclass
class TfConfig(BackendConfig):
    """Ray Train backend config for TensorFlow multi-worker training; what
    ``ray.train.tensorflow.TensorflowConfig`` does, importable without TensorFlow."""

    @property
    def backend_cls(self) -> type[Backend]:
        return _TfBackend

    @property
    def framework(self) -> Any:
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TENSORFLOW
