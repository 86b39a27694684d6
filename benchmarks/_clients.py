"""Run one measurement of a benchmark in a fresh client process, as a user's
program runs: the benchmark's own script again, with ``--child MODE``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_client(script: str, mode: str, impl: str, url: str, timeout: float = 900) -> dict:
    """``script --child mode --impl impl --url url`` in a fresh interpreter
    with no Ray or Connect settings of this process's; its RESULT line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "SPARK_REMOTE"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    proc = subprocess.run([sys.executable, script, "--child", mode, "--impl", impl, "--url", url],
                          env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        # The Python traceback, not only the tail (Spark's and Ray's shutdown noise comes after it).
        at = proc.stderr.rfind("Traceback (most recent call last)")
        why = proc.stderr[at:at + 4000] if at >= 0 else ""
        raise RuntimeError(f"{mode}/{impl} failed ({proc.returncode}): {why}\n...\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])
