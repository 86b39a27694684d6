"""A run's ranks in Spark barrier tasks, no Ray (raydist.train.spark_tasks),
on the suite's real local-cluster: two executors, one slot each."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

import psutil
import pytest

from raydist.train.spark_tasks import run_in_spark_tasks, task_ranks

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, scope="module")
def functions_by_value():
    """The executors cannot import ``tests``: this module's functions travel whole."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "FROM_DRIVER")


def each_rank_says() -> list[dict]:
    """A torchrun-style function: makes its own process group from the
    environment, as user code written for pyspark's distributor does."""
    import torch
    import torch.distributed as dist

    print(f"rank {os.environ['RANK']} starts", flush=True)
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    mine = {k: os.environ.get(k) for k in KEYS} | {"pid": os.getpid(), "sum": total.item()}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    dist.destroy_process_group()
    return everyone


def test_ranks_as_torchrun_lays_them_out_and_rank_0s_value_back(spark, capsys) -> None:
    ranks = run_in_spark_tasks(each_rank_says, spark=spark, ranks=2, env={"FROM_DRIVER": "yes"})
    printed = capsys.readouterr().out  # what each rank printed, on the driver's console
    assert "rank 0 starts" in printed and "rank 1 starts" in printed
    assert [r["RANK"] for r in ranks] == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in ranks} == {"2"} and {r["GROUP_WORLD_SIZE"] for r in ranks} == {"2"}
    # One rank a task, as pyspark's CPU runs: each its task's only local rank.
    assert [(r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"], r["NODE_RANK"]) for r in ranks] == [("0", "1", "0"),
                                                                                         ("0", "1", "1")]
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in ranks}) == 1
    assert all(r["CUDA_VISIBLE_DEVICES"] == "" and r["FROM_DRIVER"] == "yes" for r in ranks)
    assert {r["sum"] for r in ranks} == {3.0}  # the collective ran across both tasks
    # Each rank was a process of its own, and none outlives the run.
    assert len({r["pid"] for r in ranks}) == 2
    assert not [p for p in (r["pid"] for r in ranks) if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert "RANK" not in os.environ  # nothing of the ranks' environment here


def fails_on_rank_1(marks: str) -> None:
    """Rank 1 fails before any collective; rank 0 waits in one for it, as a
    real rank would, until the run ends it."""
    import torch.distributed as dist

    with open(os.path.join(marks, os.environ["RANK"]), "a") as f:
        f.write("started\n")
    if os.environ["RANK"] == "1":
        print("rank 1 saw a bad batch", file=sys.stderr)
        raise ValueError("bad batch on rank 1")
    dist.init_process_group("gloo")  # waits for rank 1, which never comes
    dist.barrier()


def test_a_failing_rank_raises_its_own_error_once_and_ends_the_others(spark, tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="bad batch on rank 1") as raised:
        run_in_spark_tasks(lambda: fails_on_rank_1(str(tmp_path)), spark=spark, ranks=2)
    assert any("training process rank 1" in note for note in raised.value.__notes__)
    assert "rank 1 saw a bad batch" in capsys.readouterr().out  # its stderr too
    # Each rank started once: the stage ended normally, Spark retried nothing.
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]
    assert [(tmp_path / r).read_text() for r in ("0", "1")] == ["started\n", "started\n"]
    # Spark's slots are free again: the next run gets both.
    assert len(run_in_spark_tasks(each_rank_says, spark=spark, ranks=2)) == 2


def waits_for_the_driver(marker: str) -> bool:
    """Prints a line, then waits until the driver has seen it."""
    import time

    print(f"rank {os.environ['RANK']} is at step 1", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return os.path.exists(marker)


def test_what_ranks_print_reaches_the_drivers_console_while_they_run(spark, tmp_path, capsys) -> None:
    marker = tmp_path / "seen"
    result: dict = {}
    run = threading.Thread(target=lambda: result.update(
        out=run_in_spark_tasks(lambda: waits_for_the_driver(str(marker)), spark=spark, ranks=2)))
    run.start()
    seen, deadline = "", time.monotonic() + 60
    while not all(f"rank {r} is at step 1\n" in seen for r in (0, 1)) and time.monotonic() < deadline:
        seen += capsys.readouterr().out
        time.sleep(0.1)
    marker.touch()
    run.join(timeout=120)
    seen += capsys.readouterr().out
    # Rank 0 was still waiting when its line reached this console, and each
    # line came once (not again at the end).
    assert result["out"] is True
    assert [seen.count(f"rank {r} is at step 1\n") for r in (0, 1)] == [1, 1], seen


def peers_env(peers: list[str], rank: int) -> dict[str, str]:
    return {"PEERS": ",".join(peers), "ME": str(rank)}


def dial_every_peer() -> dict:
    """Each rank listens on its own address and dials every other one, as
    TensorFlow's workers do with ``TF_CONFIG``."""
    import socket
    import time

    peers, me = os.environ["PEERS"].split(","), int(os.environ["ME"])
    host, port = peers[me].rsplit(":", 1)
    heard = []
    with socket.create_server((host, int(port))) as server:
        server.settimeout(60)
        for other, address in enumerate(peers):
            if other == me:
                continue
            peer_host, peer_port = address.rsplit(":", 1)
            deadline = time.monotonic() + 60
            while True:
                try:
                    with socket.create_connection((peer_host, int(peer_port)), timeout=5) as dialed:
                        dialed.sendall(str(me).encode())
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        for _ in range(len(peers) - 1):
            conn, _ = server.accept()
            with conn:
                heard.append(int(conn.recv(16)))
    return {"peers": peers, "heard": sorted(heard)}


def test_peers_env_gives_every_rank_each_peers_own_address(spark) -> None:
    out = run_in_spark_tasks(dial_every_peer, spark=spark, ranks=2, peers_env=peers_env)
    # Rank 0 heard from rank 1 on the address rank 1 was given, and the
    # addresses were two (one a rank), as TF_CONFIG lists its workers.
    assert out["heard"] == [1] and len(set(out["peers"])) == 2


def test_task_ranks_splits_the_world_into_tasks() -> None:
    assert task_ranks(4, 2) == [range(0, 2), range(2, 4)]
    assert task_ranks(3, 2) == [range(0, 2), range(2, 3)]
    assert task_ranks(2, 1) == [range(0, 1), range(1, 2)]


def test_a_run_over_a_dataframe_reads_each_partition_in_its_own_task(spark) -> None:
    """pyspark's ``_train_on_dataframe`` contract in Spark's tasks: the stage
    runs over the DataFrame itself, rank ``i`` reading partition ``i``
    through pyspark's own loader; pyspark's refusals, with its messages,
    and no rank started by a refused run."""
    from pyspark import cloudpickle

    import tests.train_fns as train_fns
    from raydist.compat._dataframe import frame_inputs

    cloudpickle.register_pickle_by_value(train_fns)
    rows = [(float(i % 2), [float(i), float(-i)]) for i in range(10)]
    schema = "label double, features array<double>"
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), schema)  # rows 0-4, then 5-9
    out = run_in_spark_tasks(functools.partial(train_fns.partition_probe_fn, 5), spark=spark, ranks=2,
                             inputs=frame_inputs(df, 2))
    seen = {r["rank"]: r for r in out["ranks"]}
    assert seen[0]["rows"] == [[lab, f] for lab, f in rows[:5]]
    assert seen[1]["rows"] == [[lab, f] for lab, f in rows[5:]]
    assert all(r["files"] == ["data.arrow", "schema.json"] and r["files_exist"] for r in seen.values())

    with pytest.raises(ValueError, match="requires setting num_processes equal to input spark dataframe partition"):
        run_in_spark_tasks(functools.partial(train_fns.partition_probe_fn, 5), spark=spark, ranks=2,
                           inputs=frame_inputs(spark.createDataFrame(spark.sparkContext.parallelize(rows, 1), schema),
                                               2))
    with pytest.raises(ValueError, match="Empty Spark partition is not allowed"):
        run_in_spark_tasks(functools.partial(train_fns.partition_probe_fn, 5), spark=spark, ranks=2,
                           inputs=frame_inputs(spark.createDataFrame(spark.sparkContext.parallelize(rows[:1], 2),
                                                                     schema), 2))
