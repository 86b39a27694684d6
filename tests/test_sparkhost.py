"""The control plane's SparkSession owner: what it tells an RPC on the event
loop comes from memory, never from a call into Spark."""

from __future__ import annotations

import threading
import time

import pytest

from raydist.control.sparkhost import SparkHost
from tests.probe import until

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
    monkeypatch.setattr("raydist.engine.spark.sides.side_of", lambda spark: side)
    host = SparkHost(lambda: object())
    assert host.info() == ("", "")  # not started yet
    host.start(lambda running, reason: None, threading.Event())
    side.hung.set()  # the JVM hangs now
    for _ in range(100):
        assert host.info() == ("local-cluster[2,1,1024]", "http://driver:4040")
    assert side.reads == 2  # once each, as the session started
    host.lose("its SparkContext died")
    assert host.info() == ("", "")  # a lost session names nothing


class _Manager:
    """The part of the ClusterManager the Spark watch uses; its tear-down fails once."""

    def __init__(self, host: SparkHost) -> None:
        self.spark_host = host
        self.died = 0

    def spark_died(self, host: SparkHost) -> list[str]:
        assert host is self.spark_host
        self.died += 1
        self.spark_host.lose("its SparkContext died")
        if self.died == 1:
            raise OSError("database or disk is full")
        return []

    def restart(self, names: list[str]) -> None:  # pragma: no cover - nothing asks to come back here
        raise AssertionError(names)


def test_the_spark_watch_outlives_a_failed_heal_and_the_server_gets_a_spark_again(monkeypatch) -> None:
    from raydist.control import server

    class _Dying:
        def __init__(self) -> None:
            self.alive_now = True

        def alive(self) -> bool:
            return self.alive_now

    made: list[object] = []
    sides: dict[int, _Dying] = {}

    def factory() -> object:
        made.append(session := object())
        sides[id(session)] = _Dying()
        return session

    monkeypatch.setattr("raydist.engine.spark.sides.side_of", lambda spark: sides[id(spark)])
    monkeypatch.setattr(server, "SPARK_CHECK_S", 0.01)
    monkeypatch.setattr(server, "_freeze_heap", lambda: None)  # the server's heap, not this test process's
    host = SparkHost(factory)
    manager = _Manager(host)
    stop = threading.Event()
    watch = threading.Thread(target=server._keep_spark, args=(manager, lambda running, reason: None, stop),
                             daemon=True)
    watch.start()
    for _ in range(2):  # two deaths: the first heal fails in the middle, the second does not
        assert until(lambda: host.started), "no Spark after a death"
        count = len(made)
        sides[id(made[-1])].alive_now = False
        assert until(lambda: len(made) > count), "the watch did not notice the death"  # noqa: B023
    assert until(lambda: host.started)
    stop.set()
    watch.join(10)
    assert manager.died == 2 and len(made) == 3 and host.started  # a Spark after each death
