"""Quiet by default: the README's main job (`make demo`) prints the cluster,
the training, the result and the teardown; Spark's console output goes to a
log file whose path it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raydist.engine.node.procs import ray_processes, wait_no_ray_processes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_prints_what_a_user_needs_and_keeps_the_noise_in_a_file(tmp_path: Path) -> None:
    before = {p.pid for p in ray_processes()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "RAYDIST_VERBOSE"))}
    env["RAYDIST_HOME"] = str(tmp_path)
    ran = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    shown = (ran.stdout + ran.stderr).splitlines()
    assert ran.returncode == 0, "\n".join(shown[-40:])
    text = "\n".join(shown)
    assert re.search(r"cluster \S+ up in \d+ s: 2 workers", text), text
    assert re.search(r"trained on 2 workers: loss [\d.]+ -> [\d.]+", text), text
    assert re.search(r"cluster \S+: DELETED", text), text
    # Neither Spark's JVM nor Ray's driver logging reaches the terminal...
    for noise in ("WARN ", "log4j", "INFO worker.py", "FutureWarning", "incubator modules"):
        assert noise not in text, (noise, text)
    assert len(shown) <= 12, text
    # ...it is in the file the demo names.
    log_path = Path(re.search(r"Spark's console output: (\S+)", text).group(1))  # type: ignore[union-attr]
    assert log_path.parent == tmp_path / "logs" and "log4j" in log_path.read_text()
    assert not wait_no_ray_processes(ignore=before)
