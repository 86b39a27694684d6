"""How the tasks of a run in Spark's tasks meet at task 0
(raydist.engine.spark.meeting): task 0's chair and every task's seat, over real
sockets on loopback, as the tasks of one run would use them."""

from __future__ import annotations

import secrets
import select
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from raydist.engine.spark.meeting import Chair, Seat, meeting_ports

pytestmark = pytest.mark.component

HOST = "127.0.0.1"


@pytest.fixture
def key() -> str:
    """Each test a run of its own (a chair's port is kept from other runs for a while)."""
    return secrets.token_hex(16)


def seats(chair: Chair | None, tasks: int, key: str, **join: Any) -> list[Seat]:
    """Every task's seat, each taken from its own thread as tasks would
    (the ones not task 0 finding the chair by the key's ports)."""
    with ThreadPoolExecutor(tasks) as pool:
        return list(pool.map(lambda t: Seat.join(HOST, [chair.port] if chair and t == 0 else meeting_ports(key),
                                                 key, t, {"task": t}, **join), range(tasks)))


def stopped_within(seat: Seat, seconds: float) -> bool:
    ready, _, _ = select.select([seat], [], [], seconds)
    if ready:
        seat.read()
    return seat.stopped


def closes_within(chair: Chair, seconds: float) -> bool:
    done = threading.Event()
    threading.Thread(target=lambda: (chair.close(), done.set()), daemon=True).start()
    return done.wait(seconds)


def test_every_task_finds_task_0_by_the_runs_key_and_hears_what_all_brought(key: str) -> None:
    chair = Chair(HOST, key, 3, meeting_ports(key))
    taken = seats(chair, 3, key)
    assert [seat.everyone for seat in taken] == [[{"task": 0}, {"task": 1}, {"task": 2}]] * 3
    for seat in taken:
        seat.say(True)
        seat.close()
    assert closes_within(chair, 5)


def test_a_task_that_dials_before_task_0_listens_finds_it_once_it_does(key: str) -> None:
    with ThreadPoolExecutor(1) as pool:
        early = pool.submit(Seat.join, HOST, meeting_ports(key), key, 1, {"task": 1})
        threading.Event().wait(0.5)
        chair = Chair(HOST, key, 2, meeting_ports(key))
        first = Seat.join(HOST, [chair.port], key, 0, {"task": 0})
        second = early.result(timeout=10)
    assert second.everyone == first.everyone == [{"task": 0}, {"task": 1}]
    for seat in (first, second):
        seat.say(True)
        seat.close()
    assert closes_within(chair, 5)


def test_task_0_takes_the_next_of_its_ports_when_one_is_taken_and_is_found_there(key: str) -> None:
    ports = meeting_ports(key)
    with socket.create_server((HOST, ports[0])) as squatter:  # answers nothing, as a stranger's server would
        squatter.listen()
        chair = Chair(HOST, key, 2, ports)
        assert chair.port in ports[1:]
        taken = seats(None, 2, key)
    assert taken[1].everyone == [{"task": 0}, {"task": 1}]
    for seat in taken:
        seat.say(True)
        seat.close()
    assert closes_within(chair, 5)


def test_a_run_whose_ranks_all_succeed_ends_when_every_task_has_said_so(key: str) -> None:
    chair = Chair(HOST, key, 3, meeting_ports(key))
    taken = seats(chair, 3, key)
    for seat in taken[:2]:
        seat.say(True)
    assert not closes_within(chair, 0.5)  # task 2 has not spoken: task 0 stays
    taken[2].say(True)
    assert closes_within(chair, 5)
    assert not any(seat.stopped for seat in taken)
    for seat in taken:
        seat.close()


def test_one_failure_stops_every_other_task_at_once(key: str) -> None:
    chair = Chair(HOST, key, 3, meeting_ports(key))
    taken = seats(chair, 3, key)
    taken[1].say(False)
    assert stopped_within(taken[0], 5) and stopped_within(taken[2], 5)
    for seat in (taken[0], taken[2]):
        seat.say(False)
    assert closes_within(chair, 5)
    for seat in taken:
        seat.close()


def test_a_task_that_hangs_up_without_a_word_counts_as_failed(key: str) -> None:
    chair = Chair(HOST, key, 2, meeting_ports(key))
    taken = seats(chair, 2, key)
    taken[1].close()  # its Python worker died, say
    assert stopped_within(taken[0], 5)
    taken[0].say(False)
    assert closes_within(chair, 5)
    taken[0].close()


def test_a_task_that_never_arrives_stops_the_run_before_it_begins(key: str) -> None:
    chair = Chair(HOST, key, 2, meeting_ports(key), meet_s=1.0)
    with pytest.raises(ConnectionError, match="stopped the run before it began"):
        Seat.join(HOST, [chair.port], key, 0, {"task": 0})
    assert closes_within(chair, 5)


def test_no_chair_is_a_clear_error_once_the_wait_is_over(key: str) -> None:
    with pytest.raises(ConnectionError, match="no task 0 of this run answered"):
        Seat.join(HOST, meeting_ports("another run")[:2], "another run", 1, {}, within_s=0.5)


def test_a_stranger_without_the_runs_key_is_not_heard_nor_believed(key: str) -> None:
    chair = Chair(HOST, key, 2, meeting_ports(key))
    with socket.create_connection((HOST, chair.port)) as stranger:
        stranger.sendall(b"wrongkey 1 {}\nfailed\n")
        taken = seats(chair, 2, key)
        assert not stopped_within(taken[0], 0.5)  # the forged failure stopped nobody
        for seat in taken:
            seat.say(True)
        assert closes_within(chair, 5)
        for seat in taken:
            seat.close()
    other = Chair(HOST, "o" * 32, 1, meeting_ports(key))  # another run's chair on this run's ports
    with pytest.raises(ConnectionError, match="no task 0"):  # does not prove this run's key: not believed
        Seat.join(HOST, [other.port], key, 1, {}, within_s=0.5)
    other.close(wait=False)


def test_the_tasks_of_a_retried_stage_pass_a_lingering_chair_by(key: str) -> None:
    ports = meeting_ports(key)
    gone = Chair(HOST, key, 2, ports)  # the attempt Spark gave up on: its meeting was whole, its worker not yet dead
    before = seats(gone, 2, key)
    again = Chair(HOST, key, 2, ports)  # the retried stage's task 0, on the next of the same ports
    assert again.port != gone.port
    now = seats(None, 2, key)  # every task of the new attempt tries the key's ports in order
    assert [seat.everyone for seat in now] == [[{"task": 0}, {"task": 1}]] * 2
    for seat in before + now:
        seat.say(True)
        seat.close()
    assert closes_within(gone, 5) and closes_within(again, 5)


def test_a_chair_never_seats_a_task_twice(key: str) -> None:
    chair = Chair(HOST, key, 2, meeting_ports(key))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(Seat.join, HOST, [chair.port], key, 0, {"task": 0})
        threading.Event().wait(0.3)
        with pytest.raises(ConnectionError, match="no task 0"):
            Seat.join(HOST, [chair.port], key, 0, {"task": "again"}, within_s=0.5)
        second = Seat.join(HOST, [chair.port], key, 1, {"task": 1})
        seated = first.result(timeout=5)
    assert seated.everyone == second.everyone == [{"task": 0}, {"task": 1}]
    for seat in (seated, second):
        seat.close()
    chair.close(wait=False)
