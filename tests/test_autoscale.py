"""Elastic clusters on real Spark and Ray: they follow Ray's demand and give
Spark its task slots back."""

from __future__ import annotations

import json
import time

import pytest

import raydist
from raydist.engine.cluster import RayCluster
from raydist.engine.spark.sides import side_of
from raydist.errors import CapacityError
from raydist.spec import ClusterSpec
from tests.probe import run_py

pytestmark = pytest.mark.integration

TWO_TASKS = """
import json, ray, time
ray.init()
@ray.remote(num_cpus=1)
def work():
    time.sleep(4)
    return ray.get_runtime_context().get_node_id()
print(json.dumps(ray.get([work.remote(), work.remote()])))
"""


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return predicate()


def test_min_0_max_2_grows_for_waiting_tasks_shrinks_when_idle_and_frees_spark(spark, no_leftover_ray) -> None:
    with raydist.up(spark, name="elastic", min_workers=0, max_workers=2, cpus_per_worker=1,
                    idle_timeout_s=5) as cluster:
        st = cluster.status()
        assert st.state.value == "RUNNING" and st.desired_workers == 0 and st.ready_workers == 0
        ran = run_py(TWO_TASKS, cluster.env(), timeout=180)  # two one-CPU tasks wait: the head has no CPU
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert len(set(json.loads(ran.stdout.strip().splitlines()[-1]))) == 2  # on two new nodes
        events = [m for _, m in cluster.events()]
        assert any("scaling from 0 to" in m and "resource request" in m for m in events), events
        # Idle for the timeout: back to none, with the reason on record.
        assert _wait(lambda: cluster.status().desired_workers == 0, 5 + 30), cluster.events()
        assert any("idle for 5 s" in m for _, m in cluster.events())
        # The freed slots are Spark's again: a barrier job needs all four at once.
        sc = spark.sparkContext
        assert sc.parallelize(range(4), 4).barrier().mapPartitions(lambda it: [sum(it)]).collect() == [0, 1, 2, 3]
        assert cluster.status().state.value == "RUNNING"


def test_resize_by_hand_and_its_checks(spark, no_leftover_ray) -> None:
    with raydist.up(spark, name="resized", workers=1, cpus_per_worker=1) as cluster:
        cluster.resize(workers=2)
        assert cluster.wait_for_workers(2, timeout=120), cluster.events()
        # A slow Spark call (here: the cancel of the node that goes) holds no
        # lock that status() needs, and the resize does not wait for it.
        side = side_of(spark)
        cancel = side.cancel
        side.cancel = lambda **kw: (time.sleep(3), cancel(**kw))[1]  # type: ignore[method-assign]
        try:
            t = time.monotonic()
            cluster.resize(workers=1)
            took = time.monotonic() - t
            t = time.monotonic()
            cluster.status()
            assert max(took, time.monotonic() - t) < 1.0, f"resize took {took:.1f} s: a Spark call under the lock"
            time.sleep(3.5)
        finally:
            side.cancel = cancel  # type: ignore[method-assign]
        assert _wait(lambda: cluster.status().desired_workers == 1 and cluster.status().ready_workers == 1, 30)
        assert any("scaling from 2 to 1" in m for _, m in cluster.events())
        with pytest.raises(CapacityError):
            cluster.resize(workers=50)
        assert cluster.status().desired_workers == 1  # a refused resize changes nothing


def test_a_node_added_before_the_launch_runs_one_spark_job(spark, no_leftover_ray) -> None:
    # UpdateCluster while a cluster was CREATING started a node's job loop
    # before the launch did, then the launch started it again: two Spark jobs
    # for one node, each one's node replacing the other's.
    cluster = RayCluster(ClusterSpec(name="early", workers=1, cpus_per_worker=1), spark)
    cluster.resize(workers=2)
    cluster.start()
    try:
        tracker = spark.sparkContext.statusTracker()
        assert len(tracker.getJobIdsForGroup(cluster.job_group)) == 2  # one Spark job a node, not three or four
        time.sleep(3)
        status = cluster.status()
        assert (status.ready_workers, [n.restarts for n in status.nodes[1:]]) == (2, [0, 0]), cluster.events()
    finally:
        cluster.down()
