"""The control plane's SparkSession owner: what it tells an RPC on the event
loop comes from memory, never from a call into Spark."""

from __future__ import annotations

import threading
import time

import pytest

from raydist.control.sparkhost import SparkHost

pytestmark = pytest.mark.unit


class _Side:
    """A Spark side whose every read may hang, as a stuck JVM's py4j calls do."""

    def __init__(self) -> None:
        self.reads = 0
        self.hung = threading.Event()

    def _read(self, value: str) -> str:
        self.reads += 1
        if self.hung.is_set():
            time.sleep(30)
        return value

    @property
    def master(self) -> str:
        return self._read("local-cluster[2,1,1024]")

    @property
    def ui_url(self) -> str:
        return self._read("http://driver:4040")


def test_server_info_is_read_once_per_session_and_never_waits_on_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    side = _Side()
    monkeypatch.setattr("raydist.engine.sides.side_of", lambda spark: side)
    host = SparkHost(lambda: object())
    assert host.info() == ("", "")  # not started yet
    host.start(lambda running, reason: None, threading.Event())
    side.hung.set()  # the JVM hangs now
    for _ in range(100):
        assert host.info() == ("local-cluster[2,1,1024]", "http://driver:4040")
    assert side.reads == 2  # once each, as the session started
    host.lose("its SparkContext died")
    assert host.info() == ("", "")  # a lost session names nothing
