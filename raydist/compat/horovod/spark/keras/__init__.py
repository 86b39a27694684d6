"""[Experimental] ``horovod.spark.keras``: Horovod's Spark Estimator for Keras
models, trained on raydist, with nothing to compile.

``KerasEstimator(...).fit(df)`` trains ``model`` on ``num_proc`` ranks and
returns a :class:`KerasModel`, a Spark ML ``Model`` whose ``transform(df)``
adds one prediction column per label (``<label>__output`` unless
``setOutputCols`` says otherwise). Horovod's training semantics are kept
(see :mod:`._remote`), and the model trains under the Keras it was built
with (Keras 3 here by default; Keras 2 through ``tf_keras``). As with
:mod:`raydist.compat.horovod.spark.torch`, each rank gets its rows through
raydist's ``TorchDistributor`` (Arrow through Ray's object store, on the warm
session cluster), not Parquet and Petastorm, so the Store holds only
checkpoints (``runs/<run_id>/checkpoint.pkl``, the model pickled) and logs,
and it runs from a Spark Connect client too.

Feature columns are reshaped to the model's inputs (``model.inputs``), as
Horovod does; ``label_shapes`` shapes the labels (default: as they stack, a
scalar label as a column where the output is one). Parameters Horovod uses
only for Petastorm (``shuffle_buffer_size``, ``partitions_per_process``,
readers, ``inmemory_cache_all``) are taken and have nothing to tune;
``gradient_compression`` other than none and ``checkpoint_callback`` are
refused naming the parameter.
"""

from __future__ import annotations

import pickle
import time
from typing import Any, ClassVar

from raydist.compat.horovod.spark.common import _fit
from raydist.compat.horovod.spark.common._params import HorovodParams
from raydist.errors import TrainingConfigError

try:  # Spark ML's base classes: the estimator and its model fit into Pipelines
    from pyspark.ml import Estimator as _Estimator
    from pyspark.ml import Model as _Model
except ImportError:  # pragma: no cover - pyspark is a dependency of raydist
    _Estimator = _Model = object  # type: ignore[misc,assignment]

__all__ = ["KerasEstimator", "KerasModel"]

_CHECKPOINT = "checkpoint.pkl"

_ESTIMATOR_DEFAULTS: dict[str, Any] = {
    "num_proc": None, "model": None, "backend": None, "store": None, "custom_objects": None, "optimizer": None,
    "loss": None, "loss_weights": None, "sample_weight_col": None, "gradient_compression": None, "metrics": None,
    "feature_cols": None, "label_cols": None, "validation": None, "callbacks": None, "batch_size": 32,
    "val_batch_size": None, "epochs": 1, "verbose": 1, "random_seed": None, "shuffle_buffer_size": None,
    "partitions_per_process": None, "run_id": None, "train_minibatch_fn": None, "train_steps_per_epoch": None,
    "validation_steps_per_epoch": None, "transformation_fn": None, "train_reader_num_workers": None,
    "val_reader_num_workers": None, "reader_pool_type": "thread", "label_shapes": None,
    "checkpoint_callback": None, "inmemory_cache_all": False, "backward_passes_per_step": 1, "use_gpu": True,
    "mp_start_method": None, "shuffle": True,
}


def _is_legacy(model: Any) -> bool:
    """Whether ``model`` was built with Keras 2 (``tf_keras``) rather than Keras 3."""
    return type(model).__module__.startswith("tf_keras")


def _input_shapes(model: Any) -> list[list[int]]:
    """The model's inputs' shapes, the batch dimension as -1."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise TrainingConfigError("model", type(model).__name__, "give a built model (start it with keras.Input, "
                                                                 "or call model.build): its inputs shape the features")
    return [[-1, *[int(d) for d in tuple(i.shape)[1:]]] for i in inputs]


class KerasEstimator(HorovodParams, _Estimator):  # type: ignore[misc,valid-type]
    """Horovod's ``KerasEstimator``: the same keyword parameters, getters and
    setters (``getEpochs``, ``setBatchSize``...), ``fit(df)`` returning a
    :class:`KerasModel`, ``fit_on_parquet()``, save and load."""

    _defaults: ClassVar[dict[str, Any]] = _ESTIMATOR_DEFAULTS

    def _num_proc(self) -> int:
        from raydist.compat.horovod.spark.torch import TorchEstimator

        return TorchEstimator._num_proc(self)  # type: ignore[arg-type]  # the same rule, the same messages

    def _check(self) -> None:
        self._check_given("model", "optimizer", "loss", "feature_cols", "label_cols")
        self._check_whole("batch_size", "epochs", "backward_passes_per_step")
        if self.getGradientCompression() is not None:
            raise TrainingConfigError("gradient_compression", self.getGradientCompression(),
                                      "gradients travel uncompressed here: leave it out")
        if self.getCheckpointCallback() is not None:
            raise TrainingConfigError("checkpoint_callback", self.getCheckpointCallback(),
                                      f"rank 0 checkpoints every epoch to the Store's runs/<run_id>/{_CHECKPOINT}: "
                                      "leave it out")
        if self.getTrainMinibatchFn() is not None:
            raise TrainingConfigError("train_minibatch_fn", self.getTrainMinibatchFn(),
                                      "a Keras model trains with model.fit: leave it out")
        if _is_legacy(self.getModel()) and self.getBackwardPassesPerStep() != 1:
            raise TrainingConfigError("backward_passes_per_step", self.getBackwardPassesPerStep(),
                                      "1 for a Keras 2 (tf_keras) model; Keras 3 models take more")
        self._check_one_shape_each("label_shapes", "label_cols", "label")

    def _fit(self, df: Any) -> KerasModel:
        return self._fit_prepared(df, run_id=self.getRunId() or f"keras_{int(time.time())}")

    def fit_on_parquet(self, params: Any = None, dataset_idx: Any = None) -> KerasModel:
        """Fit on the Parquet already in the Store, as Horovod's does."""
        from raydist.compat.horovod.spark.torch import TorchEstimator

        return TorchEstimator.fit_on_parquet(self, params, dataset_idx)  # type: ignore[arg-type]

    def _fit_prepared(self, df: Any, run_id: str) -> KerasModel:
        from raydist.compat.horovod.spark.keras._remote import train_rank

        spec, num_proc = self._rank_spec(run_id)
        history, model = _fit.train_ranks(self, df, train_rank, spec, num_proc)
        with _keras_of(self.getModel()).utils.custom_object_scope(dict(self.getCustomObjects() or {})):
            trained = pickle.loads(model)
        return KerasModel(history=history, model=trained, feature_columns=spec.feature_cols,
                          label_columns=spec.label_cols, custom_objects=self.getCustomObjects(), run_id=run_id,
                          _metadata={"types": _fit.label_types(df, spec.label_cols)})

    def _rank_spec(self, run_id: str) -> tuple[Any, int]:
        from raydist.compat.horovod.spark.keras._remote import KerasRankSpec

        self._check()
        num_proc = self._num_proc()
        model, optimizer = self.getModel(), self.getOptimizer()
        legacy = _is_legacy(model)
        keras = _keras_of(model)
        label_cols = list(self.getLabelCols())
        label_shapes = self.getLabelShapes()
        if label_shapes is None:  # a scalar label as a column where the model's output is one
            outputs = [tuple(o.shape) for o in getattr(model, "outputs", None) or []]
            label_shapes = [[-1, 1] if len(s) == 2 and s[1] == 1 else None for s in outputs] \
                if len(outputs) == len(label_cols) else [None] * len(label_cols)
        store = self.getStore()
        checkpoint, resume = _fit.kept_checkpoint(store, run_id, _CHECKPOINT, self.getVerbose())
        logs = store.get_logs_path(run_id) if store is not None else None
        spec = KerasRankSpec(
            model=pickle.dumps(model), legacy=legacy,
            optimizer=keras.optimizers.serialize(optimizer if not isinstance(optimizer, str)
                                                 else keras.optimizers.get(optimizer)),
            loss=self.getLoss(), loss_weights=self.getLossWeights(), metrics=self.getMetrics(),
            custom_objects=dict(self.getCustomObjects() or {}), callbacks=list(self.getCallbacks() or []),
            **_fit.rank_data(self, _input_shapes(model)),
            label_shapes=[None if s is None else list(s) for s in label_shapes],
            backward_passes_per_step=self.getBackwardPassesPerStep(),
            transformation_fn=self.getTransformationFn(), checkpoint_file=checkpoint, logs_dir=logs,
            store=store, resume=resume,
        )
        return spec, num_proc


def _keras_of(model: Any) -> Any:
    if _is_legacy(model):
        import tf_keras

        return tf_keras
    import keras

    return keras


class KerasModel(HorovodParams, _Model):  # type: ignore[misc,valid-type]
    """Horovod's ``KerasModel``: ``transform(df)`` adds one prediction column
    per label; ``getModel()``, ``getHistory()`` (Keras's history: each
    metric's value per epoch, averaged over the ranks), ``setOutputCols``,
    save and load."""

    _defaults: ClassVar[dict[str, Any]] = {
        "history": None, "model": None, "feature_columns": None, "label_columns": None, "custom_objects": None,
        "run_id": None, "_metadata": None, "output_cols": None,
    }
    _aliases: ClassVar[dict[str, str]] = {"FeatureCols": "feature_columns", "LabelCols": "label_columns"}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._name_outputs()

    def _transform(self, df: Any) -> Any:
        from raydist.compat.horovod.spark.common._predict import add_predictions
        from raydist.compat.horovod.spark.keras._remote import predict_rows

        model = self.getModel()
        return add_predictions(df, model=model, run=predict_rows, feature_cols=list(self.getFeatureColumns()),
                               input_shapes=_input_shapes(model), label_cols=list(self.getLabelColumns()),
                               output_cols=list(self.getOutputCols()),
                               label_types=(self.getMetadata() or {}).get("types", {}))

    def getMetadata(self) -> Any:  # noqa: N802 - Horovod's name
        return self._hvd_params["_metadata"]
