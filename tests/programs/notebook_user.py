"""Ray-on-Spark notebook habits, run as a script by tests/test_default_path.py:
ray imported first, a cluster from raydist.up, then ray.init the usual ways;
then plain Keras code through MirroredStrategyRunner, and an exit without
spark.stop(). Prints one JSON line."""

import json
import os
import subprocess
import sys

import ray  # imported before raydist, as notebooks often do
from _ray_client import init_through_ray_client
from pyspark.sql import SparkSession

import raydist
from raydist.compat import MirroredStrategyRunner

spark = SparkSession.builder.master("local-cluster[2,1,2048]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")


@ray.remote(num_cpus=1)
def where() -> str:
    import time

    time.sleep(0.3)  # long enough that Ray spreads 8 tasks over both 1-CPU nodes, not one warm worker
    return ray.get_runtime_context().get_node_id()


def nodes_used() -> int:
    return len(set(ray.get([where.remote() for _ in range(8)])))


out = {"ray_address_before": os.environ.get("RAY_ADDRESS")}
cluster = raydist.up(spark, workers=2, cpus_per_worker=1)
print(f"cluster {cluster.name} at {cluster.address}", flush=True)
ray.init(cluster.address)
out["by_address"] = nodes_used()
ray.shutdown()
ray.init()
out["plain"] = nodes_used()
ray.shutdown()
init_through_ray_client(cluster.client_address)
out["client"] = nodes_used()
ray.shutdown()
child = subprocess.run(
    [sys.executable, "-c", "import ray; ray.init(); print('CPUs', ray.cluster_resources()['CPU'])"],
    capture_output=True, text=True, timeout=120,
)
out["subprocess"] = [line for line in child.stdout.splitlines() if line.startswith("CPUs")]
cluster.down()
out["ray_address_after_down"] = os.environ.get("RAY_ADDRESS")


def keras3(epochs: int = 4) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(data, epochs=epochs, verbose=0)
    return {"losses": [float(v) for v in history.history["loss"]], "keras": keras.__name__ + " " + keras.__version__,
            "place": place()}


def place() -> str:
    """Where this rank ran: forked in a Spark task (its parent a Spark
    Python worker) or in a Ray Train worker."""
    import os

    import psutil

    parent = " ".join(psutil.Process(os.getppid()).cmdline())
    return "ray" if "RayTrainWorker" in parent else "spark" if "pyspark" in parent else parent


def tf_keras(epochs: int = 4) -> dict:
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=epochs, verbose=0)
    return {"losses": [float(v) for v in history.history["loss"]]}


out["keras3"] = MirroredStrategyRunner(num_slots=2, use_gpu=False).run(keras3)
out["tf_keras"] = MirroredStrategyRunner(num_slots=2, use_gpu=False).run(tf_keras)
print("RESULT " + json.dumps(out), flush=True)
# No spark.stop(): the session cluster must end with the interpreter anyway
# (the test then checks that no Ray process is left).
