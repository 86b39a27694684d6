"""What the user programs here share: a SparkSession on the classic master
or the Spark Connect server the test names (``--master M`` | ``--connect URL``)."""

import argparse

from pyspark.sql import SparkSession


def session_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--master`` and ``--connect``, one of them required."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--master")
    where.add_argument("--connect")


def user_session(args: argparse.Namespace) -> SparkSession:
    """The session a user's notebook has: Connect's, or classic's on ``--master``."""
    if args.connect:
        return SparkSession.builder.remote(args.connect).getOrCreate()
    return (SparkSession.builder.master(args.master).config("spark.ui.enabled", "false")
            .config("spark.executor.memory", "1g").getOrCreate())


def three_classes(spark: SparkSession, label_type: type = float):  # type: ignore[no-untyped-def]
    """The estimator programs' made-up data: 600 rows of four numbers in
    [-1, 1] and a label, which of the first three is largest (a model that
    learns gets well over the third a guess gets)."""
    import random

    rng = random.Random(5)
    rows = []
    for _ in range(600):
        x = [rng.uniform(-1, 1) for _ in range(4)]
        rows.append((*x, label_type(max(range(3), key=x.__getitem__))))
    return spark.createDataFrame(rows, ["x0", "x1", "x2", "x3", "label"])
