"""Jobs in forked children (raydist.train._fork), with no cluster."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from raydist.train._fork import (
    CANCELLED,
    ERROR,
    LOST,
    OK,
    Ranks,
    fork_unsafe,
    keep_destroyed_groups,
    learn_imports,
    run_forked,
    run_ranks,
    spawn_job,
)

pytestmark = pytest.mark.component


def loads(payload: bytes):
    from ray import cloudpickle

    return cloudpickle.loads(payload)


def test_a_child_returns_its_value_in_its_own_process() -> None:
    def job() -> tuple[int, int, str]:
        return os.getpid(), os.getppid(), os.environ["X"]

    kind, payload = run_forked(job, {"X": "1"}, still_wanted=lambda: True)
    assert kind == OK
    pid, ppid, x = loads(payload)
    assert pid != os.getpid() and ppid == os.getpid() and x == "1"
    assert "X" not in os.environ  # the child's environment stays in the child


def test_an_error_comes_back_with_its_traceback() -> None:
    def job() -> None:
        raise KeyError("missing column")

    kind, payload = run_forked(job, {}, still_wanted=lambda: True)
    assert kind == ERROR
    error, text = loads(payload)
    assert isinstance(error, KeyError) and "missing column" in text and "def job" not in text
    assert "in job" in text


def test_a_child_killed_by_a_signal_is_lost() -> None:
    kind, how = run_forked(lambda: os.kill(os.getpid(), signal.SIGKILL), {}, still_wanted=lambda: True)
    assert (kind, how) == (LOST, "was killed by SIGKILL")


def test_a_job_no_longer_wanted_is_killed() -> None:
    started = time.monotonic()
    kind, _ = run_forked(lambda: time.sleep(60), {}, still_wanted=lambda: False, poll_s=0.1)
    assert kind == CANCELLED and time.monotonic() - started < 30


def test_ranks_run_at_once_and_the_first_failure_stops_the_rest() -> None:
    def waits() -> None:
        time.sleep(60)

    def fails() -> None:
        raise ValueError("rank 1 broke")

    started = time.monotonic()
    outcomes = run_ranks([waits, fails])
    assert outcomes[0] == (CANCELLED, None)
    assert outcomes[1][0] == ERROR and isinstance(loads(outcomes[1][1])[0], ValueError)
    assert time.monotonic() - started < 30

    values = [loads(p) for _, p in run_ranks([lambda: 0, lambda: 1, lambda: 2])]
    assert values == [0, 1, 2]


def test_learn_imports_loads_only_submodules_of_packages_already_here(tmp_path, monkeypatch) -> None:
    # Packages of this test's own, so what is already imported is known.
    for pkg in ("raydist_had", "raydist_new"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "lazy.py").write_text("LOADED = True\n")
    (tmp_path / "raydist_had" / "broken.py").write_text("raise ImportError('not here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith(("raydist_had", "raydist_new"))]:
        monkeypatch.delitem(sys.modules, name)
    import raydist_had  # noqa: F401 - the package this process "has"

    try:
        learn_imports(["raydist_had.lazy", "raydist_had.broken", "raydist_new.lazy", "raydist_gone.sub"])
        assert sys.modules["raydist_had.lazy"].LOADED is True  # a submodule of a package here: loaded
        assert "raydist_had.broken" not in sys.modules  # one that fails to import stays lazy, quietly
        # A package this process never imported: nothing of it runs here.
        assert "raydist_new" not in sys.modules and "raydist_new.lazy" not in sys.modules
    finally:
        for name in [m for m in sys.modules if m.startswith(("raydist_had", "raydist_new"))]:
            del sys.modules[name]


def test_destroyed_process_groups_stay_referenced_until_the_process_ends() -> None:
    torch_dist = pytest.importorskip("torch.distributed")

    def job() -> int:
        keep_destroyed_groups()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1")
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        group = dist.group.WORLD
        dist.destroy_process_group()
        kept = dist.destroy_process_group.kept_groups
        return int(any(g is group for g in kept))

    assert torch_dist is not None
    kind, payload = run_forked(job, {}, still_wanted=lambda: True)
    assert kind == OK, loads(payload) if kind == ERROR else payload
    assert loads(payload) == 1


def fresh_job() -> dict:
    import os
    import sys

    print("from the fresh rank", flush=True)
    if os.environ.get("FAIL"):
        raise ValueError("bad batch")
    return {"pid": os.getpid(), "ppid": os.getppid(), "x": os.environ["X"], "torch_loaded": "torch" in sys.modules}


def test_a_parent_that_ran_tensorflow_is_not_forked(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    assert fork_unsafe() == []
    monkeypatch.setitem(sys.modules, "tensorflow", sys)  # what `import tensorflow` leaves
    assert fork_unsafe() == ["tensorflow"]


def test_a_fresh_interpreter_runs_a_job_as_a_forked_child_would(tmp_path) -> None:
    """spawn_job: what a parent that cannot be forked uses; the same outcome,
    output and environment, in a process that shares nothing of the parent's."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        payload = cloudpickle.dumps(fresh_job)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    out = tmp_path / "out"
    with open(out, "wb") as f:
        ranks = Ranks([spawn_job(payload, {"X": "1"}, pickler="pyspark.cloudpickle", output_fd=f.fileno()),
                       spawn_job(payload, {"X": "2", "FAIL": "1"}, pickler="pyspark.cloudpickle",
                                 output_fd=f.fileno())], cloudpickle)
        while not ranks.done:
            ranks.read(ranks.fds())
    (kind0, value), (kind1, error) = ranks.results()
    assert kind0 == OK and kind1 == ERROR
    got = cloudpickle.loads(value)
    assert got["ppid"] == os.getpid() and got["x"] == "1"
    assert got["torch_loaded"] is False  # nothing of this process's imports: a fresh interpreter
    raised, text = cloudpickle.loads(error)
    assert isinstance(raised, ValueError) and "bad batch" in text
    assert out.read_text().count("from the fresh rank") == 2
