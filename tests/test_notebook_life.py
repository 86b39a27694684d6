"""A notebook's whole life around the session cluster and raydist.up, each a
user's program run as a script on classic Spark: at the end the process is
alive, the results are right, and nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.probe import recorded_original, run_program

pytestmark = pytest.mark.integration

KEYS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


@pytest.mark.timeout(900)
def test_a_notebooks_life_keeps_the_process_whole(no_leftover_ray) -> None:
    """The user's program from start to end: four session clusters and the
    Ctrl-C runs (each waits for the interrupted job's slots) make it the
    suite's longest single program (about 4 min here). pyspark's run of the
    same program is recorded in tests/originals.json."""
    ours = run_program("notebook_life.py", timeout=800)
    theirs = recorded_original("notebook_life.py")

    # Every run trains, with the result Spark's own distributor gave, and the
    # function sees the command line it sees there.
    assert [ours[r]["loss"] for r in ("run1", "run1b", "run2", "run5", "run7")] == \
        [theirs[r]["loss"] for r in ("run1", "run1b", "run2", "run5", "run7")]
    assert ours["run3"]["loss"] == ours["run4"]["loss"] == ours["run6"]["loss"] == theirs["run1"]["loss"]
    runs = ("run1", "run1b", "run2", "run3", "run4", "run5", "run6", "run7")
    assert all(ours[r]["world"] == 2 for r in runs)
    assert ours["run1"]["argv"] == theirs["run1"]["argv"] == []
    # The second run forked from the same warm worker, into a new process.
    assert ours["run1b"]["parent"] == ours["run1"]["parent"] and ours["run1b"]["pid"] != ours["run1"]["pid"]

    # DeepSpeed's config reaches the function on the command line, as under
    # Spark, on the same session cluster; the file is gone afterwards.
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
    for got in (ours["deepspeed"], theirs["deepspeed"]):
        assert got["deepspeed"] is True and got["config"] == config
    assert ours["deepspeed_file_left"] is False
    assert ours["cluster1"] and ours["cluster_deepspeed"] == ours["cluster1"]

    # The user's Spark job got every slot: the session cluster gave its worker
    # nodes' slots back and kept its head (on the driver, it holds none), and
    # this process's connection to it. The other work outlasts Ray's GCS
    # reconnect timeout: the head still answers, the process stays whole, and
    # the next run trains on the same cluster, grown again.
    assert ours["spark_job"] == theirs["spark_job"]
    assert ours["cluster_after_spark_job"] == ours["cluster1"] and ours["connected_after_spark_job"] is True
    assert ours["workers_after_spark_job"] == 0
    assert ours["other_work_rows"] is True
    assert ours["cluster_run2"] == ours["cluster1"]

    # Each time the session cluster went (idle, spark.stop), its warm
    # run ended first: no raydist thread still waited in Ray when the
    # connection ended (Ray frees its core worker under such a thread: SIGSEGV).
    assert ours["disconnects"] >= 2 and ours["threads_in_ray_at_disconnect"] == []

    # Idle past keep_warm_s: gone by itself, and the next run started another.
    assert ours["cluster_after_idle"] is None and ours["connected_after_idle"] is False
    assert ours["cluster_idle_replaced"] is True

    # Ctrl-C in the middle of a run raises KeyboardInterrupt, as Spark's does,
    # and the next run works (on a warm run and on the facade's own run).
    assert theirs["interrupted"]["raised"] == "KeyboardInterrupt"
    assert ours["interrupted"]["raised"] == "KeyboardInterrupt"
    assert ours["interrupted_fresh"]["raised"] == "KeyboardInterrupt"

    # spark.stop() ends the session cluster; a new SparkSession trains again;
    # at the end nothing runs, and the environment is as it was.
    assert ours["cluster_after_stop"] is None and ours["connected_after_stop"] is False
    assert ours["ray_processes_after_stop"] == [] and ours["reapers_after_stop"] == []
    assert ours["env_after"] == ours["env_before"] == {k: None for k in KEYS}


@pytest.mark.timeout(900)
def test_threads_training_at_once_share_the_session_cluster(no_leftover_ray) -> None:
    """Two user threads train at once, small runs and a large one, on one
    session cluster: about 90 s here, two fresh Ray Train fits in a program
    that imports torch."""
    out = run_program("two_threads.py", timeout=800)
    assert out["errors"] == []
    assert [r["world"] for r in out["small"]] == [2, 2]
    assert [r["world"] for r in out["big"]] == [4]
    assert out["bigger_nodes"]["world"] == 2
    # Every run computed what one process computes here.
    for r in [*out["small"], *out["big"], out["bigger_nodes"]]:
        assert r["loss"] == out["expected"]
    # Bigger nodes replaced the cluster (once no run used it); more nodes of
    # the same size did not. One reaper per live session cluster, at every look.
    assert len(out["session_clusters"]) == 2
    assert out["max_reapers"] == 1 and out["reapers_while_a_cluster_lives"] == [1]
    assert out["reapers_after_stop"] == [] and out["ray_processes_after_stop"] == []


@pytest.mark.timeout(600)
def test_two_clusters_up_in_one_process(no_leftover_ray) -> None:
    out = run_program("two_ups.py", timeout=500)
    c1, c2 = out["addresses"]
    # The newest up is the default; ray.init reaches each while it is up.
    assert out["default_with_both"] == out["plain_init_with_both"] == out["subprocess_with_both"] == c2
    assert out["init_c1_with_both"] == out["client_c1_with_both"] == c1
    # c2 goes: the user's own connection to it ends first, and c1 is the default again.
    assert out["connected_after_c2_down"] is False
    assert out["default_after_c2_down"] == out["plain_init_after_c2_down"] == out["subprocess_after_c2_down"] == c1
    # c1 goes (over Ray Client this time): the environment is as before. Ray's
    # own ray.init sets PYTHONBREAKPOINT (to its debugger), raydist nothing.
    assert out["connected_after_c1_down"] is False
    assert out["env_after"] == {k: None for k in KEYS}
    assert set(out["env_changed"]) <= {"PYTHONBREAKPOINT"}



def test_a_loopback_address_is_the_one_ray_connects(no_leftover_ray) -> None:
    """A head bound to 127.0.0.1 (a Spark Connect server's default driver
    host) is connected as this machine's address: the session cluster and a
    teardown's disconnect must know it for the same cluster (or a retired
    cluster's GCS takes the process down 60 s later)."""
    code = textwrap.dedent("""
        import json, ray
        from raydist.engine.connection import connected_address, same_address
        ray.init(num_cpus=1, include_dashboard=False)
        seen = connected_address()
        port = seen.rpartition(":")[2]
        print(json.dumps([seen, same_address(f"127.0.0.1:{port}", seen), same_address(f"localhost:{port}", seen)]))
        ray.shutdown()
    """)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen, loopback, name = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loopback and name, seen
