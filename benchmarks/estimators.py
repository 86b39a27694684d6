"""Spark ML estimators on raydist against pyspark's own, from Spark Connect.

(a) ``pyspark.ml.connect``: one Spark Connect server (pip's pyspark) over
``local-cluster[2,1,2048]``; every measurement is a fresh client process,
pyspark and raydist alternating, the same program with one import prefix
changed: a Pipeline (``StandardScaler``, then
``LogisticRegression(numTrainWorkers=2)``) fitted once (the *fit*), then the
same pipeline fitted at three learning rates (the *sweep*). Before the first
measurement a warm-up client runs a Python job on every slot, so neither side
pays for the executors' first Python start alone.

(b) Horovod's ``TorchEstimator`` data path, on the same server: a fit of a
small MLP on a ``HVD_ROWS``-row DataFrame (eight numbers a row, made in
Spark), one epoch on two ranks. raydist's default (each rank's partition
handed over as Arrow in its own Spark task, no file in the Store) against
what Horovod does: the DataFrame written to Parquet in the Store (ten files
a process, as Horovod's ``partitions_per_process``), then each rank reading
its files back (the same training loop after the read). Each measurement is
a fresh client warmed by a small fit on its own path first (so the Parquet
side's first write in the server's life, 10-11 s, is not measured), the
two sides alternating, ``--hvd-rounds`` (4) each; ``hvd_data_ratio`` =
raydist's median / Parquet's. Both sides' last training
loss must agree to 5% for ``same_result``.

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
HVD_ROWS = 200_000


# ------------------------------------------------------------------ child side


def _parquet_rank(path: str, spec) -> object:  # noqa: ANN001 - a rank of the Parquet side of (b)
    """Horovod's way: this rank's share of the Store's Parquet files, read here."""
    import glob
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from raydist.compat.horovod.spark.torch._remote import train_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    files = sorted(glob.glob(os.path.join(path, "*.parquet")))[rank::world]
    table = pa.concat_tables([pq.read_table(f) for f in files])
    fd, staged = tempfile.mkstemp(suffix=".arrow")
    os.close(fd)
    with pa.OSFile(staged, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    os.environ["SPARK_PARTITION_ARROW_DATA_FILE"] = staged  # where train_rank reads its rows
    try:
        return train_rank(spec)
    finally:
        os.unlink(staged)


def hvd_child(spark, impl: str) -> dict:  # noqa: ANN001
    """(b): one warm-up fit, then the timed fit of HVD_ROWS rows on ``impl``'s data path."""
    import shutil
    import tempfile

    import torch
    from pyspark.sql import functions as F

    import raydist.compat.horovod.spark.torch as hvd
    from raydist.compat.horovod.spark.common.store import Store
    from raydist.compat.torch_distributor import TorchDistributor

    def frame(rows: int):  # noqa: ANN202
        xs = [F.rand(seed=i) for i in range(8)]
        df = spark.range(rows).select(*[x.alias(f"x{i}") for i, x in enumerate(xs)])
        return df.select(F.array(*[f"x{i}" for i in range(8)]).alias("features"),
                         (F.col("x0") + F.col("x1") > 1).cast("int").alias("label"))

    def estimator(store) -> object:  # noqa: ANN001
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2),
                                    torch.nn.LogSoftmax(dim=-1))
        return hvd.TorchEstimator(num_proc=2, store=store, model=model,
                                  optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                  loss=lambda out, y: torch.nn.functional.nll_loss(out, y.long()),
                                  feature_cols=["features"], label_cols=["label"], batch_size=256, epochs=1,
                                  verbose=0, random_seed=1, shuffle=False)

    def fit(store, df, run_id: str) -> list:  # noqa: ANN001
        est = estimator(store).setRunId(run_id)
        if impl == "raydist":
            return est.fit(df).getHistory()
        path = store.get_train_data_path()
        df.repartition(20).write.mode("overwrite").parquet(path)  # Horovod: 10 files a process
        spec, num_proc = est._rank_spec(df, run_id)
        # The same ranks and session cluster as the estimator's own fit (common/_fit.train_ranks).
        distributor = TorchDistributor(num_processes=num_proc, local_mode=False, use_gpu=False)
        history, _, _ = distributor.run(_parquet_rank, path, spec)
        return history

    work = tempfile.mkdtemp(prefix="hvd-bench-")
    try:
        store = Store.create(work)
        fit(store, frame(1000), "warm")  # each side's own path, warm: its workers, Spark's writer or not
        df = frame(HVD_ROWS)
        t = time.monotonic()
        history = fit(store, df, "timed")
        return {"seconds": time.monotonic() - t, "loss": history[-1]["train"]["loss"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def child(mode: str, impl: str, url: str) -> dict:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        if mode == "hvd":
            return hvd_child(spark, impl)
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
    parser.add_argument("--hvd-rounds", type=int, default=4, help="measurements of (b), per side")
    parser.add_argument("--only-hvd", action="store_true", help="measure (b) only")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.impl, args.url)), flush=True)
        return 0

    from raydist.testing.connect import ConnectServer

    fit: dict[str, list[float]] = {"pyspark": [], "raydist": []}
    sweep: dict[str, list[float]] = {"pyspark": [], "raydist": []}
    weights: dict[str, list[list[float]]] = {"pyspark": [], "raydist": []}
    hvd: dict[str, list[dict]] = {"raydist": [], "parquet": []}
    with ConnectServer(master=MASTER) as server:
        url = server.url
        _run_child("warmup", "", url)
        for r in range(args.hvd_rounds):
            for impl in ("raydist", "parquet") if r % 2 == 0 else ("parquet", "raydist"):
                out = _run_child("hvd", impl, url)
                hvd[impl].append(out)
                print(f"hvd   {impl:8s} {out['seconds']:6.1f} s  (last loss {out['loss']:.4f})", flush=True)
        for r in range(0 if args.only_hvd else args.rounds):
            order = ("pyspark", "raydist") if r % 2 == 0 else ("raydist", "pyspark")
            for mode in ("fit", "sweep"):
                for impl in order:
                    out = _run_child(mode, impl, url)
                    (fit if mode == "fit" else sweep)[impl].append(sum(out["times"]))
                    weights[impl] += out["weights"]
                    print(f"{mode:5s} {impl:8s} {sum(out['times']):6.1f} s  "
                          f"({' / '.join(f'{t:.1f}' for t in out['times'])})", flush=True)

    med = statistics.median
    hvd_s = {impl: med(o["seconds"] for o in outs) for impl, outs in hvd.items()}
    hvd_ratio = hvd_s["raydist"] / hvd_s["parquet"]
    losses = [o["loss"] for outs in hvd.values() for o in outs]
    hvd_same = max(losses) - min(losses) <= 0.05 * min(losses)
    print(f"hvd fit of {HVD_ROWS} rows median: raydist {hvd_s['raydist']:.1f} s, Parquet in the Store "
          f"{hvd_s['parquet']:.1f} s; last losses {', '.join(f'{x:.4f}' for x in losses)}")
    if args.only_hvd:
        print(f"mlc_fit_ratio=n/a mlc_sweep_ratio=n/a hvd_data_ratio={hvd_ratio:.3f} "
              f"same_result={'true' if hvd_same else 'false'}")
        return 0
    fit_ratio = med(fit["raydist"]) / med(fit["pyspark"])
    sweep_ratio = med(sweep["raydist"]) / med(sweep["pyspark"])
    diff = _max_diff(weights["raydist"], weights["pyspark"])
    half = len(weights["pyspark"]) // 2  # each round's fits, in the same order
    own = _max_diff(weights["pyspark"][:half], weights["pyspark"][half:]) if args.rounds >= 2 else 0.0
    same = diff <= max(1e-5, own) and hvd_same
    print(f"fit median: raydist {med(fit['raydist']):.1f} s, pyspark {med(fit['pyspark']):.1f} s; "
          f"sweep of {len(SWEEP_LRS)} median: raydist {med(sweep['raydist']):.1f} s, "
          f"pyspark {med(sweep['pyspark']):.1f} s; largest weight difference raydist-pyspark {diff:.2e}, "
          f"pyspark between its rounds {own:.2e}")
    print(f"mlc_fit_ratio={fit_ratio:.3f} mlc_sweep_ratio={sweep_ratio:.3f} hvd_data_ratio={hvd_ratio:.3f} "
          f"same_result={'true' if same else 'false'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
