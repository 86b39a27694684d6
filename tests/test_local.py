"""LocalRun: local_mode processes forked from one warm process (no cluster)."""

from __future__ import annotations

import os

import pytest

from raydist.errors import ClusterFailedError
from raydist.train.local import LocalRun

from . import train_fns

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def local():
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(train_fns)
    run = LocalRun(keep_warm_s=60)
    yield run
    run.close()
    assert not run.alive
    cloudpickle.unregister_pickle_by_value(train_fns)


def test_ranks_get_torchrun_environment_and_a_working_process_group(local) -> None:
    first = local.run(lambda: train_fns.warm_probe_fn("first"), 2)
    second = local.run(lambda: train_fns.warm_probe_fn("second"), 2)
    for out in (first, second):
        assert out["rank"] == "0" and out["world"] == "2" and out["sum_of_ranks_plus_one"] == 3.0
    assert second["worker"] == first["worker"] != os.getpid()  # the same warm parent
    assert second["process"] != first["process"]
    assert first["left_by_earlier_run"] is None and second["left_by_earlier_run"] is None


def test_a_rank_error_is_raised_here_with_the_rank(local) -> None:
    with pytest.raises(ValueError, match="bad batch on rank 1") as caught:
        local.run(train_fns.fails_on_rank_1, 2)
    assert any("rank 1" in note for note in caught.value.__notes__)


def test_each_run_sees_the_drivers_current_environment_and_directory(local, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAYDIST_TEST_SETTING", "after-start")
    monkeypatch.chdir(tmp_path)
    got = local.run(lambda: (os.environ.get("RAYDIST_TEST_SETTING"), os.getcwd()), 1)
    assert got == ("after-start", str(tmp_path))


def test_a_dead_rank_fails_the_run(local) -> None:
    import signal
    import time

    def dies_on_rank_1() -> None:
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # rank 0 would wait for rank 1 forever: it is stopped

    with pytest.raises(ClusterFailedError, match="rank 1 was killed by SIGKILL"):
        local.run(dies_on_rank_1, 2)
    assert local.run(lambda: 7, 1) == 7  # the forker stays usable


def test_the_forker_ends_when_idle_and_the_next_run_starts_another() -> None:
    import time

    run = LocalRun(keep_warm_s=0.5, preload=())
    try:
        first = run.run(os.getppid, 1)
        deadline = time.monotonic() + 30
        while run.alive and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not run.alive  # it gave its memory back
        second = run.run(os.getppid, 1)
        assert second != first  # a new forker
    finally:
        run.close()
