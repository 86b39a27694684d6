"""Spark DataFrames into Ray Data and back, on real Spark and Ray, no files."""

from __future__ import annotations

import math

import pytest

import raydist
from raydist.errors import DataFormatError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(spark):
    import ray

    with raydist.up(spark, name="data", workers=2, cpus_per_worker=1) as c:
        c.connect()
        try:
            yield c
        finally:
            ray.shutdown()


def _frame(spark, rows: int, parts: int):
    return spark.range(0, rows, 1, parts).selectExpr(
        "id", "id * 0.25 AS x", "IF(id % 7 = 0, NULL, concat('r', CAST(id AS STRING))) AS s",
        "CAST(id % 3 = 0 AS BOOLEAN) AS flag", "array(id, id + 1) AS pair",
        "named_struct('a', id, 'b', CAST(id AS STRING)) AS rec", "to_timestamp('2026-01-02 03:04:05') AS ts",
        "CAST(id AS DECIMAL(20, 2)) AS amount")


def test_from_spark_keeps_every_row_in_order_in_one_block_per_partition(spark, cluster) -> None:
    from raydist.data import from_spark

    df = _frame(spark, 20_000, 6).orderBy("id")
    ds = from_spark(df)
    # The blocks are the partitions themselves, already in the object store
    # (no read step, no files): one per partition.
    assert type(ds).__name__ == "MaterializedDataset"
    assert ds.num_blocks() == df.rdd.getNumPartitions()
    rows = ds.take_all()
    want = [r.asDict(recursive=True) for r in df.collect()]
    assert len(rows) == len(want) == 20_000
    assert [r["id"] for r in rows] == list(range(20_000))  # the DataFrame's order
    assert rows[7]["s"] is None and rows[8]["s"] == "r8" and list(rows[9]["pair"]) == [9, 10]
    assert rows[10]["rec"] == {"a": 10, "b": "10"} and float(rows[11]["amount"]) == 11.0
    assert math.isclose(sum(r["x"] for r in rows), sum(w["x"] for w in want))


def test_round_trip_and_empty_frames(spark, cluster) -> None:
    from raydist.data import from_spark, to_spark

    df = _frame(spark, 5_000, 4).select("id", "x", "s", "flag")
    back = to_spark(from_spark(df), spark)
    assert back.count() == 5_000
    assert sorted(back.collect()) == sorted(df.collect())
    empty = from_spark(df.limit(0))
    assert empty.count() == 0 and "id" in empty.schema().names


def test_a_column_arrow_cannot_hold_is_named(spark, cluster) -> None:
    from raydist.data import from_spark

    df = spark.range(3).selectExpr("id", "make_interval(0, 0, 0, id) AS gap")
    with pytest.raises(DataFormatError) as err:
        from_spark(df)
    assert err.value.column == "gap" and "cast it" in str(err.value)


def test_a_torch_trainer_trains_on_a_dataframe(spark, cluster) -> None:
    from raydist.data import from_spark
    from raydist.train import TorchTrainer

    df = spark.range(0, 4_000, 1, 4).selectExpr("CAST((id % 100) / 100 AS FLOAT) AS x",
                                                 "CAST(3 * (id % 100) / 100 + 1 AS FLOAT) AS y")

    def train_fn(config):
        import ray.train
        import torch
        import torch.distributed as dist

        shard = ray.train.get_dataset_shard("train")
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        seen, losses = 0, []
        for _ in range(20):
            for batch in shard.iter_torch_batches(batch_size=500):
                x, y = batch["x"].unsqueeze(1), batch["y"].unsqueeze(1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen += len(x)
                losses.append(loss.item())
        total = torch.tensor([seen])
        dist.all_reduce(total)
        return {"rows_per_epoch": int(total) // 20, "first": losses[0], "last": losses[-1]}

    out = TorchTrainer(train_fn, workers=2, datasets={"train": from_spark(df)}).run()
    assert out["rows_per_epoch"] == 4_000  # every row, once per epoch, across both workers
    assert out["last"] < out["first"] / 10


def test_no_free_task_slot_is_an_error_not_a_hang(spark, cluster) -> None:
    from raydist.data import from_spark
    from raydist.errors import CapacityError

    with raydist.up(spark, name="all-slots", workers=2, cpus_per_worker=1):  # with the module's: all four
        with pytest.raises(CapacityError, match="free task slot"):
            from_spark(spark.range(10))
