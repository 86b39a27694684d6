"""The job a Spark-shaped distributor runs in each training process.

Spark starts each process with torchrun and hands the training code its
input through the process itself: a function's arguments through a pickle,
a script's through ``sys.argv``, DeepSpeed's config as ``--deepspeed
--deepspeed_config <file>`` on the command line. A job here sets up the
same, in whatever process runs it (a forked child, a fresh Ray Train
worker), and then runs the user's code.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from raydist.errors import ClusterFailedError

__all__ = ["function_job", "script_job", "with_deepspeed_args", "DEEPSPEED_CONFIG_ENV"]

#: Where :func:`raydist.compat.deepspeed_config` finds the config in a job.
DEEPSPEED_CONFIG_ENV = "RAYDIST_DEEPSPEED_CONFIG"
#: ``sys.argv[0]`` of a function's process: Spark runs a function from a
#: generated ``train.py``.
FUNCTION_ARGV0 = "train.py"

#: A job that takes the extra command-line arguments it should see.
ArgvJob = Callable[[Sequence[str]], Any]


def function_job(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> ArgvJob:
    """``fn(*args, **kwargs)`` with ``sys.argv`` as Spark sets it."""

    def run(extra_argv: Sequence[str]) -> Any:
        sys.argv[:] = [FUNCTION_ARGV0, *extra_argv]
        return fn(*args, **kwargs)

    return run


def script_job(path: str, args: Sequence[Any]) -> ArgvJob:
    """Run a training script as ``python path args...`` would, in this
    process: ``__name__ == "__main__"``, ``sys.argv`` and ``sys.path[0]`` as
    Python sets them. Returns None, as Spark does; a script that fails
    raises ClusterFailedError (a RuntimeError, as Spark's is) with the
    script's own error as its cause."""
    argv = [str(a) for a in args]

    def run(extra_argv: Sequence[str]) -> None:
        sys.argv[:] = [path, *argv, *extra_argv]
        sys.path.insert(0, os.path.dirname(path))
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise ClusterFailedError(f"training script {path} exited with code {e.code}") from None
        except Exception as e:
            raise ClusterFailedError(f"training script {path} failed: {type(e).__name__}: {e}") from e

    return run


def plain(job: ArgvJob) -> Callable[[], Any]:
    """The job with no extra command-line arguments."""

    def run() -> Any:
        return job(())

    return run


def with_deepspeed_args(job: ArgvJob, config: dict[str, Any] | None, use_gpu: bool) -> Callable[[], Any]:
    """The job with DeepSpeed's arguments as Spark's DeepspeedTorchDistributor
    passes them: ``--deepspeed --deepspeed_config <file>`` (the file holds
    ``config`` and is removed when the job ends), or ``--deepspeed`` alone
    without a config."""

    def run() -> Any:
        from raydist.train.runtime import scoped_env

        env = {"DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cuda" if use_gpu else "cpu")}
        if config is None:
            with scoped_env(env):
                return job(["--deepspeed"])
        with tempfile.TemporaryDirectory(prefix="raydist-ds-") as tmp, \
                scoped_env({**env, DEEPSPEED_CONFIG_ENV: json.dumps(config)}):
            path = os.path.join(tmp, "deepspeed_config.json")
            with open(path, "w") as f:
                json.dump(config, f)
            return job(["--deepspeed", "--deepspeed_config", path])

    return run
