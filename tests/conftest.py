"""Shared fixtures: one real SparkSession (local-cluster: real executor JVMs)
per test session, a private RAYDIST_HOME, and a guard that no Ray process
outlives the test that started it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from raydist.engine.procs import ray_processes, wait_no_ray_processes

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("RAYDIST_HOME", tempfile.mkdtemp(prefix="raydist-test-home-"))

RESOURCES = Path(__file__).parent / "resources"

#: The shared local-cluster session, while it runs (see release_shared_spark).
_shared: list[object] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the standalone-cluster tests last: a process holds one SparkContext,
    and they replace the shared local-cluster one with their own."""
    items.sort(key=lambda item: item.get_closest_marker("standalone") is not None)


def release_shared_spark() -> None:
    """Stop the shared session so that a test can start its own SparkContext."""
    while _shared:
        _shared.pop().stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """local-cluster[2,2,1024]: two executor JVMs of 2 cores, each with two
    fake GPUs (disjoint addresses) from a discovery script."""
    from raydist.engine.spark import embedded_session

    # The standalone workers discover the GPUs and hand them to executors.
    os.environ["RAYDIST_FAKE_GPU_DIR"] = tempfile.mkdtemp(prefix="raydist-fake-gpus-")
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
