"""Runs in Spark's tasks first (RAYDIST_FIRST_RUN=spark, #32): a user's
program run as a script on classic Spark (its Connect twin is in
test_connect.py), from its first run to ``spark.stop()``."""

from __future__ import annotations

import pytest

from tests.probe import run_program

pytestmark = pytest.mark.integration

KEYS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def check_first_runs(ours: dict) -> None:
    """What a user sees of each run of tests/programs/first_runs.py."""
    assert ours["alive"] is True
    runs = ("run1", "run2", "run3", "run4", "run5")
    assert all(ours[r]["world"] == 2 and ours[r]["argv"] == [] for r in runs)
    # torchrun's environment on every rank, wherever it ran.
    for r in runs:
        seen = ours[r]["seen"]
        assert seen["RANK"] == "0" and seen["WORLD_SIZE"] == "2" and seen["MASTER_ADDR"], (r, seen)

    # The first runs waited for no Ray: they ran in Spark's tasks, and no Ray process started.
    assert ours["run1"]["place"] == ours["run2"]["place"] == "spark"
    assert ours["ray_after_run1"] == [] and ours["cluster_after_run1"] is False
    # A failing rank's error is raised as itself, naming the rank.
    assert ours["error"]["message"] == "bad input on every rank"
    assert any("rank" in note for note in ours["error"]["notes"]), ours["error"]
    assert ours["spark_job1"] == ours["spark_job2"] == ours["spark_job_expected"]

    # After a pause the session cluster was warm, and the next runs ran on it.
    assert ours["warm_after_pause"] is True
    assert ours["run3"]["place"] == ours["run4"]["place"] == "ray"
    # The user's Spark job took its slots back; the next run went to Spark's tasks again.
    assert ours["run5"]["place"] == "spark"

    # The same function gives the same result wherever it ran.
    assert ours["run1"]["loss"] == ours["run2"]["loss"] == ours["run3"]["loss"]
    assert ours["run4"]["loss"] == ours["run5"]["loss"] != ours["run1"]["loss"]

    # spark.stop() ended the session cluster; nothing runs, the environment is as it was.
    assert ours["cluster_after_stop"] is False and ours["ray_after_stop"] == []
    assert ours["env_after"] == ours["env_before"] == {k: None for k in KEYS}


@pytest.mark.timeout(600)
def test_first_runs_go_to_sparks_tasks_and_later_ones_to_the_warm_cluster(no_leftover_ray) -> None:
    """About 60 s: a Spark application, two runs in its tasks, the session
    cluster's warm-up during a pause, and three more runs."""
    ours = run_program("first_runs.py", "--master", "local-cluster[2,1,1024]", timeout=500)
    check_first_runs(ours)
