"""The path Spark users take: their program, one import changed, run as a
script with no cluster= and no RAY_ADDRESS, next to the same program on
pyspark's own distributors."""

from __future__ import annotations

import pytest

from tests.probe import run_original, run_program

pytestmark = pytest.mark.integration


@pytest.mark.timeout(1200)  # two whole programs; DeepSpeed compiles its CPU ops on first use in a new venv
def test_a_spark_users_program_runs_unchanged_on_the_session_cluster(no_leftover_ray) -> None:
    ours = run_program("spark_user.py")
    theirs = run_original("spark_user.py")

    # Same training results, and what the function sees of its command line.
    assert [r["loss"] for r in ours["runs"][:2]] == [r["loss"] for r in theirs["runs"]]
    assert ours["runs"][0]["argv"] == theirs["runs"][0]["argv"] == []
    # The second run forked from the same warm worker, into a new process.
    first, second = ours["runs"][:2]
    assert second["parent"] == first["parent"] and second["pid"] != first["pid"]

    # DeepSpeed's config reaches the function on the command line, as under Spark,
    # and the file is gone afterwards.
    for got in (ours["deepspeed"], theirs["deepspeed"]):
        assert got["deepspeed"] is True
        assert got["config"] == {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
    assert ours["deepspeed_file_left"] is False

    # One session cluster served every run; an idle one gave its slots to a
    # plain Spark job; training again started a new one; spark.stop() ended it.
    assert ours["session_cluster"] and ours["session_cluster"] == ours["session_cluster_torch"]  # DeepSpeed reused it
    assert ours["spark_job"] == 45
    assert ours["session_cluster_after_spark_job"] is None
    assert ours["runs"][2]["loss"] == ours["runs"][0]["loss"]
    assert ours["session_cluster_again"] not in (None, ours["session_cluster"])
    assert ours["session_cluster_after_stop"] is None
    assert ours["ray_processes_after_stop"] == []


@pytest.mark.timeout(900)
def test_notebook_habits_and_plain_keras_work_with_no_other_call(tmp_path, no_leftover_ray) -> None:
    home = tmp_path / "home"
    out = run_program("notebook_user.py", home=home)
    # ray.init(address), plain ray.init() and Ray Client all reach both workers.
    assert out["by_address"] == out["plain"] == out["client"] == 2
    assert out["subprocess"] == ["CPUs 2.0"]  # a subprocess started afterwards inherits the cluster
    assert out["ray_address_before"] is None and out["ray_address_after_down"] is None
    token = (home / "ray_auth_token").read_text().strip()
    assert token and token not in out["_output"]  # the token is never printed

    # Plain Keras 3 code (`import keras`, model.fit) trains under the strategy.
    for name in ("keras3", "tf_keras"):
        losses = out[name]["losses"]
        assert len(losses) == 4 and all(v == v and v < float("inf") for v in losses), (name, losses)
        assert losses[-1] < losses[0], (name, losses)
    assert out["keras3"]["keras"].startswith("tf_keras")
