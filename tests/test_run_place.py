"""What sends a distributor's run to Ray rather than Spark's tasks, and the
setting that chooses (RAYDIST_FIRST_RUN): the distributor's side of
session_rules.where_to_run."""

from __future__ import annotations

import pytest

from raydist.compat.mirrored_strategy import MirroredStrategyRunner
from raydist.compat.torch_distributor import SPARK_TASKS_INPUT_LIMIT, TorchDistributor
from raydist.errors import TrainingConfigError
from raydist.train.runtime import RankInputs
from raydist.train.session_spark_runs import FIRST_RUN_ENV, first_run_setting

pytestmark = pytest.mark.unit


def inputs(*values: object) -> RankInputs:
    return RankInputs(list(values), lambda value, where: {})


@pytest.mark.parametrize("use_gpu", [False, True])
def test_a_plain_run_needs_no_ray(use_gpu: bool) -> None:
    assert not TorchDistributor(2, local_mode=False, use_gpu=use_gpu)._needs_ray(None)


@pytest.mark.parametrize("kwargs", [{"cluster": "mine"}, {"max_failures": 1}, {"max_failures": -1}])
def test_what_only_ray_serves_goes_to_ray(kwargs: dict) -> None:
    distributor = TorchDistributor(2, local_mode=False, **{"use_gpu": False, **kwargs})
    assert distributor._needs_ray(None)


@pytest.mark.parametrize("kwargs", [{"cluster": "mine"}, {"max_failures": 1}, {"use_gpu": True}])
def test_a_mirrored_run_goes_to_ray_for_the_same_reasons_and_gpus(kwargs: dict) -> None:
    """spark-tensorflow-distributor gives each worker all its task's GPUs,
    a layout Spark's tasks do not give ranks here yet: GPU runs stay on Ray."""
    assert not MirroredStrategyRunner(2, use_gpu=False)._needs_ray()
    assert MirroredStrategyRunner(2, **{"use_gpu": False, **kwargs})._needs_ray()


def test_small_partitions_travel_with_the_stage_and_big_ones_through_rays_object_store() -> None:
    distributor = TorchDistributor(2, local_mode=False, use_gpu=False)
    assert not distributor._needs_ray(inputs(b"a" * 1000, b"b" * 1000))
    half = SPARK_TASKS_INPUT_LIMIT // 2
    assert distributor._needs_ray(inputs(b"a" * half, b"b" * (half + 1)))
    assert distributor._needs_ray(inputs(b"a", object()))  # no size to judge by: Ray


def test_the_setting_defaults_to_sparks_tasks_and_names_itself_when_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FIRST_RUN_ENV, raising=False)
    assert first_run_setting() == "spark"
    monkeypatch.setenv(FIRST_RUN_ENV, " Ray ")
    assert first_run_setting() == "ray"
    monkeypatch.setenv(FIRST_RUN_ENV, "tasks")
    with pytest.raises(TrainingConfigError, match=FIRST_RUN_ENV):
        first_run_setting()
