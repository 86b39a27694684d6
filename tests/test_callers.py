"""Who a control-plane call acts as: the caller the auth layer named, and
no one where it named none (a path that missed the auth layer fails closed)."""

from __future__ import annotations

import contextvars

import pytest

from raydist.control.tenants import ADMIN, Caller, calling_as, current_caller
from raydist.errors import AuthenticationError

pytestmark = pytest.mark.unit


def test_code_no_auth_layer_ran_for_acts_as_nobody() -> None:
    def unauthenticated() -> Caller:
        return current_caller()

    nobody = contextvars.Context().run(unauthenticated)  # a context the auth layer never touched
    assert not nobody.admin and nobody.describe() == "nobody"
    assert not nobody.sees("train") and not nobody.sees("train.team-a") and not nobody.sees("x.")
    with pytest.raises(AuthenticationError):
        nobody.scoped("train")


def test_the_named_caller_is_current_for_its_call_only() -> None:
    team = Caller("team-a", admin=False)

    def as_team() -> tuple[Caller, str, bool]:
        calling_as(team)
        return current_caller(), current_caller().scoped("train"), current_caller().sees("train.team-b")

    assert contextvars.Context().run(as_team) == (team, "train.team-a", False)
    assert contextvars.Context().run(lambda: (calling_as(ADMIN), current_caller())[1]) is ADMIN
    assert contextvars.Context().run(current_caller).describe() == "nobody"  # nothing leaked
