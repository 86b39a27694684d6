"""The README's main job: start an embedded cluster, train a small PyTorch
model on it through raydist's facade, tear it down.

It prints the cluster, the training, the result and the teardown; Spark's
and Ray's own console output goes to a log file whose path it prints
(``-v`` keeps everything on the terminal).

Run: make demo   (or: .venv/bin/python examples/quickstart.py [-v])
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_ddp import main  # noqa: E402

if __name__ == "__main__":
    verbose = "-v" in sys.argv[1:]
    if verbose:
        os.environ["RAYDIST_VERBOSE"] = "1"
    else:
        # PySpark 4 warns about pandas 3 on every start; nothing here uses pandas.
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # the executors' Python workers too
        os.environ.setdefault("RAY_LOGGER_LEVEL", "warning")  # ray.init's "Connecting to..." lines
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    main(quiet=not verbose)
