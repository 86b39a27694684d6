"""[Experimental] ``pyspark.ml.connect.classification`` on raydist.

``LogisticRegression`` is pyspark's estimator fitted through raydist's
``TorchDistributor`` (see :mod:`raydist.compat.ml.connect`).
``LogisticRegressionModel`` is pyspark's model, with one fix: it loads what
it saved under torch >= 2.6, whose ``torch.load`` refuses a whole module by
default (pyspark's own ``loadFromLocal`` fails there with
``UnpicklingError: Weights only load failed``).
"""

from __future__ import annotations

import types
from typing import Any

from pyspark.ml.connect import classification as _theirs

from raydist.compat.torch_distributor import TorchDistributor

__all__ = ["LogisticRegression", "LogisticRegressionModel"]


class LogisticRegressionModel(_theirs.LogisticRegressionModel):
    """pyspark's ``LogisticRegressionModel``: the same columns, predictions
    and files; it also loads them under torch's weights-only loading."""

    def _load_core_model(self, path: str) -> None:
        import torch

        # What _save_core_model writes, and nothing else, may be rebuilt:
        # weights-only loading stays on for every other class.
        with torch.serialization.safe_globals([torch.nn.Sequential, torch.nn.Linear, torch.nn.Softmax]):
            saved = torch.load(path)
        self.torch_model = saved[0]


def _on_raydist(fit: Any) -> Any:
    """pyspark's own ``_fit``, with the module names it looks up when it runs
    seen through raydist's (``TorchDistributor``, ``LogisticRegressionModel``):
    the same checks, the same training function and the same model built from
    rank 0's weights. A copy of pyspark's method would drift from it;
    changing pyspark's module would change pyspark's own estimator too."""
    names = {**vars(_theirs), "TorchDistributor": TorchDistributor, "LogisticRegressionModel": LogisticRegressionModel}
    return types.FunctionType(fit.__code__, names, fit.__name__, fit.__defaults__, fit.__closure__)


class LogisticRegression(_theirs.LogisticRegression):
    """pyspark's ``pyspark.ml.connect.classification.LogisticRegression``
    (the same parameters, defaults, checks and model), trained through
    raydist's ``TorchDistributor``: the ``numTrainWorkers`` ranks in Spark's
    tasks over the DataFrame's own partitions while the session cluster is
    not warm, as pyspark's are; on its warm workers once it is, each
    partition through Ray's object store."""

    _fit = _on_raydist(_theirs.LogisticRegression._fit)
