"""A user's program on a Spark Connect session, run as a script by
tests/test_connect.py: ``raydist.up(spark)`` on a session that has no
SparkContext, a Ray task on the cluster, ``down()``, then the user's own
Spark work on the same session. Prints one RESULT line."""

import json
import sys
import time

import ray
from pyspark.sql import SparkSession

import raydist
from raydist.engine.node.procs import ray_processes

url = sys.argv[1]
spark = SparkSession.builder.remote(url).getOrCreate()
before = {p.pid for p in ray_processes()}

t0 = time.monotonic()
cluster = raydist.up(spark, workers=1, cpus_per_worker=1)
ready_s = time.monotonic() - t0
status = cluster.status()

ray.init()  # the cluster is this process's default, as after setup_ray_cluster


@ray.remote(num_cpus=1)
def square(x: int) -> int:
    return x * x


squares = ray.get([square.remote(i) for i in range(4)])
nodes = sum(1 for n in ray.nodes() if n["Alive"])
ray.shutdown()
cluster.down()

# The user's own Spark work on the same session, after the cluster gave its slots back.
total = spark.range(100, numPartitions=2).selectExpr("sum(id) as s").collect()[0]["s"]
left = [p.pid for p in ray_processes() if p.pid not in before]
spark.stop()
print("RESULT " + json.dumps({
    "ready_s": round(ready_s, 1), "state": status.state.value,
    "workers_up": sum(n.up for n in status.nodes if n.key != "head"),
    "squares": squares, "nodes": nodes, "spark_sum": total, "left": left,
}))
