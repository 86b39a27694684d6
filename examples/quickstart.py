"""The README's main job: start an embedded cluster, train a small PyTorch
model on it through raydist's facade, tear it down.

Run: make demo
"""

from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_ddp import main  # noqa: E402

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
