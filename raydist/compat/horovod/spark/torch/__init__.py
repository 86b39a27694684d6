"""[Experimental] ``horovod.spark.torch``: Horovod's Spark Estimator for
PyTorch models, trained on raydist, with nothing to compile.

``TorchEstimator(...).fit(df)`` trains ``model`` on ``num_proc`` ranks and
returns a :class:`TorchModel`, a Spark ML ``Model`` whose ``transform(df)``
adds one prediction column per label (``<label>__output`` unless
``setOutputCols`` says otherwise). Horovod's training semantics are kept
(see :mod:`._remote`). What differs is the path of the data: Horovod writes
the DataFrame to Parquet under the Store and reads it back with Petastorm;
here each rank gets its rows through raydist's ``TorchDistributor`` (Arrow
through Ray's object store, on the warm session cluster), so the Store holds
only checkpoints and logs. That also runs from a Spark Connect client, where
Horovod's cannot (it needs ``df.rdd``).

Parameters Horovod uses only for Petastorm (``shuffle_buffer_size``,
``partitions_per_process``, readers, ``inmemory_cache_all``) are taken and
have nothing to tune; ``gradient_compression`` is ``hvd.Compression``'s.
``transformation_fn`` gets the rank's rows as one pandas DataFrame and
returns it changed (Petastorm's ``TransformSpec`` function, applied once).
``loss_constructors`` are called with no arguments. ``callbacks`` are
Keras's: a ``TorchEstimator`` given any is refused.
"""

from __future__ import annotations

import copy
import io
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

__all__ = ["TorchEstimator", "TorchModel"]

_ESTIMATOR_DEFAULTS: dict[str, Any] = {
    "num_proc": None, "model": None, "backend": None, "store": None, "optimizer": None, "loss": None,
    "loss_constructors": None, "metrics": None, "loss_weights": None, "sample_weight_col": None,
    "gradient_compression": None, "feature_cols": None, "input_shapes": None, "validation": None,
    "label_cols": None, "callbacks": None, "batch_size": 32, "val_batch_size": None, "epochs": 1, "verbose": 1,
    "random_seed": None, "shuffle_buffer_size": None, "shuffle": True, "partitions_per_process": None,
    "run_id": None, "train_minibatch_fn": None, "train_steps_per_epoch": None, "validation_steps_per_epoch": None,
    "transformation_fn": None, "train_reader_num_workers": None, "val_reader_num_workers": None,
    "reader_pool_type": "thread", "label_shapes": None, "inmemory_cache_all": False, "use_gpu": True,
    "mp_start_method": None, "backward_passes_per_step": 1,
}


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _metric_groups(metrics: Any) -> list[list[Any]]:
    """Horovod's metric groups: one function for every output, or one per output."""
    if metrics is None:
        return []
    groups = []
    for entry in _as_list(metrics):
        group = _as_list(entry)
        if not all(callable(fn) for fn in group):
            raise TrainingConfigError("metrics", metrics, "expected functions (output, label) -> tensor, "
                                                          "or lists of them (one per output)")
        groups.append(group)
    return groups


class TorchEstimator(HorovodParams, _Estimator):  # type: ignore[misc,valid-type]
    """Horovod's ``TorchEstimator``: the same keyword parameters, getters and
    setters (``getEpochs``, ``setBatchSize``...), ``fit(df)`` returning a
    :class:`TorchModel`, ``fit_on_parquet()``, save and load."""

    _defaults: ClassVar[dict[str, Any]] = _ESTIMATOR_DEFAULTS
    _one_loss: ClassVar[bool] = True

    # what fit checks ------------------------------------------------------------

    def _num_proc(self) -> int:
        backend, num_proc = self.getBackend(), self.getNumProc()
        if backend is not None and num_proc is not None:
            raise TrainingConfigError("num_proc", num_proc, "give num_proc or a backend, not both (as in Horovod)")
        if backend is not None:
            return int(backend.num_processes())
        if num_proc is None:
            from raydist.compat.horovod.spark import _default_parallelism

            return _default_parallelism()
        if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
            raise TrainingConfigError("num_proc", num_proc, "expected a whole number of at least 1")
        return num_proc

    def _check(self) -> None:
        self._check_given("model", "optimizer", "feature_cols", "label_cols")
        if self.getLoss() is None and self.getLossConstructors() is None:
            raise TrainingConfigError("loss", None, "give loss (a function or a list, one per label) "
                                                    "or loss_constructors")
        if self.getCallbacks():
            raise TrainingConfigError("callbacks", self.getCallbacks(), "callbacks are Keras's; "
                                                                        "a TorchEstimator takes none")
        self._check_whole("batch_size", "epochs", "backward_passes_per_step")
        self._check_one_shape_each("input_shapes", "feature_cols", "feature")

    # fitting ------------------------------------------------------------------------

    def _fit(self, df: Any) -> TorchModel:
        return self._fit_prepared(df, run_id=self.getRunId() or f"pytorch_{int(time.time())}")

    def fit_on_parquet(self, params: Any = None, dataset_idx: Any = None) -> TorchModel:
        """Fit on the Parquet already in the Store (``get_train_data_path(dataset_idx)``,
        and its validation path where one exists), as Horovod's does."""
        from pyspark.sql import SparkSession

        store = self.getStore()
        if store is None:
            raise TrainingConfigError("store", None, "fit_on_parquet reads the Store's Parquet: give a store")
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise TrainingConfigError("spark", None, "fit_on_parquet needs an active SparkSession")
        train = spark.read.parquet(store.get_train_data_path(dataset_idx))
        if store.exists(store.get_val_data_path(dataset_idx)):
            from pyspark.sql import functions as F

            val = spark.read.parquet(store.get_val_data_path(dataset_idx))
            marker = "__raydist_parquet_validation"
            train = train.withColumn(marker, F.lit(False)).unionByName(val.withColumn(marker, F.lit(True)))
            estimator = self.copy_with(validation=marker)
        else:
            estimator = self
        if params:
            estimator = estimator.copy_with(**params)
        return estimator._fit(train)  # type: ignore[attr-defined]

    def _fit_prepared(self, df: Any, run_id: str) -> TorchModel:
        from raydist.compat.horovod.spark.torch._remote import train_rank

        spec, num_proc = self._rank_spec(df, run_id)
        history, model_state, optimizer_state = _fit.train_ranks(self, df, train_rank, spec, num_proc)
        return self._model_of(df, spec, run_id, history, model_state, optimizer_state)

    def _rank_spec(self, df: Any, run_id: str) -> tuple[Any, int]:
        """What every rank runs with, after the checks; and how many ranks."""
        from raydist.compat.horovod.spark.torch._remote import RankSpec

        self._check()
        num_proc = self._num_proc()
        label_cols = list(self.getLabelCols())
        store = self.getStore()
        checkpoint, kept = _fit.kept_checkpoint(store, run_id, store.get_checkpoint_filename() if store else "",
                                                self.getVerbose())
        logs = store.get_logs_path(run_id) if store is not None else None
        resume = None
        if kept is not None:
            import torch

            resume = torch.load(io.BytesIO(kept), weights_only=False)
        optimizer = self.getOptimizer()
        losses = None if self.getLoss() is None else _as_list(self.getLoss())
        if losses is None:
            losses = [make() for make in _as_list(self.getLossConstructors())]
        weights = self.getLossWeights() or [1.0 / len(label_cols)] * len(label_cols)
        spec = RankSpec(
            model=self.getModel(), optimizer_cls=type(optimizer),
            optimizer_state=copy.deepcopy(optimizer.state_dict()),
            loss_fns=losses, loss_weights=list(weights), metric_groups=_metric_groups(self.getMetrics()),
            **_fit.rank_data(self),
            backward_passes_per_step=self.getBackwardPassesPerStep(), compression=self.getGradientCompression(),
            train_minibatch_fn=self.getTrainMinibatchFn(), transformation_fn=self.getTransformationFn(),
            checkpoint_file=checkpoint, logs_dir=logs, store=store, resume_state=resume,
        )
        return spec, num_proc

    def _model_of(self, df: Any, spec: Any, run_id: str, history: list[dict[str, Any]], model_state: bytes,
                  optimizer_state: bytes) -> TorchModel:
        """The fitted TorchModel, from rank 0's answer."""
        import torch

        trained = copy.deepcopy(self.getModel())
        trained.load_state_dict(torch.load(io.BytesIO(model_state)))
        trained.eval()
        new_optimizer = spec.optimizer_cls(trained.parameters(), lr=1)
        new_optimizer.load_state_dict(torch.load(io.BytesIO(optimizer_state), weights_only=False))
        return TorchModel(history=history, model=trained, feature_columns=spec.feature_cols,
                          input_shapes=self.getInputShapes(), label_columns=spec.label_cols,
                          optimizer=new_optimizer, run_id=run_id,
                          loss=self.getLoss(), loss_constructors=self.getLossConstructors(),
                          _metadata={"types": _fit.label_types(df, spec.label_cols)})


class TorchModel(HorovodParams, _Model):  # type: ignore[misc,valid-type]
    """Horovod's ``TorchModel``: ``transform(df)`` adds one prediction column
    per label; ``getModel()``, ``getOptimizer()``, ``getHistory()`` (one
    entry per epoch: its train and validation loss and metrics, as Horovod's),
    ``setOutputCols``, save and load."""

    _defaults: ClassVar[dict[str, Any]] = {
        "history": None, "model": None, "feature_columns": None, "input_shapes": None, "label_columns": None,
        "optimizer": None, "run_id": None, "_metadata": None, "loss": None, "loss_constructors": None,
        "output_cols": None,
    }
    _aliases: ClassVar[dict[str, str]] = {"FeatureCols": "feature_columns", "LabelCols": "label_columns"}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._name_outputs()

    def _transform(self, df: Any) -> Any:
        from raydist.compat.horovod.spark.common._predict import add_predictions
        from raydist.compat.horovod.spark.torch._remote import predict_rows

        return add_predictions(df, model=self.getModel(), run=predict_rows, feature_cols=list(self.getFeatureColumns()),
                               input_shapes=self.getInputShapes(), label_cols=list(self.getLabelColumns()),
                               output_cols=list(self.getOutputCols()),
                               label_types=(self.getMetadata() or {}).get("types", {}))

    def getMetadata(self) -> Any:  # noqa: N802 - Horovod's name
        return self._hvd_params["_metadata"]
