"""raydist.train and raydist.compat on a real raydist cluster (2 CPU workers)."""

from __future__ import annotations

import pytest

import raydist
from raydist.errors import TrainingConfigError

from . import train_fns

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(spark):
    from ray import cloudpickle

    # Ship the test's training functions by value: Ray workers cannot import `tests`.
    cloudpickle.register_pickle_by_value(train_fns)
    c = raydist.up(spark, name="train", workers=2, cpus_per_worker=1)
    yield c
    c.down()
    cloudpickle.unregister_pickle_by_value(train_fns)


def test_torch_trains_and_resumes_from_checkpoint(cluster, tmp_path) -> None:
    from ray.train import RunConfig

    from raydist.train import TorchTrainer

    run = RunConfig(storage_path=str(tmp_path), name="torch")
    first = TorchTrainer(train_fns.torch_fn, config={"epochs": 4}, workers=2, cluster=cluster, run_config=run).fit()
    assert first.error is None
    out = first.return_value
    assert out["start"] == 0 and len(out["losses"]) == 4
    assert out["losses"][-1] < out["losses"][0]
    assert first.checkpoint is not None and first.metrics["epoch"] == 3

    # Ray Train V2 restores a run of the same name and storage from its latest checkpoint.
    second = TorchTrainer(train_fns.torch_fn, config={"epochs": 6}, workers=2, cluster=cluster, run_config=run).fit()
    assert second.return_value["start"] == 4
    assert second.return_value["losses"][0] < out["losses"][0]


def test_worker_loss_resumes_from_last_checkpoint(cluster, tmp_path) -> None:
    from ray.train import FailureConfig, RunConfig

    from raydist.train import TorchTrainer

    result = TorchTrainer(
        train_fns.torch_fn, config={"epochs": 6, "crash_at": 3}, workers=2, cluster=cluster,
        run_config=RunConfig(storage_path=str(tmp_path), name="crash"),
        failure_config=FailureConfig(max_failures=1),
    ).fit()
    assert result.error is None
    assert result.return_value["start"] >= 1  # resumed from a checkpoint, not from scratch
    assert result.metrics["epoch"] == 5


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_on_cpu(cluster, tmp_path, stage: int) -> None:
    """DeepSpeed ZeRO 2 and 3 on CPU through the facade: up to 60 s a stage
    here, two Ray Train workers each importing DeepSpeed and building its ops."""
    from ray.train import RunConfig

    from raydist.train import DeepSpeedTrainer

    config = {"train_micro_batch_size_per_gpu": 256, "zero_optimization": {"stage": stage}}
    result = DeepSpeedTrainer(
        train_fns.deepspeed_fn, deepspeed_config=config, config={"epochs": 5, "checkpoint": True},
        workers=2, cluster=cluster, run_config=RunConfig(storage_path=str(tmp_path), name=f"ds{stage}"),
    ).fit()
    assert result.error is None
    out = result.return_value
    assert out["zero"] == stage and out["rank"] == 0
    assert out["losses"][-1] < out["losses"][0]
    assert result.checkpoint is not None
    again = DeepSpeedTrainer(
        train_fns.deepspeed_fn, deepspeed_config=config, config={"epochs": 2}, workers=2, cluster=cluster,
        run_config=RunConfig(storage_path=str(tmp_path), name=f"ds{stage}"),
    ).fit()
    assert again.return_value["start"] == 5


def test_keras_fit_under_the_strategy(cluster, tmp_path) -> None:
    from ray.train import RunConfig

    from raydist.compat import MirroredStrategyRunner
    from raydist.train import TensorflowTrainer

    result = TensorflowTrainer(train_fns.keras_fn, config={"epochs": 4}, workers=2, cluster=cluster,
                               run_config=RunConfig(storage_path=str(tmp_path), name="keras")).fit()
    assert result.error is None
    losses = result.return_value["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert result.return_value["keras"].startswith("tf_keras")

    out = MirroredStrategyRunner(num_slots=2, use_gpu=False, cluster=cluster).run(train_fns.keras_runner_fn, epochs=3)
    assert len(out["losses"]) == 3 and out["losses"][-1] < out["losses"][0]


def test_torch_distributor_matches_pyspark(cluster, spark) -> None:
    from pyspark import cloudpickle as spark_cloudpickle
    from pyspark.ml.torch.distributor import TorchDistributor as SparkTorchDistributor

    from raydist.compat import TorchDistributor

    spark_cloudpickle.register_pickle_by_value(train_fns)  # executors cannot import `tests` either
    ours = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster).run(
        train_fns.spark_style_torch_fn, 0.05, epochs=8
    )
    theirs = SparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        train_fns.spark_style_torch_fn, 0.05, epochs=8
    )
    assert isinstance(ours, float) and ours == theirs


def test_train_on_dataframe_hands_each_rank_its_partition_as_pyspark_does(cluster, spark) -> None:
    """pyspark.ml.connect's estimators train through this private method:
    the same function, on the same DataFrame, must see the same rows in each
    rank as on pyspark's, through pyspark's own data loader."""
    from pyspark import cloudpickle as spark_cloudpickle
    from pyspark.ml.torch.distributor import TorchDistributor as SparkTorchDistributor

    from raydist.compat import TorchDistributor

    spark_cloudpickle.register_pickle_by_value(train_fns)
    rows = [(float(i % 2), [float(i), float(-i)]) for i in range(10)]
    # Two partitions of five rows, the same on every read (a round-robin
    # repartition would deal the rows again on each read).
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), "label double, features array<double>")

    theirs = SparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False)._train_on_dataframe(
        train_fns.partition_probe_fn, df, num_samples=5)
    ours = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster)._train_on_dataframe(
        train_fns.partition_probe_fn, df, num_samples=5)

    def by_rank(out: dict) -> dict:
        return {r["rank"]: {**r, "rows": sorted(r["rows"])} for r in out["ranks"]}

    assert by_rank(ours) == by_rank(theirs)
    assert all(r["rows"] for r in by_rank(ours).values())  # each rank had rows of its own
    assert sorted(row for r in ours["ranks"] for row in r["rows"]) == sorted([lab, f] for lab, f in rows)
    assert all(r["files"] == ["data.arrow", "schema.json"] and r["files_exist"] for r in ours["ranks"])
    # ... and a second fit on the same warm workers reads its own data, not the first one's.
    again = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster)._train_on_dataframe(
        train_fns.partition_probe_fn, df.selectExpr("label", "transform(features, v -> v * 10) AS features"),
        num_samples=5)
    assert sorted(row for r in again["ranks"] for row in r["rows"]) == sorted(
        [lab, [v * 10 for v in f]] for lab, f in rows)

    # pyspark's refusals, with its messages.
    with pytest.raises(ValueError, match="requires setting TorchDistributor.local_mode to False"):
        TorchDistributor(num_processes=2, local_mode=True)._train_on_dataframe(train_fns.partition_probe_fn, df, 5)
    with pytest.raises(ValueError, match="requires setting num_processes equal to input spark dataframe partition"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster)._train_on_dataframe(
            train_fns.partition_probe_fn, df.repartition(3), num_samples=5)
    with pytest.raises(ValueError, match="Empty Spark partition is not allowed"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster)._train_on_dataframe(
            train_fns.partition_probe_fn,
            spark.createDataFrame(spark.sparkContext.parallelize(rows[:1], 2), "label double, features array<double>"),
            num_samples=5)


def test_torch_distributor_keeps_its_workers_warm_between_runs(cluster) -> None:
    from raydist.compat import TorchDistributor

    def run(tag: str) -> dict:
        return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster).run(
            train_fns.warm_probe_fn, tag
        )

    first, second = run("first"), run("second")
    for out in (first, second):
        assert out["rank"] == "0" and out["world"] == "2" and out["sum_of_ranks_plus_one"] == 3.0
    # The second run forked from the same warm worker, into a new process that
    # saw nothing the first run left behind.
    assert second["worker"] == first["worker"]
    assert second["process"] != first["process"]
    assert first["left_by_earlier_run"] is None and second["left_by_earlier_run"] is None


def test_torch_distributor_raises_the_workers_error_and_stays_warm(cluster) -> None:
    from raydist.compat import TorchDistributor

    def distributor() -> TorchDistributor:
        return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster)

    before = distributor().run(train_fns.warm_probe_fn, "before")
    with pytest.raises(ValueError, match="bad batch on rank 1") as caught:
        distributor().run(train_fns.fails_on_rank_1)
    assert any("rank 1" in note for note in getattr(caught.value, "__notes__", []))
    after = distributor().run(train_fns.warm_probe_fn, "after")
    assert after["worker"] == before["worker"]


def test_torch_distributor_survives_a_lost_worker(cluster, tmp_path) -> None:
    from raydist.compat import TorchDistributor

    got = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster, max_failures=1).run(
        train_fns.dies_once_on_rank_1, str(tmp_path), 0.05
    )
    assert (tmp_path / "died-once").exists()
    fresh = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster, keep_warm_s=0).run(
        train_fns.spark_style_torch_fn, 0.05, epochs=4
    )
    assert got == fresh  # the rerun trained from the start, to the same model


def test_deepspeed_distributor_hands_the_config_to_functions(cluster) -> None:
    from raydist.compat import DeepspeedTorchDistributor

    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
    got = DeepspeedTorchDistributor(numGpus=2, nnodes=1, useGpu=False, deepspeedConfig=config, cluster=cluster).run(
        train_fns.deepspeed_config_fn
    )
    assert got == config


def test_bad_input_fails_before_cluster_work(cluster, tmp_path) -> None:
    from raydist.compat import DeepspeedTorchDistributor, MirroredStrategyRunner, TorchDistributor
    from raydist.train import TorchTrainer

    with pytest.raises(TrainingConfigError, match="num_processes"):
        TorchDistributor(num_processes=0)
    with pytest.raises(TrainingConfigError, match="no such training script"):
        TorchDistributor(num_processes=2, use_gpu=False, cluster=cluster).run(str(tmp_path / "missing.py"))
    with pytest.raises(TrainingConfigError, match="GPUs for 2 workers"):
        TorchTrainer(train_fns.torch_fn, workers=2, use_gpu=True, cluster=cluster).fit()
    with pytest.raises(TrainingConfigError, match="workers"):
        TorchTrainer(train_fns.torch_fn, workers=0)
    with pytest.raises(TrainingConfigError, match="zero_optimization.stage"):
        DeepspeedTorchDistributor(numGpus=1, deepspeedConfig={"zero_optimization": {"stage": 7}})
    with pytest.raises(TrainingConfigError, match="gpu_resource_name"):
        MirroredStrategyRunner(num_slots=1, gpu_resource_name="tpu")


def test_every_class_logs_into_the_drivers_mlflow_run(cluster, mlflow_server, monkeypatch) -> None:
    """The driver's MLflow context follows every distributor and facade run
    (about 90 s on the module's warm cluster: each class runs once, and the fresh
    runs of DeepSpeed, TensorFlow and the facade start Ray Train workers):
    rank 0 logs into the open run, with the credentials the driver has, and
    no rank ends it; raydist's figures land in it; with no open run nothing
    is created; with all_ranks every rank logs into a child run of its own."""
    import secrets

    import mlflow
    from mlflow import MlflowClient

    from raydist.compat import DeepspeedTorchDistributor, HorovodRunner, MirroredStrategyRunner, TorchDistributor
    from raydist.train import TorchTrainer, configure_mlflow

    token = "tok-" + secrets.token_hex(8)  # a credential MLflow reads from the environment
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    mlflow.set_tracking_uri(mlflow_server.url)
    client = MlflowClient(mlflow_server.url)
    experiment = mlflow.set_experiment("raydist-every-class").experiment_id
    torch_run = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, cluster=cluster)
    quiet = torch_run.run(train_fns.mlflow_rank_fn, "quiet", 0)  # no open run, nothing logged
    assert quiet["uri"] == mlflow_server.url and client.search_runs([experiment]) == []  # raydist made no run
    try:
        with mlflow.start_run() as run:
            # The warm runs first (a fresh run gives the warm workers back).
            returned = {
                "torch": torch_run.run(train_fns.mlflow_rank_fn, "torch"),
                "horovod": HorovodRunner(np=2, cluster=cluster).run(train_fns.mlflow_rank_fn, key="horovod"),
            }
            configure_mlflow(all_ranks=True)
            every = torch_run.run(train_fns.mlflow_every_rank_fn, "every")
            configure_mlflow(all_ranks=False)
            returned |= {
                "local": TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
                    train_fns.mlflow_rank_fn, "local"),
                "deepspeed": DeepspeedTorchDistributor(numGpus=2, nnodes=1, localMode=False, useGpu=False,
                                                       cluster=cluster).run(train_fns.mlflow_rank_fn, "deepspeed"),
                "mirrored": MirroredStrategyRunner(num_slots=2, use_gpu=False, cluster=cluster).run(
                    train_fns.mlflow_rank_fn, key="mirrored"),
                "facade": TorchTrainer(train_fns.mlflow_facade_fn, config={"key": "facade"}, workers=2,
                                       cluster=cluster).run(),
            }
            status_while_open = client.get_run(run.info.run_id).info.status
    finally:
        configure_mlflow(all_ranks=False)
        # This process's MLflow as it was: the tests after this one run with no tracking server chosen.
        from mlflow.tracking import fluent
        from mlflow.tracking._tracking_service import utils

        utils._tracking_uri = None
        fluent._active_experiment_id = None
    assert status_while_open == "RUNNING"  # no rank ended the driver's run
    for key, out in returned.items():
        assert out["rank"] == 0 and out["token"] == token, (key, out)
        steps = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert steps == [(0, 0.0), (1, 1.0), (2, 2.0)], key
    # The one open run, plus the child run of rank 1 (all_ranks), nothing else.
    runs = client.search_runs([experiment])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == run.info.run_id]
    assert len(runs) == 2 and len(children) == 1 and children[0].data.tags["rank"] == "1"
    assert every["run_id"] == run.info.run_id  # rank 0 logged into the open run itself
    assert [m.value for m in client.get_metric_history(children[0].info.run_id, "every")] == [1.0]
    assert children[0].info.status == "FINISHED"
    # raydist's figures: one record per run in the open run.
    figures = client.get_run(run.info.run_id).data
    assert figures.metrics["raydist.workers"] == 2 and figures.metrics["raydist.run_wall_s"] > 0
    records = [a.path for a in client.list_artifacts(run.info.run_id, "raydist")]
    assert len(records) == 7, records


def test_rank_zeros_reports_show_one_line_each_in_place_of_ray_trains(cluster, caplog, capfd) -> None:
    """Off a terminal (here) rank 0's reports are log records, one per
    report; Ray Train's raw per-report lines from every rank are gone."""
    import logging
    import time

    from raydist.train import TorchTrainer

    with caplog.at_level(logging.INFO, logger="raydist.train.progress"):
        assert TorchTrainer(train_fns.report_fn, config={"epochs": 3}, workers=2, cluster=cluster).run() == 3
    shown = [r.getMessage() for r in caplog.records if r.name == "raydist.train.progress"]
    assert shown == [f"TorchTrainer: report {i + 1} · epoch {i} · loss {1.0 / (i + 1):.4g} · rank 0" for i in range(3)]
    time.sleep(2)  # the workers' output reaches this process's stderr a moment later
    assert "Reporting training result" not in capfd.readouterr().err
