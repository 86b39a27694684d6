"""Live progress of a facade run: one concise line per report from rank 0.

Ray Train logs every worker's every report raw, through the driver's log
stream (``Reporting training result 3: TrainingReport(checkpoint=None,
metrics={...}, validation=False) from rank 1``). raydist shows rank 0's
instead: the run's controller (a callback, in its own process) puts each of
rank 0's reports into the cluster's key-value store under the run's key, and
a thread on the driver shows them as they come:

- on a terminal, one line per report (``report 3 · epoch 2 · loss 0.3333``),
  or a ``rich`` progress bar when the report carries a ``total`` (with
  ``step`` or ``epoch``, counted from 0);
- otherwise under ``logging`` (logger ``raydist.train.progress``, INFO), so a
  script or a job log stays quiet unless it asks.

The workers' raw lines are turned off (that Ray Train logger to WARNING, in
the workers only). Nothing here can fail a run: a store that cannot be read
ends the display, not the training.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ReportsToDriver", "quiet_reports", "shown_progress", "describe"]

log = logging.getLogger("raydist.train.progress")

#: The key-value store's namespace for runs' reports.
NAMESPACE = "raydist_progress"
#: How often the driver looks for new reports (seconds).
POLL_S = 0.25


def describe(n: int, metrics: dict[str, Any]) -> str:
    """One report as a line: its number, then epoch and step first, then
    the other metrics (floats to 4 significant digits)."""
    def shown(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    first = [k for k in ("epoch", "step") if k in metrics]
    rest = sorted(k for k in metrics if k not in first and k != "total" and not k.startswith("_"))
    return " · ".join([f"report {n}", *(f"{k} {shown(metrics[k])}" for k in [*first, *rest])])


def _callback_base() -> type:
    from ray.train import UserCallback

    return UserCallback


class ReportsToDriver(_callback_base()):  # type: ignore[misc]
    """Runs in the run's controller: rank 0's report, each time, into the
    cluster's key-value store under ``key``."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.count = 0

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        from ray.experimental import internal_kv

        try:
            self.count += 1
            record = {"metrics": metrics[0] if metrics else {}, "checkpoint": checkpoint is not None}
            internal_kv._internal_kv_put(f"{self.key}/{self.count}", json.dumps(record, default=str),
                                         namespace=NAMESPACE)
            internal_kv._internal_kv_put(f"{self.key}/count", str(self.count), namespace=NAMESPACE)
        except Exception:  # noqa: BLE001 - progress is a courtesy; the run goes on
            logging.getLogger(__name__).debug("could not pass a report on", exc_info=True)


def quiet_reports(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` in a worker whose raw per-report lines are off."""
    @functools.wraps(fn)  # Ray Train reads the signature (a config argument or none) through this
    def quiet(*args: Any, **kwargs: Any) -> Any:
        try:
            from ray.train.v2._internal.execution import context

            logging.getLogger(context.__file__).setLevel(logging.WARNING)  # Ray names that logger by its file
        except Exception:  # noqa: BLE001 - another Ray: its lines stay
            pass
        return fn(*args, **kwargs)

    return quiet


class _Display:
    """Shows reports: a bar, lines, or log records (see the module docstring)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self._bar: Any = None
        self._task: Any = None

    def show(self, n: int, metrics: dict[str, Any]) -> None:
        line = describe(n, metrics)
        if not self.tty:
            log.info("%s: %s", self.label, line)
            return
        total = metrics.get("total")
        done = metrics.get("step", metrics.get("epoch"))
        if isinstance(total, (int, float)) and isinstance(done, (int, float)) and total > 0:
            self._advance(float(done) + 1, float(total), line)
            return
        from rich.console import Console

        Console(stderr=True, highlight=False).print(f"[dim]{self.label}[/dim] {line}")

    def _advance(self, done: float, total: float, line: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self._bar is None:
            self._bar = Progress(TextColumn(f"[dim]{self.label}[/dim]"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(line, total=total)
        self._bar.update(self._task, completed=done, total=total, description=line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


@contextlib.contextmanager
def shown_progress(label: str) -> Iterator[ReportsToDriver]:
    """Around one run on the driver (connected to its cluster): yields the
    callback to give the run; shows its reports until the block ends."""
    from ray.experimental import internal_kv

    callback = ReportsToDriver(f"run-{uuid.uuid4().hex}")
    display = _Display(label)
    stop = threading.Event()
    shown = 0

    def poll() -> None:
        nonlocal shown
        try:
            count = internal_kv._internal_kv_get(f"{callback.key}/count", namespace=NAMESPACE)
            for n in range(shown + 1, int(count or 0) + 1):
                raw = internal_kv._internal_kv_get(f"{callback.key}/{n}", namespace=NAMESPACE)
                shown = n
                if raw:
                    display.show(n, json.loads(raw)["metrics"])
        except Exception:  # noqa: BLE001 - progress is a courtesy: stop showing, never fail the run
            logging.getLogger(__name__).debug("could not read a run's reports", exc_info=True)
            stop.set()

    def watch() -> None:
        while not stop.wait(POLL_S):
            poll()

    thread = threading.Thread(target=watch, name="raydist-progress", daemon=True)
    thread.start()
    try:
        yield callback
    finally:
        stop.set()
        thread.join()
        poll()  # the last reports, which may have come after the last look
        display.close()
        with contextlib.suppress(Exception):
            internal_kv._internal_kv_del(f"{callback.key}/", del_by_prefix=True, namespace=NAMESPACE)
