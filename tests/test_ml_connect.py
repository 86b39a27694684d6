"""pyspark.ml.connect programs with one import changed: a Pipeline with
LogisticRegression on two training workers, its predictions, save/load, and
a parallel CrossValidator, on a classic session (the Connect run of the same
program is in test_connect.py, beside the suite's Connect server). pyspark's
own run of the program is recorded in tests/originals.json."""

from __future__ import annotations

import pytest

from tests.probe import recorded_original, run_program

pytestmark = pytest.mark.integration

MASTER = "local-cluster[2,1,1024]"


def assert_fits_as_pyspark(ours: dict, theirs: dict) -> None:
    """What a user compares: the same weights (float tolerance), columns,
    predictions and probabilities as pyspark's fit of the same program."""
    assert ours["weights"].keys() == theirs["weights"].keys() == {"weight", "bias"}
    def flat(values: list) -> list[float]:
        return [v for row in values for v in (row if isinstance(row, list) else [row])]

    for key in ("weight", "bias"):
        assert flat(ours["weights"][key]) == pytest.approx(flat(theirs["weights"][key]), abs=1e-5), key
    assert ours["columns"] == theirs["columns"] == ["label", "features", "scaled", "prediction", "probability"]
    assert ours["predictions"] == theirs["predictions"]
    for mine, its in zip(ours["probability"], theirs["probability"], strict=True):
        assert mine == pytest.approx(its, abs=1e-5)
    # pyspark's own model cannot load what it saved under torch >= 2.6; raydist's does, and predicts the same.
    assert theirs["same_after_load"].startswith("UnpicklingError"), theirs["same_after_load"]
    assert ours["same_after_load"] is True
    assert ours["estimator_round_trip"] == ["raydist.compat.ml.connect.classification", 2, 0.1]
    # A CrossValidator over two learning rates (its folds are random, in pyspark's too: not compared).
    assert len(ours["cv_metrics"]) == 2 and all(0.5 < m <= 1.0 for m in ours["cv_metrics"]), ours["cv_metrics"]


@pytest.mark.timeout(900)
def test_a_pyspark_ml_connect_program_fits_on_raydist_as_on_pyspark(tmp_path, no_leftover_ray) -> None:
    """One program: a fit, a save/load and a 2x2 parallel CrossValidator
    (five fits): about 2 min here, most of it the fits' own Spark jobs and
    one session cluster start per fit."""
    ours = run_program("ml_connect_user.py", "--master", MASTER, home=tmp_path)
    assert_fits_as_pyspark(ours, recorded_original("ml_connect_user.py", "--master", MASTER))
