"""The path Spark users take: their program, one import changed, run as a
script with no cluster= and no RAY_ADDRESS, next to the same program on
pyspark's own distributors."""

from __future__ import annotations

import pytest

from tests.probe import run_program

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
def test_notebook_habits_and_plain_keras_work_with_no_other_call(tmp_path, no_leftover_ray) -> None:
    """A notebook's habits (ray.init in its three forms, Ray Client, plain
    Keras) in one program: about 75 s here, most of it importing TensorFlow
    and starting the session cluster once."""
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
    # ... in Spark's own tasks, as spark-tensorflow-distributor runs it: no session cluster after down().
    assert out["keras3"]["place"] == "spark"
