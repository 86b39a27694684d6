"""Elastic clusters on real Spark and Ray: they follow Ray's demand and give
Spark its task slots back."""

from __future__ import annotations

import json
import time

import pytest

import raydist
from raydist.errors import CapacityError
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
        cluster.resize(workers=1)
        assert _wait(lambda: cluster.status().desired_workers == 1 and cluster.status().ready_workers == 1, 30)
        assert any("scaling from 2 to 1" in m for _, m in cluster.events())
        with pytest.raises(CapacityError):
            cluster.resize(workers=50)
        assert cluster.status().desired_workers == 1  # a refused resize changes nothing
