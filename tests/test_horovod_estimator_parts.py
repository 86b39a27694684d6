"""The parts of Horovod's Spark estimator API that need no Spark run: the
Store's paths and the prefixes it takes or refuses, the Backend as Horovod's
examples build it, and the estimators' parameters (keywords, getters and
setters, the refusals, save and load)."""

from __future__ import annotations

import os

import pytest

from raydist.compat.horovod.spark.common.backend import SparkBackend
from raydist.compat.horovod.spark.common.store import DBFSLocalStore, LocalStore, Store
from raydist.compat.horovod.spark.torch import TorchEstimator, TorchModel
from raydist.errors import TrainingConfigError

pytestmark = pytest.mark.unit


def test_a_local_store_lays_out_runs_as_horovods(tmp_path) -> None:
    store = Store.create(str(tmp_path / "work"))
    assert isinstance(store, LocalStore)
    assert store.get_checkpoint_path("r1") == str(tmp_path / "work" / "runs" / "r1")
    assert store.get_logs_path("r1") == str(tmp_path / "work" / "runs" / "r1" / "logs")
    assert store.get_train_data_path(0) == str(tmp_path / "work" / "intermediate_train_data.0")
    assert store.get_val_data_path() == str(tmp_path / "work" / "intermediate_val_data")
    # file:// is the same directory; a write is whole, then read back.
    same = Store.create(f"file://{tmp_path / 'work'}")
    target = os.path.join(same.get_checkpoint_path("r1"), same.get_checkpoint_filename())
    same.write(target, b"weights")
    assert store.exists(target) and store.read(target) == b"weights"
    assert os.listdir(os.path.dirname(target)) == ["checkpoint.pt"]


@pytest.mark.parametrize("prefix", ["hdfs://namenode:8020/user/me/work", "s3://bucket/work", "gs://b/w"])
def test_a_remote_filesystem_is_refused_with_the_fix(prefix: str) -> None:
    with pytest.raises(TrainingConfigError) as refused:
        Store.create(prefix)
    assert refused.value.field == "prefix_path" and "mount" in str(refused.value), str(refused.value)


def test_dbfs_is_its_fuse_mount() -> None:
    if os.path.isdir("/dbfs"):
        store = Store.create("dbfs:/ml/work")
        assert isinstance(store, DBFSLocalStore) and store.prefix_path == "/dbfs/ml/work"
    else:
        with pytest.raises(TrainingConfigError, match="/dbfs"):
            Store.create("dbfs:/ml/work")


def test_the_backend_takes_horovods_example_arguments() -> None:
    import sys

    backend = SparkBackend(num_proc=3, stdout=sys.stdout, stderr=sys.stderr, prefix_output_with_timestamp=True,
                           env={"A": "1"})
    assert backend.num_processes() == 3 and backend.env() == {"A": "1"}
    with pytest.raises(TrainingConfigError) as refused:
        SparkBackend(num_proc=0)
    assert refused.value.field == "num_proc"
    with pytest.raises(TrainingConfigError, match="MPI"):
        SparkBackend(num_proc=2, use_mpi=True)


def test_parameters_by_keyword_getter_and_setter() -> None:
    est = TorchEstimator(num_proc=2, feature_cols=["features"], label_cols=["label"], batch_size=8)
    assert est.getFeatureCols() == ["features"] and est.getBatchSize() == 8 and est.getEpochs() == 1
    assert est.setEpochs(3) is est and est.getEpochs() == 3
    assert est.getUseGpu() is True  # Horovod's default: a GPU where the rank has one
    with pytest.raises(TrainingConfigError) as refused:
        TorchEstimator(num_epochs=3)
    assert refused.value.field == "num_epochs"
    with pytest.raises(ValueError, match="only one of loss_constructors and loss"):
        TorchEstimator(loss=lambda o, t: o, loss_constructors=[lambda: None])
    # The rule is the estimator's: a model takes the parameters it is given, as Horovod's does.
    assert TorchModel(loss="mse", loss_constructors=["mse"]).getLoss() == "mse"
    with pytest.raises(AttributeError):
        est.getNoSuchThing()  # noqa: B018


def test_a_fit_checks_what_it_needs_before_any_spark_job() -> None:
    est = TorchEstimator(num_proc=2, model=object(), optimizer=object(), feature_cols=["f"], label_cols=["l"],
                         loss=lambda o, t: o)
    est.setCallbacks([object()])
    with pytest.raises(TrainingConfigError) as refused:
        est._check()
    assert refused.value.field == "callbacks"
    est.setCallbacks(None).setBatchSize(0)
    with pytest.raises(TrainingConfigError) as refused:
        est._check()
    assert refused.value.field == "batch_size"
    with pytest.raises(TrainingConfigError) as refused:
        TorchEstimator(num_proc=2, backend=SparkBackend(num_proc=2))._num_proc()
    assert refused.value.field == "num_proc"


def test_a_model_saves_and_loads_without_its_store(tmp_path) -> None:
    model = TorchModel(history=[{"epoch": 0}], model={"weights": [1.0]}, feature_columns=["f"], label_columns=["y"],
                       run_id="r")
    assert model.getOutputCols() == ["y__output"] and model.getFeatureCols() == ["f"]
    model.setOutputCols(["p"]).save(str(tmp_path / "m"))
    loaded = TorchModel.load(str(tmp_path / "m"))
    assert loaded.getModel() == {"weights": [1.0]} and loaded.getHistory() == [{"epoch": 0}]
    assert loaded.getOutputCols() == ["p"]
    with pytest.raises(FileExistsError, match="overwrite"):
        model.save(str(tmp_path / "m"))
    model.write().overwrite().save(str(tmp_path / "m"))
    with pytest.raises(TrainingConfigError, match="TorchModel"):
        TorchEstimator.load(str(tmp_path / "m"))


def test_a_keras_fit_refuses_what_cannot_mean_the_same_here_naming_it() -> None:
    """Checked before any Spark job or TensorFlow import: each refusal names
    the parameter and what to do."""
    from raydist.compat.horovod.spark.keras import KerasEstimator

    class Keras2Model:  # what _check reads of a tf_keras model: its module
        __module__ = "tf_keras.src.engine.sequential"

    base = {"model": object(), "optimizer": "adam", "loss": "mse", "feature_cols": ["f"], "label_cols": ["y"]}
    with pytest.raises(TrainingConfigError, match="loss"):
        KerasEstimator(**{**base, "loss": None})._check()
    for name, value, says in (("gradient_compression", "fp16", "uncompressed"),
                              ("checkpoint_callback", object(), "checkpoint.pkl"),
                              ("train_minibatch_fn", len, "model.fit"),
                              ("epochs", 0, "at least 1"),
                              ("label_shapes", [[-1, 1], [-1, 2]], "one shape per label")):
        with pytest.raises(TrainingConfigError, match=says) as caught:
            KerasEstimator(**{**base, name: value})._check()
        assert caught.value.field == name
    with pytest.raises(TrainingConfigError, match="Keras 2"):
        KerasEstimator(**{**base, "model": Keras2Model(), "backward_passes_per_step": 2})._check()
    with pytest.raises(TrainingConfigError, match="not a parameter of KerasEstimator"):
        KerasEstimator(input_shapes=[[-1, 4]])  # TorchEstimator's, not Horovod's KerasEstimator's
    KerasEstimator(**{**base, "backward_passes_per_step": 2})._check()  # a Keras 3 model accumulates them


def test_a_lightning_fit_keeps_horovods_rules_for_a_lightning_module() -> None:
    """Horovod's own refusals (optimizer, loss, loss_weights with a
    LightningModule, with its messages), and what cannot mean the same here,
    named; all before any Spark job."""
    import torch
    from pytorch_lightning import LightningModule

    from raydist.compat.horovod.spark.lightning import TorchEstimator as LightningEstimator

    class Net(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

    base = {"model": Net(), "feature_cols": ["f"], "label_cols": ["y"]}
    LightningEstimator(**base)._check()
    for name, value in (("optimizer", object()), ("loss", torch.nn.functional.nll_loss), ("loss_weights", [1.0])):
        with pytest.raises(ValueError, match=f"Parameter `{name}` cannot be specified with a `LightningModule`"):
            LightningEstimator(**{**base, name: value})._check()
    for name, value, says in (("model", torch.nn.Linear(4, 3), "horovod.spark.torch.TorchEstimator"),
                              ("data_module", object(), "rows come from the DataFrame"),
                              ("terminate_on_nan", True, "EarlyStopping"),
                              ("input_shapes", [[-1, 4], [-1, 2]], "one shape per feature column")):
        with pytest.raises(TrainingConfigError, match=says) as caught:
            LightningEstimator(**{**base, name: value})._check()
        assert caught.value.field == name
