"""The process's default cluster as a stack, and environment changes only on
the user's threads (raydist.engine.connection), over a plain dict; the real
process and Ray are in tests/test_notebook_life.py."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raydist.engine.connection import DEFAULT_KEYS, DefaultEnv, ProcessRay, same_address
from raydist.engine.threads import on_raydist_thread, spawn

pytestmark = pytest.mark.unit


def cluster_env(n: int) -> dict[str, str]:
    return {"RAY_ADDRESS": f"10.0.0.{n}:6379", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": f"token-{n}"}


def test_the_newest_cluster_up_is_the_default_and_the_last_down_puts_back_what_was_there() -> None:
    environ = {"RAY_ADDRESS": "user:1", "PATH": "/bin"}
    before = dict(environ)
    stack = DefaultEnv(environ)
    a, b = object(), object()
    stack.push(a, cluster_env(1))
    stack.apply()
    assert environ == {**before, **cluster_env(1)}
    stack.push(b, cluster_env(2))
    stack.apply()
    assert environ == {**before, **cluster_env(2)}
    stack.remove(b)  # the newest goes: the one still up is the default again
    stack.apply()
    assert environ == {**before, **cluster_env(1)}
    stack.remove(a)
    stack.apply()
    assert environ == before


def test_an_older_cluster_going_first_leaves_the_newer_default() -> None:
    environ: dict[str, str] = {}
    stack = DefaultEnv(environ)
    a, b = object(), object()
    stack.push(a, cluster_env(1))
    stack.push(b, cluster_env(2))
    stack.apply()
    stack.remove(a)
    stack.apply()
    assert environ == cluster_env(2)  # not the dead cluster's address written back
    stack.remove(b)
    stack.apply()
    assert environ == {}


def test_a_variable_the_user_set_since_is_theirs() -> None:
    environ: dict[str, str] = {}
    stack = DefaultEnv(environ)
    a = object()
    stack.push(a, cluster_env(1))
    stack.apply()
    environ["RAY_ADDRESS"] = "mine:1"
    stack.remove(a)
    stack.apply()
    assert environ == {"RAY_ADDRESS": "mine:1"}


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=30),
       st.dictionaries(st.sampled_from(DEFAULT_KEYS), st.text(min_size=1, max_size=5)))
def test_any_order_of_ups_and_downs_ends_with_the_environment_as_before(
    steps: list[tuple[bool, int]], start: dict[str, str]
) -> None:
    environ = {**start, "OTHER": "x"}
    before = dict(environ)
    stack = DefaultEnv(environ)
    keys = [object() for _ in range(5)]
    up: list[int] = []
    for going_up, i in steps:
        if going_up:
            stack.push(keys[i], cluster_env(i))
            up = [j for j in up if j != i] + [i]
        elif stack.remove(keys[i]):
            up.remove(i)
        stack.apply()
        expected = {**before, **cluster_env(up[-1])} if up else before
        assert environ == expected
    for i in list(up):
        stack.remove(keys[i])
    stack.apply()
    assert environ == before


def test_a_raydist_thread_leaves_the_environment_to_the_next_call_on_a_users_thread() -> None:
    environ: dict[str, str] = {}
    owner = ProcessRay(environ)
    key = object()
    owner.make_default(key, cluster_env(1))
    assert environ == cluster_env(1)

    seen: dict[str, object] = {}

    def teardown() -> None:
        seen["marked"] = on_raydist_thread()
        owner.cluster_gone(key, "")
        seen["env"] = dict(environ)

    spawn(teardown, name="raydist-test-teardown").join(10)
    assert seen == {"marked": True, "env": cluster_env(1)}  # untouched from raydist's thread
    assert owner.default() is None
    owner.sync()  # the next raydist call on a user's thread
    assert environ == {}


def test_a_users_own_thread_changes_the_environment_at_once() -> None:
    environ: dict[str, str] = {}
    owner = ProcessRay(environ)
    key = object()
    thread = threading.Thread(target=owner.make_default, args=(key, cluster_env(3)))
    thread.start()
    thread.join(10)
    assert not on_raydist_thread()
    assert environ == cluster_env(3)
    owner.cluster_gone(key, "")
    assert environ == {}


def test_an_address_and_its_host_name_are_the_same_endpoint() -> None:
    assert same_address("127.0.0.1:6379", "localhost:6379")
    assert not same_address("127.0.0.1:6379", "127.0.0.1:6380")


def test_a_handoff_marks_the_connection_used_while_it_runs_and_at_its_end() -> None:
    owner = ProcessRay(environ={})
    assert owner.last_use() is None
    with owner.using():
        inside = owner.last_use()
        assert inside is not None
        time.sleep(0.05)
        assert owner.last_use() > inside  # "now", while it runs
    ended = owner.last_use()
    time.sleep(0.05)
    assert owner.last_use() == ended  # from its end on, the idle time counts
