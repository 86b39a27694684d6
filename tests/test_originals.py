"""The recorded originals (tests/originals.json) the comparison tests read:
made by the installed pyspark, for every program and argument list
tests/refresh_originals.py records, so a comparison never reads a stale or
missing answer."""

from __future__ import annotations

import json

import pyspark
import pytest

from tests.probe import ORIGINALS, recorded_original
from tests.refresh_originals import RECORDED

pytestmark = pytest.mark.unit


def test_the_originals_were_recorded_by_the_installed_pyspark() -> None:
    data = json.loads(ORIGINALS.read_text())
    assert data["pyspark"] == pyspark.__version__, f"run {data['command']} (recorded with pyspark {data['pyspark']})"


@pytest.mark.parametrize(("program", "args"), [(p, a) for p, arg_lists in RECORDED.items() for a in arg_lists])
def test_every_recorded_program_has_its_answer(program: str, args: tuple[str, ...]) -> None:
    got = recorded_original(program, *args)
    assert got and "error" not in got, (program, args, got)
