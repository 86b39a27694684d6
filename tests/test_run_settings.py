"""raydist's settings for its own Ray Train runs reach Ray Train's controller
through the starting thread's context, never os.environ
(raydist.train._env)."""

from __future__ import annotations

import contextvars
import os
import threading

import pytest

from raydist.train._env import run_settings

pytestmark = pytest.mark.unit

KEY = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def propagated() -> dict[str, str]:
    """What Ray Train hands the controller of a run started here and now."""
    from ray.train.v2.api import data_parallel_trainer as dpt

    return dict(dpt.get_env_vars_to_propagate())


def in_thread(fn) -> object:
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join(10)
    return box[0]


def test_a_run_started_in_the_block_gets_the_settings_and_the_environment_is_untouched(monkeypatch) -> None:
    monkeypatch.delenv(KEY, raising=False)
    propagated()  # importing Ray Train sets variables of its own
    before = dict(os.environ)
    with run_settings({KEY: "0.2"}):
        assert propagated()[KEY] == "0.2"
        assert dict(os.environ) == before
        with run_settings({KEY: "2"}):  # an inner block wins for its runs
            assert propagated()[KEY] == "2"
        assert propagated()[KEY] == "0.2"
        # Another thread (a user's own run beside raydist's) sees none of it;
        # a thread started in a copy of this context does.
        assert KEY not in in_thread(propagated)
        context = contextvars.copy_context()
        assert in_thread(lambda: context.run(propagated))[KEY] == "0.2"
    assert KEY not in propagated()


def test_the_users_own_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY, "7")
    with run_settings({KEY: "0.2"}):
        assert propagated()[KEY] == "7"
