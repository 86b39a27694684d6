"""The CLI as a user runs it, in a subprocess, where no server or cluster is
needed: a bad config file refused with exit 2, a stale server file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.component


def test_cli_refuses_a_bad_file_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "raydist.toml"
    path.write_text("[server]\nport = 'x'\n")
    proc = subprocess.run([sys.executable, "-m", "raydist.cli", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "server.port" in proc.stderr and "whole number" in proc.stderr
    missing = subprocess.run([sys.executable, "-m", "raydist.cli", "serve", "--config", str(tmp_path / "nope.toml")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--config" in missing.stderr


def test_serve_stop_with_a_stale_server_file_signals_no_one(tmp_path: Path) -> None:
    # The control plane died without cleaning up; its pid now names another
    # process (here: a sleep of ours). `serve --stop` must leave it alone.
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        home = tmp_path / "home"
        home.mkdir(mode=0o700)
        (home / "server.json").write_text(json.dumps({"address": "127.0.0.1:1", "pid": bystander.pid}))
        (home / "server.lock").write_text("")  # the lock file stays; no process holds its lock
        env = {**os.environ, "RAYDIST_HOME": str(home)}
        proc = subprocess.run([sys.executable, "-m", "raydist.cli", "serve", "--stop"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "no control plane is running" in proc.stdout
        assert bystander.poll() is None  # not signalled
    finally:
        bystander.kill()
        bystander.wait()
