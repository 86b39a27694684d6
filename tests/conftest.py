"""Shared fixtures: one real SparkSession (local-cluster: real executor JVMs)
per test session, a private RAYDIST_HOME, a guard that no Ray process
outlives the test that started it, and the tiers (tests/README.md): every
test module names one of ``unit``, ``component`` or ``integration``, and a
unit test that starts a process or a server fails saying so."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from raydist.engine.node.procs import SCOPE_VARIABLE, ray_processes, wait_no_ray_processes
from tests.jvm import with_short_lived_jvms

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# Every JVM the suite starts (Spark's drivers and executors, the Connect
# servers, `raydist serve`'s Spark) runs C1 only with the serial GC: the same
# Spark for about 40% less CPU on this CPU-bound machine (tests/jvm.py).
os.environ["JAVA_TOOL_OPTIONS"] = with_short_lived_jvms(os.environ.get("JAVA_TOOL_OPTIONS"))
# Every process this run starts (Spark's executors, Ray, the programs) inherits
# this; the leftover checks count only those, so two suites on one host never
# count each other's.
os.environ[SCOPE_VARIABLE] = f"pytest-{os.getpid()}"
# Each run its own home, never the user's: a control token, a state database,
# a session registry each.
os.environ["RAYDIST_HOME"] = tempfile.mkdtemp(prefix="raydist-test-home-")

RESOURCES = Path(__file__).parent / "resources"

#: The shared local-cluster session, while it runs (see release_shared_spark).
_shared: list[object] = []


#: The tiers, fastest first; each test is in exactly one (tests/README.md).
TIERS = ("unit", "component", "integration")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in one tier; the standalone-cluster tests last (a process
    holds one SparkContext, and they replace the shared local-cluster one)."""
    wrong = [f"{item.nodeid}: {tiers or 'none'}" for item in items
             if len(tiers := [t for t in TIERS if item.get_closest_marker(t)]) != 1]
    if wrong:
        raise pytest.UsageError("each test needs exactly one tier mark (pytestmark = pytest.mark.unit, "
                                "component or integration; tests/README.md says which):\n  " + "\n  ".join(wrong))
    items.sort(key=lambda item: item.get_closest_marker("standalone") is not None)


class StartsAProcessOrServer(AssertionError):
    """A unit test started a process or a server: it belongs in the component tier."""


@pytest.fixture(autouse=True)
def _unit_tier_stays_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test runs in this process: no subprocess, no fork, no listening
    socket, no gRPC server. Whatever tries raises, naming the tier to use."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(what: str):  # noqa: ANN202 - a stand-in of any signature
        def refused(*args: object, **kwargs: object) -> None:
            raise StartsAProcessOrServer(f"{request.node.nodeid} {what}: a unit test may not; "
                                         "mark its module pytest.mark.component")
        return refused

    import socket
    import subprocess

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("starts a subprocess"))
    monkeypatch.setattr(os, "fork", refuse("forks"))
    monkeypatch.setattr(os, "posix_spawn", refuse("spawns a process"))
    monkeypatch.setattr(socket.socket, "listen", refuse("listens on a socket"))
    try:
        import grpc
        import grpc.aio
    except ImportError:  # pragma: no cover - grpcio is a dependency
        return
    monkeypatch.setattr(grpc, "server", refuse("starts a gRPC server"))
    monkeypatch.setattr(grpc.aio, "server", refuse("starts a gRPC server"))


def release_shared_spark() -> None:
    """Stop the shared session so that a test can start its own SparkContext."""
    while _shared:
        _shared.pop().stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """local-cluster[2,2,1024]: two executor JVMs of 2 cores, each with two
    fake GPUs (disjoint addresses) from a discovery script."""
    from raydist.engine.spark.session import embedded_session

    # The standalone workers discover the GPUs and hand them to executors.
    gpu_dir = tempfile.mkdtemp(prefix="raydist-fake-gpus-")
    os.environ["RAYDIST_FAKE_GPU_DIR"] = gpu_dir
    session = embedded_session(
        "local-cluster[2,2,1024]",
        {
            "spark.ui.enabled": "false",
            "spark.worker.resource.gpu.amount": "2",
            "spark.worker.resource.gpu.discoveryScript": str(RESOURCES / "fake_gpus.sh"),
            "spark.executor.resource.gpu.amount": "2",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    # Warm the executors' Python workers once for the whole session.
    session.sparkContext.parallelize(range(4), 4).map(lambda x: x).collect()
    _shared.append(session)
    yield session
    release_shared_spark()
    shutil.rmtree(gpu_dir, ignore_errors=True)


def _describe(procs: list) -> list[str]:
    """Each process as a reader can trace it: pid, parent, command line."""
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:300]}")
        except Exception:  # noqa: BLE001 - it ended while we looked
            out.append(f"{p.pid} (gone)")
    return out


@pytest.fixture
def no_leftover_ray() -> Iterator[None]:
    """Fail the test if Ray processes it started are still alive after it."""
    before = {p.pid for p in ray_processes()}
    yield
    left = wait_no_ray_processes(ignore=before)
    assert not left, f"Ray processes left behind: {_describe(left)}"


@pytest.fixture(scope="session")
def mlflow_server() -> Iterator[object]:
    """One real MLflow tracking server for the session (started on first use)."""
    from raydist.testing.mlflow_server import MlflowServer

    server = MlflowServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real ``raydist serve`` (a subprocess on a free port, its own Spark)
    for the tests that only call it: the CLI, jobs, the RPC fuzz. A test that
    restarts, kills or starves a server starts its own. Each user leaves it
    as it found it (its clusters deleted)."""
    from raydist.engine.ports import free_port
    from tests.control_server import Server

    before = {p.pid for p in ray_processes()}
    srv = Server(tmp_path_factory.mktemp("control-plane"), free_port()).start()
    yield srv
    assert srv.stop() == 0, "SIGTERM must stop the control plane cleanly"
    left = wait_no_ray_processes(ignore=before)
    assert not left, f"the shared control plane left Ray processes: {_describe(left)}"
