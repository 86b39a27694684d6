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

from tests.probe import run_original, run_program

pytestmark = pytest.mark.integration

KEYS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


@pytest.mark.timeout(1500)  # 90 s of other work, five session clusters, and the original's program
def test_a_notebooks_life_keeps_the_process_whole(no_leftover_ray) -> None:
    ours = run_program("notebook_life.py", timeout=1200)
    theirs = run_original("notebook_life.py", timeout=480)

    runs = ("run1", "run2", "run3", "run4", "run5", "run6", "run7")
    # Every run trains, with the same result as Spark's own distributor.
    assert {ours[r]["loss"] for r in runs} == {theirs[r]["loss"] for r in ("run1", "run2", "run5", "run7")}
    assert all(ours[r]["world"] == 2 for r in runs)

    # The user's Spark job got every slot; the session cluster went, and this
    # process let go of it first (else Ray ends the process a minute later,
    # which the 90 s of other work would have shown).
    assert ours["spark_job"] == theirs["spark_job"]
    assert ours["cluster_after_spark_job"] is None and ours["connected_after_spark_job"] is False
    assert ours["other_work_rows"] is True

    # Each time the session cluster went (its slots, idle, spark.stop), its warm
    # run ended first: no raydist thread still waited in Ray when the
    # connection ended (Ray frees its core worker under such a thread: SIGSEGV).
    assert ours["disconnects"] >= 3 and ours["threads_in_ray_at_disconnect"] == []

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
