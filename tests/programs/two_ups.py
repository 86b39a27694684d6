"""``raydist.up()`` twice in one process, run as a script by
tests/test_notebook_life.py: each cluster is the default while it is the
newest up, ``ray.init()`` reaches each while it is up, a connection the user
made to a cluster ends at its ``down()``, and after both ``down()``s the
environment is as before. Prints one JSON line."""

import json
import os
import subprocess
import sys

import ray
from _ray_client import init_through_ray_client
from pyspark.sql import SparkSession

import raydist

KEYS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")

spark = SparkSession.builder.master("local-cluster[2,1,2048]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")


def reached(*args) -> str:
    """ray.init(*args) as a user writes it; the GCS it reached."""
    if args and args[0].startswith("ray://"):
        init_through_ray_client(args[0])
    else:
        ray.init(*args)
    try:
        return ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def in_subprocess() -> str:
    code = "import ray; ray.init(); print('GCS', ray.get_runtime_context().gcs_address)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return next((line[4:] for line in done.stdout.splitlines() if line.startswith("GCS ")), done.stderr[-500:])


env_before = dict(os.environ)
out: dict = {}
c1 = raydist.up(spark, workers=1, cpus_per_worker=1)
c2 = raydist.up(spark, workers=1, cpus_per_worker=1)
out["addresses"] = [c1.address, c2.address]
out["default_with_both"] = os.environ.get("RAY_ADDRESS")
out["plain_init_with_both"] = reached()
out["init_c1_with_both"] = reached(c1.address)
out["client_c1_with_both"] = reached(c1.client_address)
out["subprocess_with_both"] = in_subprocess()

# The user's own connection to c2, then c2 goes: this process lets go of it first.
ray.init(c2.address)
c2.down()
out["connected_after_c2_down"] = ray.is_initialized()
out["default_after_c2_down"] = os.environ.get("RAY_ADDRESS")
out["plain_init_after_c2_down"] = reached()
out["subprocess_after_c2_down"] = in_subprocess()

# Over Ray Client this time, then c1 goes.
init_through_ray_client(c1.client_address)
c1.down()
out["connected_after_c1_down"] = ray.is_initialized()
out["env_changed"] = sorted(k for k in set(env_before) | set(os.environ) if env_before.get(k) != os.environ.get(k))
out["env_after"] = {k: os.environ.get(k) for k in KEYS}
spark.stop()
print("RESULT " + json.dumps(out), flush=True)
