"""[Experimental] ``horovod.spark.lightning``: Horovod's Spark Estimator for
PyTorch Lightning models, trained on raydist, with nothing to compile.

``TorchEstimator(model=<LightningModule>, ...).fit(df)`` runs a Lightning
``Trainer`` on ``num_proc`` ranks (DDP over the job's process group, see
:mod:`._remote`) and returns a :class:`TorchModel` whose ``transform(df)``
adds one prediction column per label, as :mod:`raydist.compat.horovod.spark.torch`'s.
``training_step`` gets Horovod's batches: a dict of tensors keyed by column
name. Rows reach each rank as the other estimators' do (Arrow through Ray's
object store, no Parquet), from classic and Connect sessions alike.

Horovod's own rules for a ``LightningModule`` hold: ``optimizer``, ``loss``
and ``loss_weights`` are refused (``configure_optimizers`` and
``training_step`` say them). Also refused, naming the parameter: a plain
``torch.nn.Module`` (Horovod's legacy path: use
``horovod.spark.torch.TorchEstimator``), ``data_module`` (rows come from the
DataFrame), ``terminate_on_nan`` (gone from Lightning 2; a callback does it),
``gradient_compression``. ``trainer_args`` override what the estimator gives
the ``Trainer``; ``logger``, ``profiler``, ``callbacks`` and
``log_every_n_steps`` pass through.
"""

from __future__ import annotations

import copy
import io
import time
from typing import Any, ClassVar

from raydist.compat.horovod.spark.common import _fit
from raydist.compat.horovod.spark.common._params import HorovodParams
from raydist.compat.horovod.spark.torch import _ESTIMATOR_DEFAULTS as _TORCH_DEFAULTS
from raydist.compat.horovod.spark.torch import TorchModel as _TorchModel
from raydist.errors import TrainingConfigError

try:  # Spark ML's base class: the estimator fits into Pipelines
    from pyspark.ml import Estimator as _Estimator
except ImportError:  # pragma: no cover - pyspark is a dependency of raydist
    _Estimator = object  # type: ignore[misc,assignment]

__all__ = ["TorchEstimator", "TorchModel"]

_CHECKPOINT = "checkpoint.ckpt"

#: Horovod's Lightning parameters: the PyTorch estimator's (but its
#: backward_passes_per_step: Lightning's accumulate_grad_batches, in trainer_args), and Lightning's own.
_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in _TORCH_DEFAULTS.items() if k != "backward_passes_per_step"},
    "reader_pool_type": None, "transformation_edit_fields": None, "transformation_removed_fields": None,
    "trainer_args": None, "num_gpus": None, "logger": None, "log_every_n_steps": 50, "data_module": None,
    "loader_num_epochs": None, "terminate_on_nan": False, "profiler": None, "debug_data_loader": False,
    "train_async_data_loader_queue_size": None, "val_async_data_loader_queue_size": None,
}


class TorchModel(_TorchModel):
    """Horovod's Lightning ``TorchModel``: the trained ``LightningModule``
    (``getModel()``), ``getHistory()`` (the metrics it logged last),
    ``transform``, ``setOutputCols``, save and load."""


class TorchEstimator(HorovodParams, _Estimator):  # type: ignore[misc,valid-type]
    """Horovod's Lightning ``TorchEstimator``: the same keyword parameters,
    getters and setters, ``fit(df)`` returning a :class:`TorchModel`, save and load."""

    _defaults: ClassVar[dict[str, Any]] = _DEFAULTS
    _one_loss: ClassVar[bool] = True

    def _num_proc(self) -> int:
        from raydist.compat.horovod.spark.torch import TorchEstimator as _Torch

        return _Torch._num_proc(self)  # type: ignore[arg-type]  # the same rule, the same messages

    def _check(self) -> None:
        import pytorch_lightning as pl

        self._check_given("model", "feature_cols", "label_cols")
        if not isinstance(self.getModel(), pl.LightningModule):
            raise TrainingConfigError("model", type(self.getModel()).__name__,
                                      "give a pytorch_lightning.LightningModule here; a plain torch.nn.Module "
                                      "trains with horovod.spark.torch.TorchEstimator")
        # Horovod's own rules for a LightningModule, with its messages.
        if self.getOptimizer():
            raise ValueError("Parameter `optimizer` cannot be specified with a `LightningModule`. "
                             "Implement `LightningModule.configure_optimizers` instead.")
        if self.getLoss():
            raise ValueError("Parameter `loss` cannot be specified with a `LightningModule`. "
                             "Implement `LightningModule.train_step` instead.")
        if self.getLossWeights():
            raise ValueError("Parameter `loss_weights` cannot be specified with a `LightningModule`. "
                             "Implement `LightningModule.train_step` instead.")
        for name, why in (("data_module", "the rows come from the DataFrame fit is given"),
                          ("gradient_compression", "gradients travel uncompressed here"),
                          ("train_minibatch_fn", "a LightningModule's training_step is its minibatch")):
            if self._hvd_params[name] is not None:
                raise TrainingConfigError(name, self._hvd_params[name], f"{why}: leave it out")
        if self.getTerminateOnNan():
            raise TrainingConfigError("terminate_on_nan", True, "Lightning 2 has no such switch: stop on NaN with "
                                                                "a callback (EarlyStopping(check_finite=True))")
        self._check_whole("batch_size", "epochs")
        self._check_one_shape_each("input_shapes", "feature_cols", "feature")

    def _fit(self, df: Any) -> TorchModel:
        from raydist.compat.horovod.spark.lightning._remote import LightningRankSpec, train_rank

        self._check()
        num_proc = self._num_proc()
        run_id = self.getRunId() or f"pytorch_{int(time.time())}"
        store = self.getStore()
        checkpoint, resume = _fit.kept_checkpoint(store, run_id, _CHECKPOINT, self.getVerbose())
        feature_cols, label_cols = list(self.getFeatureCols()), list(self.getLabelCols())
        spec = LightningRankSpec(
            model=self.getModel(), **_fit.rank_data(self),
            callbacks=list(self.getCallbacks() or []), logger=self.getLogger(),
            log_every_n_steps=self.getLogEveryNSteps(), profiler=self.getProfiler(),
            trainer_args=dict(self.getTrainerArgs() or {}), transformation_fn=self.getTransformationFn(),
            checkpoint_file=checkpoint, store=store, resume=resume,
        )
        history, weights = _fit.train_ranks(self, df, train_rank, spec, num_proc)
        import torch

        trained = copy.deepcopy(self.getModel())
        trained.load_state_dict(torch.load(io.BytesIO(weights)))
        trained.eval()
        return TorchModel(history=history, model=trained, feature_columns=feature_cols,
                          input_shapes=self.getInputShapes(), label_columns=label_cols, run_id=run_id,
                          _metadata={"types": _fit.label_types(df, label_cols)})
