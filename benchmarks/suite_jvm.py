"""What the test suite's JVM options save: CPU seconds of one Spark start.

The suite runs every JVM with ``tests/jvm.py``'s options (C1 only, the serial
GC). Here, alternately, a fresh Python process starts a SparkSession on
``local-cluster[2,1,1024]`` (a driver JVM and two executor JVMs, as the
suite's), runs the job the suite's shared session warms up with and one SQL
aggregate, then adds up the CPU time of every process below it before it
stops Spark:
  (a) the anchor: the JVM's defaults (JAVA_TOOL_OPTIONS unset);
  (b) the suite's options.
Prints each round, the medians, and as the last line:
  jvm_cpu_ratio=<(b)/(a) median CPU> default_cpu_s=<median> tuned_cpu_s=<median> default_s=<wall> tuned_s=<wall>

Run: .venv/bin/python benchmarks/suite_jvm.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.jvm import SHORT_LIVED_JVM_OPTIONS  # noqa: E402

#: One Spark start as the suite makes one, measured from inside.
_ONE_START = """
import json, os, sys, time
import psutil
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
from pyspark.sql import SparkSession

started = time.monotonic()
spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.parallelize(range(4), 4).map(lambda x: x).collect()
spark.range(100000).selectExpr("sum(id)").collect()
wall = time.monotonic() - started
cpu = 0.0
for proc in psutil.Process().children(recursive=True):
    try:
        t = proc.cpu_times()
        cpu += t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        pass
spark.stop()
print("RESULT " + json.dumps({"wall_s": wall, "cpu_s": cpu}))
"""


def one_start(options: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
    if options:
        env["JAVA_TOOL_OPTIONS"] = options
    proc = subprocess.run([sys.executable, "-c", _ONE_START], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"a Spark start failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    runs: dict[str, list[dict[str, float]]] = {"default": [], "tuned": []}
    for i in range(rounds):
        for name, options in (("default", None), ("tuned", SHORT_LIVED_JVM_OPTIONS)):
            got = one_start(options)
            runs[name].append(got)
            print(f"round {i + 1} {name}: cpu_s={got['cpu_s']:.1f} wall_s={got['wall_s']:.1f}", flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    print(f"jvm_cpu_ratio={median('tuned', 'cpu_s') / median('default', 'cpu_s'):.2f} "
          f"default_cpu_s={median('default', 'cpu_s'):.1f} tuned_cpu_s={median('tuned', 'cpu_s'):.1f} "
          f"default_s={median('default', 'wall_s'):.1f} tuned_s={median('tuned', 'wall_s'):.1f}")


if __name__ == "__main__":
    main()
