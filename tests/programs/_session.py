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
