"""How a run's reports are shown, alone (tests/test_train.py runs them through a real run)."""

from __future__ import annotations

import logging

import pytest

from raydist.train._progress import _Display, describe

pytestmark = pytest.mark.unit


def test_a_report_is_one_line_epoch_and_step_first() -> None:
    line = describe(3, {"loss": 0.333333333, "epoch": 2, "acc": 0.5, "step": 10, "total": 40, "_private": 1})
    assert line == "report 3 · epoch 2 · step 10 · acc 0.5 · loss 0.3333"


def test_off_a_terminal_reports_go_to_logging(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    display = _Display("TorchTrainer")
    with caplog.at_level(logging.INFO, logger="raydist.train.progress"):
        display.show(1, {"epoch": 0, "loss": 1.0, "total": 4})  # no bar off a terminal, a record
    display.close()
    assert [r.getMessage() for r in caplog.records] == ["TorchTrainer: report 1 · epoch 0 · loss 1"]
