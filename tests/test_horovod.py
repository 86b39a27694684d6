"""Horovod programs on raydist (raydist.compat.horovod): a PyTorch program
written as Horovod's examples write it, only the runner's import changed,
run as a script on real Spark and Ray; its results against the same
training in one process."""

from __future__ import annotations

import pytest

from tests.probe import run_program

pytestmark = pytest.mark.integration


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


@pytest.mark.timeout(900)
def test_a_horovod_pytorch_program_runs_with_only_its_runner_import_changed(no_leftover_ray) -> None:
    """A Horovod PyTorch program and its single-process reference: about
    60 s here, a cluster start and two interpreters importing torch."""
    out = run_program("horovod_user.py")
    reference = out["reference"]

    # Averaged gradients over two ranks' shards (with SyncBatchNorm over the
    # global batch) give the weights of one process on the whole batch: on
    # this machine (np < 0) and on the session cluster (np > 0).
    for where in ("local", "cluster"):
        got = out[where]
        assert got["rank"] == 0 and got["size"] == 2, got
        assert _close(got["after"], reference), (where, got["after"], reference)

    # horovod.spark.run: every rank's result in rank order; ranks that began
    # from different weights end equal (broadcast_parameters).
    ranks = out["every_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["before"] != ranks[1]["before"]
    assert ranks[0]["after"] == ranks[1]["after"] and _close(ranks[0]["after"], reference)

    # backward_passes_per_step=2: two summed passes a step, as a doubled batch.
    assert _close(out["passes"]["after"], out["reference_doubled"]), (out["passes"], out["reference_doubled"])

    coll = out["collectives"]
    assert coll[0]["allgather"] == coll[1]["allgather"] == [0.0, 0.0, 1.0]  # unequal first dimensions
    assert coll[0]["allreduce_sum"] == 3.0 and coll[0]["allreduce_avg"] == 1.5
    assert coll[0]["broadcast"] == coll[1]["broadcast"] == 7.0
    assert coll[0]["objects"] == [{"rank": 0}, {"rank": 1}]
    assert coll[0]["held"] == [[1.5, 1.5], [4.5] * 4]  # an output held is never handed out again
    assert "hvd.Average" in coll[0]["adasum"]  # unsupported, naming what to use
    assert "horovod.torch" in coll[0]["mxnet_import"]  # a module not mapped says which are

    # An error in one rank reaches the caller with its message, wherever it ran.
    for where in ("error_local", "error_cluster"):
        assert out[where] is not None and "rank 1 could not read its shard" in out[where], (where, out[where])


@pytest.mark.timeout(900)
def test_a_horovod_keras_program_runs_with_only_its_runner_import_changed(no_leftover_ray) -> None:
    out = run_program("horovod_keras_user.py")
    got, reference = out["horovod"], out["reference"]
    assert got["rank"] == 0 and got["size"] == 2
    assert got["tf_keras"] == "tf_keras"  # Keras 2, as Horovod's Keras was
    # Averaged gradients over two shards: the weights, and the epoch losses
    # (MetricAverageCallback), of one process fitting the whole batch.
    assert _close(got["weights"], reference["weights"]), (got["weights"], reference["weights"])
    assert _close(got["loss"], reference["loss"]), (got["loss"], reference["loss"])
    # The warmup: initial_lr / size, growing step by step to initial_lr over two epochs.
    assert got["rates"] == [0.05, 0.075, 0.1, 0.1], got["rates"]
    assert got["allgather"] == [0.0, 1.0, 1.0]


def check_estimator_program(out: dict) -> None:
    """What a user of Horovod's pytorch_spark_mnist.py looks at, and then some."""
    # Three classes a random guess gets a third of: the model learned them.
    assert out["accuracy"] > 0.75, out["accuracy"]
    assert out["columns"] == ["features", "label", "label_prob", "label_pred"]
    assert out["prob_type"] == "VectorUDT"  # class scores for a scalar label, as Horovod's DenseVector
    assert out["default_columns"] == ["label__output"]
    assert out["same_after_load"] is True
    # One entry per epoch, Horovod's shape; training and validation loss fall.
    history = out["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2, 3]
    assert all(set(h) == {"epoch", "train", "validation"} and set(h["train"]) == {"loss", "all_metrics"}
               for h in history)
    train = [h["train"]["loss"] for h in history]
    assert train == sorted(train, reverse=True) and history[-1]["validation"]["loss"] < history[0]["validation"]["loss"]
    # The run's checkpoint and logs are in the Store under runs/<run_id>; a
    # second fit under that run_id starts from it (a fresh model's first
    # epoch would be where the first fit began, near 1.0).
    assert out["checkpoint"] is True and out["logs"] == ["history.jsonl"]
    assert out["resumed_history"][0]["train"]["loss"] < history[-1]["train"]["loss"] + 0.1
    # The optimizer handed back has the learning rate the user gave (Horovod
    # scales it by the ranks while training, and back).
    assert out["optimizer_lr"] == 0.05


def check_keras_estimator_program(out: dict) -> None:
    """What a user of Horovod's keras_spark_mnist.py looks at, and then some."""
    assert out["keras"] == "keras"  # built with Keras 3 on the driver, trained and handed back as Keras 3
    assert out["accuracy"] > 0.75, out["accuracy"]  # three classes a random guess gets a third of
    assert out["columns"] == ["features", "label", "label_vec", "label_prob", "label_pred"]
    assert out["prob_type"] == "VectorUDT"  # a vector label's prediction is a DenseVector, as Horovod's
    assert out["default_columns"] == ["label_vec__output"]
    assert out["same_after_load"] is True
    # Keras's history, each metric per epoch averaged over the ranks; the losses fall.
    history = out["history"]
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(v) == 4 for v in history.values())
    # Over the fit, not every epoch: a data-parallel run's per-epoch loss may tick up by a hair
    # (a suite run saw 0.1210 then 0.1230 in epoch 3 of 4), so "each epoch lower" failed by chance.
    assert history["loss"][-1] < history["loss"][0]
    assert history["val_loss"][-1] < history["val_loss"][0]
    # The run's checkpoint and logs are in the Store; a second fit under that
    # run_id starts from it (a fresh model's first epoch would start near 1.1).
    assert out["checkpoint"] == ["checkpoint.pkl"] and out["logs"] == ["history.jsonl"]
    assert out["resumed_history"]["loss"][0] < history["loss"][-1] + 0.1
    # The learning rate handed back is the user's (scaled by the ranks while training, and back).
    assert abs(out["optimizer_lr"] - 0.02) < 1e-6


def check_lightning_estimator_program(out: dict) -> None:
    """What a user of Horovod's pytorch_lightning_spark_mnist.py looks at, and then some."""
    assert out["accuracy"] > 0.75, out["accuracy"]  # three classes a random guess gets a third of
    assert out["columns"] == ["features", "label", "label_prob", "label_pred"]
    assert out["default_columns"] == ["label__output"]
    assert out["same_after_load"] is True
    # Horovod's Lightning history: the metrics the module logged last (averaged over the ranks: sync_dist).
    assert set(out["history"]) == {"train_loss", "val_loss"}
    # Lightning's checkpoint under runs/<run_id>; the second fit (epochs=6)
    # resumed from it: it trained epochs 5 and 6 only, on top of the first
    # fit's 4, and its model still predicts well. (Not "its val_loss is
    # lower": each fit draws its own validation rows, so the two losses are
    # of different rows and either may be the larger.)
    assert out["checkpoint"] == ["checkpoint.ckpt"]
    assert out["train_epochs"] == [4, 2]
    assert set(out["resumed_history"]) == {"train_loss", "val_loss"}
    assert out["resumed_accuracy"] > 0.75


@pytest.mark.timeout(900)
def test_horovods_lightning_estimator_example_runs_with_only_the_alias_line(tmp_path, no_leftover_ray) -> None:
    """Horovod's Lightning estimator example in its shape: two fits of a
    LightningModule, a transform and a session cluster start, about 2 min
    here (the same program on Connect is in test_connect.py)."""
    out = run_program("horovod_lightning_estimator_user.py", "--master", "local-cluster[2,1,1024]",
                      str(tmp_path / "store"), home=tmp_path / "home")
    check_lightning_estimator_program(out)


@pytest.mark.timeout(900)
def test_horovods_keras_estimator_example_runs_with_only_the_alias_line(tmp_path, no_leftover_ray) -> None:
    """Horovod's Keras estimator example in its shape, a Keras 3 model built
    on the driver: two fits, a transform and a session cluster start, about
    140 s here, most of it TensorFlow's import in each process (the same
    program on Connect is in test_connect.py)."""
    out = run_program("horovod_keras_estimator_user.py", "--master", "local-cluster[2,1,1024]",
                      str(tmp_path / "store"), home=tmp_path / "home")
    check_keras_estimator_program(out)


@pytest.mark.timeout(900)
def test_horovods_torch_estimator_example_runs_with_only_the_alias_line(tmp_path, no_leftover_ray) -> None:
    """Horovod's Spark estimator example in its shape: three fits' worth of
    Spark jobs and a session cluster start, about 110 s here (the same
    program on Connect is in test_connect.py)."""
    out = run_program("horovod_estimator_user.py", "--master", "local-cluster[2,1,1024]", str(tmp_path / "store"),
                      home=tmp_path / "home")
    check_estimator_program(out)
