"""Places for strangers' connections (raydist.engine.link.admission), shared
by the node channel, the relay and the data agent, and the one back-off rule
of every retry loop (raydist.backoff)."""

from __future__ import annotations

import threading

import pytest

from raydist.backoff import Backoff
from raydist.engine.link.admission import Places

pytestmark = pytest.mark.unit


def test_one_address_cannot_take_every_place() -> None:
    places = Places(total=4, per_source=2)
    assert places.take("10.0.0.9") and places.take("10.0.0.9")
    assert not places.take("10.0.0.9")  # its share is taken
    assert places.take("10.0.0.1") and places.take(None)  # others still get in; no address counts in all only
    assert not places.take("10.0.0.2")  # full in all
    places.give_back("10.0.0.9")
    assert places.held("10.0.0.9") == 1 and places.held() == 3
    assert places.take("10.0.0.2")


def test_places_given_back_from_many_threads_add_up() -> None:
    places = Places(total=1000, per_source=1000)

    def churn() -> None:
        for _ in range(500):
            assert places.take("a")
            places.give_back("a")

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert places.held() == 0


def test_a_retry_backs_off_doubling_to_a_bound_and_starts_over_once_it_worked() -> None:
    delays = Backoff(0.1, 1.0)
    assert [delays.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    delays.reset()
    assert delays.next() == 0.1
    assert Backoff(0.5, 30.0).after(3) == 2.0 and Backoff(0.5, 30.0).after(10_000) == 30.0


def test_a_backoff_that_cannot_wait_is_refused() -> None:
    with pytest.raises(ValueError, match="0 < first <= most"):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError, match="0 < first <= most"):
        Backoff(2.0, 1.0)
