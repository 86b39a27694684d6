"""The MLflow context a rank receives, alone: what each rank sees, what it
leaves behind, what it never shows (tests/test_train.py and
tests/test_connect.py read back what real ranks logged to a real server)."""

from __future__ import annotations

import inspect
import os
import sys

import pytest

from raydist.errors import TrainingConfigError
from raydist.train._mlflow import MlflowContext, _absolute, configure_mlflow, driver_context, mlflow_settings

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-token-value"


def _ctx(**kw: object) -> MlflowContext:
    env = {"MLFLOW_TRACKING_URI": "http://tracking:5000", "MLFLOW_TRACKING_TOKEN": SECRET}
    return MlflowContext(env, **kw)  # type: ignore[arg-type]


def _seen() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_RUN_ID")}


def test_rank_zero_gets_the_run_the_others_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _ctx(run_id="r1", experiment_id="7")
    wrapped = ctx.wrap(_seen)
    monkeypatch.setenv("RANK", "0")
    assert wrapped() == {"MLFLOW_TRACKING_URI": "http://tracking:5000", "MLFLOW_TRACKING_TOKEN": SECRET,
                         "MLFLOW_RUN_ID": "r1"}
    monkeypatch.setenv("RANK", "1")
    assert wrapped()["MLFLOW_RUN_ID"] is None and wrapped()["MLFLOW_TRACKING_TOKEN"] == SECRET
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    wrapped()
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_RUN_ID" not in os.environ  # put back as found


def test_a_wrapped_function_keeps_its_signature_and_is_wrapped_once() -> None:
    def with_config(config: dict) -> int:
        return len(config)

    ctx = _ctx(run_id="r1")
    once = ctx.wrap(with_config)
    # Ray Train calls a training function with its config or without, by its signature.
    assert inspect.signature(once) == inspect.signature(with_config)
    assert once({"a": 1}) == 1
    assert ctx.wrap(once) is once and _ctx().wrap(once) is once


def test_the_context_never_shows_a_credential() -> None:
    shown = repr(_ctx(run_id="r1", experiment_id="7"))
    assert SECRET not in shown and "MLFLOW_TRACKING_TOKEN" in shown and "r1" in shown


def test_settings_name_a_wrong_key_or_value() -> None:
    before = mlflow_settings()
    with pytest.raises(TrainingConfigError) as caught:
        configure_mlflow(all_rank=True)
    assert caught.value.field == "all_rank" and "all_ranks" in str(caught.value)
    with pytest.raises(TrainingConfigError) as caught:
        configure_mlflow(figures="no")  # type: ignore[arg-type]
    assert caught.value.field == "figures"
    assert mlflow_settings() == before


def test_a_process_without_mlflow_pays_nothing_and_the_environment_is_passed_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "mlflow", raising=False)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(key, raising=False)
    assert driver_context() == (None, None)  # MLflow neither imported nor configured
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    monkeypatch.setenv("MLFLOW_RUN_ID", "r9")
    monkeypatch.setenv("DATABRICKS_TOKEN", SECRET)
    ctx, started = driver_context()
    assert "mlflow" not in sys.modules and started is None
    assert ctx is not None and ctx.run_id == "r9"
    assert ctx.env["DATABRICKS_TOKEN"] == SECRET and ctx.env["MLFLOW_TRACKING_URI"] == "http://tracking:5000"
    configure_mlflow(enabled=False)
    try:
        assert driver_context() == (None, None)
    finally:
        configure_mlflow(enabled=True)


def test_a_local_store_is_named_alike_from_every_working_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _absolute("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert _absolute("sqlite:////abs/mlflow.db") == "sqlite:////abs/mlflow.db"
    assert _absolute("mlruns") == f"{tmp_path}/mlruns"
    for unchanged in ("http://tracking:5000", "databricks", "file:///abs/mlruns", "databricks://profile"):
        assert _absolute(unchanged) == unchanged
