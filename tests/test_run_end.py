"""How the tasks of a run in Spark's tasks agree that it ended
(raydist.train._run_end): task 0's listener and every task's link, over real
sockets on loopback, as three tasks of one run would use them."""

from __future__ import annotations

import select
import socket
import threading

import pytest

from raydist.train._run_end import EndLink, EndListener

pytestmark = pytest.mark.component

KEY = "k" * 32


def stopped_within(link: EndLink, seconds: float) -> bool:
    ready, _, _ = select.select([link], [], [], seconds)
    if ready:
        link.read()
    return link.stopped


def closes_within(listener: EndListener, seconds: float) -> bool:
    done = threading.Event()
    threading.Thread(target=lambda: (listener.close(), done.set()), daemon=True).start()
    return done.wait(seconds)


def test_a_run_whose_ranks_all_succeed_ends_when_every_task_has_said_so() -> None:
    listener = EndListener("127.0.0.1", KEY, 3)
    links = [EndLink("127.0.0.1", listener.port, KEY, task) for task in range(3)]
    for link in links[:2]:
        link.say(True)
    assert not closes_within(listener, 0.5)  # task 2 has not spoken: task 0 stays
    links[2].say(True)
    assert closes_within(listener, 5)
    assert not any(link.stopped for link in links)
    for link in links:
        link.close()


def test_one_failure_stops_every_other_task_at_once() -> None:
    listener = EndListener("127.0.0.1", KEY, 3)
    links = [EndLink("127.0.0.1", listener.port, KEY, task) for task in range(3)]
    links[1].say(False)
    assert stopped_within(links[0], 5) and stopped_within(links[2], 5)
    for link in (links[0], links[2]):
        link.say(False)
    assert closes_within(listener, 5)
    for link in links:
        link.close()


def test_a_task_that_hangs_up_without_a_word_counts_as_failed() -> None:
    listener = EndListener("127.0.0.1", KEY, 2)
    links = [EndLink("127.0.0.1", listener.port, KEY, task) for task in range(2)]
    links[1].close()  # its Python worker died, say
    assert stopped_within(links[0], 5)
    links[0].say(False)
    assert closes_within(listener, 5)
    links[0].close()


def test_a_stranger_without_the_runs_key_is_not_heard() -> None:
    listener = EndListener("127.0.0.1", KEY, 2)
    with socket.create_connection(("127.0.0.1", listener.port)) as stranger:
        stranger.sendall(b"wrongkey 1\nfailed\n")
        links = [EndLink("127.0.0.1", listener.port, KEY, task) for task in range(2)]
        assert not stopped_within(links[0], 0.5)  # the forged failure stopped nobody
        for link in links:
            link.say(True)
        assert closes_within(listener, 5)
        for link in links:
            link.close()
