"""Spark ML estimators on raydist against pyspark's own, from Spark Connect.

(a) ``pyspark.ml.connect``: one Spark Connect server (pip's pyspark) over
``local-cluster[2,1,2048]``; every measurement is a fresh client process,
pyspark and raydist alternating, the same program with one import prefix
changed: a Pipeline (``StandardScaler``, then
``LogisticRegression(numTrainWorkers=2)``) fitted once (the *fit*), then the
same pipeline fitted at three learning rates (the *sweep*). Before the first
measurement a warm-up client runs a Python job on every slot, so neither side
pays for the executors' first Python start alone.

(b) Horovod's ``TorchEstimator`` data path: not measured yet (the estimator
exists, ``horovod.spark.torch``; a Parquet-in-the-Store twin of its data path
to race it against does not yet); the last line says ``hvd_data_ratio=n/a``.

Last line (one line)::

  mlc_fit_ratio=<raydist/pyspark> mlc_sweep_ratio=<raydist/pyspark> hvd_data_ratio=<...> same_result=<true|false>

``same_result``: every fit's weights agree between the two to 1e-5, or to
no less than pyspark's fits of the same data in the two rounds agree with
each other (a round-robin ``repartition`` deals rows to the training
partitions in the order shuffle blocks arrive, so pyspark's own weights
move between runs; the summary line prints both differences).

Run: make bench-estimators
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

from _clients import run_client

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

MASTER = "local-cluster[2,1,2048]"
FIT_LR = 0.1
SWEEP_LRS = (0.05, 0.1, 0.2)
ROWS = 2000


# ------------------------------------------------------------------ child side


def child(mode: str, impl: str, url: str) -> dict:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        if mode == "warmup":
            spark.range(8, numPartitions=8).mapInArrow(lambda it: it, "id long").count()
            return {}
        if impl == "pyspark":
            from pyspark.ml.connect.classification import LogisticRegression
            from pyspark.ml.connect.feature import StandardScaler
            from pyspark.ml.connect.pipeline import Pipeline
        else:
            from raydist.compat.ml.connect.classification import LogisticRegression
            from raydist.compat.ml.connect.feature import StandardScaler
            from raydist.compat.ml.connect.pipeline import Pipeline
        rng = random.Random(5)
        rows = []
        for _ in range(ROWS):
            x = [rng.uniform(-2, 2) for _ in range(4)]
            rows.append((1 if x[0] - x[1] + 0.5 * x[2] > 0 else 0, x))
        # One input partition, so each training partition's row order (and
        # the weights) does not follow the order shuffle blocks arrive in.
        df = spark.createDataFrame(rows, ["label", "features"]).coalesce(1)
        times, weights = [], []
        for lr in (FIT_LR,) if mode == "fit" else SWEEP_LRS:
            t = time.monotonic()
            lor = LogisticRegression(featuresCol="scaled", numTrainWorkers=2, maxIter=5, learningRate=lr, seed=1)
            model = Pipeline(stages=[StandardScaler(inputCol="features", outputCol="scaled"), lor]).fit(df)
            times.append(time.monotonic() - t)
            weights.append([v for t_ in model.stages[-1].torch_model.state_dict().values()
                            for v in t_.flatten().tolist()])
        return {"times": times, "weights": weights}
    finally:
        spark.stop()


# ----------------------------------------------------------------- parent side


def _run_child(mode: str, impl: str, url: str) -> dict:
    return run_client(__file__, mode, impl, url)


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default="")
    parser.add_argument("--impl", default="raydist")
    parser.add_argument("--url", default="")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each kind, per side")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.impl, args.url)), flush=True)
        return 0

    from raydist.testing.connect import ConnectServer

    fit: dict[str, list[float]] = {"pyspark": [], "raydist": []}
    sweep: dict[str, list[float]] = {"pyspark": [], "raydist": []}
    weights: dict[str, list[list[float]]] = {"pyspark": [], "raydist": []}
    with ConnectServer(master=MASTER) as server:
        url = server.url
        _run_child("warmup", "", url)
        for r in range(args.rounds):
            order = ("pyspark", "raydist") if r % 2 == 0 else ("raydist", "pyspark")
            for mode in ("fit", "sweep"):
                for impl in order:
                    out = _run_child(mode, impl, url)
                    (fit if mode == "fit" else sweep)[impl].append(sum(out["times"]))
                    weights[impl] += out["weights"]
                    print(f"{mode:5s} {impl:8s} {sum(out['times']):6.1f} s  "
                          f"({' / '.join(f'{t:.1f}' for t in out['times'])})", flush=True)

    med = statistics.median
    fit_ratio = med(fit["raydist"]) / med(fit["pyspark"])
    sweep_ratio = med(sweep["raydist"]) / med(sweep["pyspark"])
    diff = _max_diff(weights["raydist"], weights["pyspark"])
    half = len(weights["pyspark"]) // 2  # each round's fits, in the same order
    own = _max_diff(weights["pyspark"][:half], weights["pyspark"][half:]) if args.rounds >= 2 else 0.0
    same = diff <= max(1e-5, own)
    print(f"fit median: raydist {med(fit['raydist']):.1f} s, pyspark {med(fit['pyspark']):.1f} s; "
          f"sweep of {len(SWEEP_LRS)} median: raydist {med(sweep['raydist']):.1f} s, "
          f"pyspark {med(sweep['pyspark']):.1f} s; largest weight difference raydist-pyspark {diff:.2e}, "
          f"pyspark between its rounds {own:.2e}")
    print(f"mlc_fit_ratio={fit_ratio:.3f} mlc_sweep_ratio={sweep_ratio:.3f} hvd_data_ratio=n/a "
          f"same_result={'true' if same else 'false'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
