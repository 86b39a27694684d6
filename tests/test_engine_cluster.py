"""The engine on real Spark (local-cluster executors) and real Ray."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psutil
import pytest

import raydist
from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
from raydist.errors import CapacityError, ClusterFailedError, NodeStartTimeoutError
from raydist.spec import State
from tests.probe import node_tasks as _node_tasks
from tests.probe import run_client_py
from tests.probe import run_py as _run_py

pytestmark = pytest.mark.integration


@pytest.fixture(scope="class")
def cluster(spark) -> Iterator[object]:
    """One cluster for the tests that only read it (TestOneCluster): two
    workers of one CPU and one GPU each, with a dashboard. Its teardown is
    checked as the user would: DELETED, and none of its processes left."""
    before = {p.pid for p in ray_processes()}
    with raydist.up(spark, name="two", workers=2, cpus_per_worker=1, gpus_per_worker=1, dashboard=True) as c:
        yield c
        marker = c.address
    assert c.status().state == State.DELETED
    assert not [p for p in ray_processes() if marker in " ".join(p.cmdline())]
    ours = f"raydist-{c._uid}"  # this cluster's processes: its nodes' temp dirs name it, supervisors included
    # At once: down() waited for them, supervisors too.
    left = [p for p in ray_processes() if p.pid not in before and ours in " ".join(p.cmdline())]
    assert not left, [" ".join(p.cmdline()[:4]) for p in left]
    # And nothing else the tests started (no_leftover_ray's check, once for the class).
    assert not wait_no_ray_processes(ignore=before)


class TestOneCluster:
    """What a user reads off one running cluster; one start for all of it
    (a cluster start is the costly part: tests/README.md)."""

    def test_two_workers_run_tasks(self, cluster) -> None:
        status = cluster.status()
        assert status.state == State.RUNNING
        assert (status.ready_workers, status.desired_workers) == (2, 2)
        assert cluster.address and cluster.client_address.startswith("ray://")
        assert cluster.dashboard_url.startswith("http://")
        info = _node_tasks(cluster)
        workers = [n for n in info["nodes"] if n["res"].get("CPU")]
        assert len(info["nodes"]) == 3 and len(workers) == 2
        assert all(n["res"]["CPU"] == 1 for n in workers)
        assert all(n["res"]["object_store_memory"] > 0 for n in workers)
        assert {t["node"] for t in info["tasks"]} == {n["id"] for n in workers}

        # Ray Client, as a user far away would connect.
        proc = run_client_py(
            f"""
            import ray
            ray.init("{cluster.client_address}")
            print(ray.get(ray.remote(lambda: 6 * 7).remote()))
            """,
            {k: v for k, v in cluster.env().items() if k != "RAY_ADDRESS"},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().splitlines()[-1] == "42"

    def test_gpus_are_mapped_disjointly(self, cluster) -> None:
        info = _node_tasks(cluster)
        workers = [n for n in info["nodes"] if n["res"].get("CPU")]
        assert [n["res"].get("GPU") for n in workers] == [1.0, 1.0]
        seen = [t["cuda"] for t in info["tasks"]]
        assert len(seen) == 2 and all(seen) and len(set(seen)) == 2, seen
        by_status = {n.key: n.gpu_ids for n in cluster.status().nodes if n.key != "head"}
        assert sorted(ids[0] for ids in by_status.values()) == sorted(seen)

    def test_client_without_token_is_refused(self, cluster, tmp_path) -> None:
        probe = f"""
            from ray._raylet import GcsClient
            try:
                GcsClient(address="{cluster.address}").get_all_node_info(timeout=5)
                print("ALLOWED")
            except Exception as exc:
                print("REFUSED", type(exc).__name__, exc)
        """
        # HOME elsewhere so no ~/.ray/auth_token is picked up.
        refused = _run_py(probe, {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})
        assert "REFUSED" in refused.stdout and "uthenticat" in refused.stdout, refused.stdout + refused.stderr
        none = _run_py(probe, {"HOME": str(tmp_path)})
        assert "ALLOWED" not in none.stdout, none.stdout
        allowed = _run_py(probe, {k: v for k, v in cluster.env().items() if k != "RAY_ADDRESS"})
        assert "ALLOWED" in allowed.stdout, allowed.stdout + allowed.stderr
        token = cluster.token.reveal()
        assert token not in repr(cluster) and token not in repr(cluster.status())
        assert token not in " ".join(m for _, m in cluster.events())


def test_two_clusters_at_once_torn_down_independently(spark, no_leftover_ray) -> None:
    results: dict[str, object] = {}

    def start(name: str) -> None:
        try:
            results[name] = raydist.up(spark, name=name, workers=1, cpus_per_worker=1)
        except Exception as exc:  # noqa: BLE001 - reported by the asserts below
            results[name] = exc

    threads = [threading.Thread(target=start, args=(n,)) for n in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    left, right = results["left"], results["right"]
    assert isinstance(left, raydist.engine.cluster.RayCluster), left  # type: ignore[attr-defined]
    assert isinstance(right, raydist.engine.cluster.RayCluster), right  # type: ignore[attr-defined]
    try:
        assert left.address != right.address
        raydist.down("left")
        assert left.status().state == State.DELETED
        assert right.status().state == State.RUNNING
        assert len(_node_tasks(right)["tasks"]) == 1
    finally:
        right.down()


def _executor_of(cluster, key: str) -> psutil.Process:
    """The executor JVM hosting one worker node of ``cluster``."""
    link = cluster._channel.links()[key]
    for parent in psutil.Process(link.pid).parents():
        if parent.name() == "java":
            return parent
    raise AssertionError("no executor JVM above the node's supervisor")


def test_killed_executor_is_healed(spark, no_leftover_ray) -> None:
    with raydist.up(spark, name="heal", workers=2, cpus_per_worker=1) as cluster:
        victim = _executor_of(cluster, "w0")
        node_tree = psutil.Process(cluster._channel.links()["w0"].pid).children(recursive=True)
        assert node_tree
        victim.kill()
        deadline = time.monotonic() + 30
        states = set()
        while time.monotonic() < deadline and cluster.status().ready_workers == 2:
            time.sleep(0.1)
        states.add(cluster.status().state)
        assert cluster.status().ready_workers < 2
        assert cluster.wait_for_workers(2, timeout=120), cluster.events()
        assert cluster.status().state == State.RUNNING
        assert State.DEGRADED in states or any("DEGRADED" in m for _, m in cluster.events())
        # Nothing of the dead node is left running.
        assert not [p for p in node_tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert len(_node_tasks(cluster)["tasks"]) == 2


def test_a_sigkilled_supervisor_takes_its_node_along_and_the_node_heals(spark, no_leftover_ray) -> None:
    with raydist.up(spark, name="sigkill", workers=2, cpus_per_worker=1) as cluster:
        supervisor = psutil.Process(cluster._channel.links()["w1"].pid)
        node_tree = supervisor.children(recursive=True)
        assert any(p.name() == "raylet" for p in node_tree)
        supervisor.kill()  # nothing in the supervisor runs after this
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and [p for p in node_tree if p.is_running()
                                               and p.status() != psutil.STATUS_ZOMBIE]:
            time.sleep(0.2)
        assert not [p.name() for p in node_tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert cluster.wait_for_workers(2, timeout=120), cluster.events()
        assert len(_node_tasks(cluster)["tasks"]) == 2


def test_more_workers_than_spark_can_ever_fit_fails_fast(spark, no_leftover_ray) -> None:
    started = time.monotonic()
    with pytest.raises(CapacityError, match="fit 4 such workers"):
        raydist.up(spark, name="huge", workers=5, cpus_per_worker=1)
    with pytest.raises(CapacityError, match="executors have 2 cores"):
        raydist.up(spark, name="fat", workers=1, cpus_per_worker=3)
    with pytest.raises(CapacityError, match="GPUs each"):
        raydist.up(spark, name="gpu-hungry", workers=1, cpus_per_worker=1, gpus_per_worker=3)
    assert time.monotonic() - started < 60
    assert not ray_processes()


def test_broken_head_fails_with_its_log(spark, no_leftover_ray) -> None:
    with pytest.raises(ClusterFailedError) as err:
        raydist.up(spark, name="broken", workers=1, cpus_per_worker=1,
                   ray_start_options={"resources": "{not json"}, start_timeout_s=60)
    assert "did not start" in str(err.value)
    assert "resources" in str(err.value).lower()


def test_a_teardown_while_the_head_starts_leaves_nothing(spark, no_leftover_ray) -> None:
    from raydist.engine.cluster import RayCluster
    from raydist.spec import ClusterSpec

    cluster = RayCluster(ClusterSpec(name="hasty", workers=2, cpus_per_worker=1), spark)
    failed: list[BaseException] = []

    def start() -> None:
        try:
            cluster.start()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            failed.append(e)

    thread = threading.Thread(target=start)
    thread.start()
    deadline = time.monotonic() + 60
    while not any("starting head" in m for _, m in cluster.events()) and time.monotonic() < deadline:
        time.sleep(0.05)
    cluster.down()
    thread.join(120)
    assert not thread.is_alive()
    assert cluster.state == State.DELETED  # not back to RUNNING
    assert failed and isinstance(failed[0], ClusterFailedError) and "torn down while it started" in str(failed[0])
    # no_leftover_ray: no head or worker outlives the teardown


def test_start_timeout_names_pending_nodes() -> None:
    err = NodeStartTimeoutError(2, 1, 30, {"w1": ["line a", "raylet failed: port in use"]})
    text = str(err)
    assert "1 of 2" in text and "w1" in text and "port in use" in text
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert again.pending == err.pending and again.timeout == 30
