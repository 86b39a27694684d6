"""Looking at a running cluster from outside, as a user's driver would: a
fresh Python process connects with the cluster's environment and reports."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: User programs the tests run as scripts, as a user would.
PROGRAMS = Path(__file__).parent / "programs"
#: What the originals (pyspark's own classes) gave some of those programs,
#: recorded by ``make refresh-originals`` (tests/refresh_originals.py).
ORIGINALS = Path(__file__).parent / "originals.json"
#: Stands for a Spark Connect server's URL among a recorded program's
#: arguments (each run's server has a port of its own).
CONNECT_URL = "<connect-url>"


def until(condition: Any, timeout: float = 10.0) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds (polled)."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def recorded_original(program: str, *args: str) -> dict:
    """The recorded ``--original`` result of ``program args``."""
    data = json.loads(ORIGINALS.read_text())
    return data["results"][program][" ".join(args)]


def run_py(code: str, env: dict[str, str], timeout: float = 120, *,
           shell: bool = False) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` in a fresh interpreter (``shell``: run a bash
    command line instead, as a user types it)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    return subprocess.run(
        ["bash", "-c", code] if shell else [sys.executable, "-c", textwrap.dedent(code)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: Ray Client's proxy sometimes loses the per-client server it just forked:
#: the child dies before it logs a line, and the proxy reports it either way
#: below (seen here on a loaded machine, a few connections in twenty). A user
#: retries; so do we, twice, and only for those messages.
_CLIENT_SERVER_FLAKES = ("Starting Ray client server failed", "psutil.ZombieProcess")


def run_client_py(code: str, env: dict[str, str], timeout: float = 120, *,
                  shell: bool = False) -> subprocess.CompletedProcess[str]:
    """``run_py`` for a Ray Client (``ray://``) driver."""
    for _ in range(2):
        proc = run_py(code, env, timeout, shell=shell)
        if proc.returncode == 0 or not any(flake in proc.stderr for flake in _CLIENT_SERVER_FLAKES):
            return proc
    return run_py(code, env, timeout, shell=shell)


def node_tasks(cluster: Any) -> dict[str, Any]:
    """In a fresh driver process: the cluster's nodes, and one task run on
    each worker node (reporting where it ran and what GPUs it saw)."""
    code = """
        import json, os, ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        ray.init()
        nodes = [n for n in ray.nodes() if n["Alive"]]
        @ray.remote(num_cpus=1)
        def where():
            return {"node": ray.get_runtime_context().get_node_id(),
                    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}
        out = []
        for n in nodes:
            if n["Resources"].get("CPU", 0) >= 1:
                gpus = 1 if n["Resources"].get("GPU", 0) >= 1 else 0
                s = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                out.append(ray.get(where.options(scheduling_strategy=s, num_gpus=gpus).remote()))
        print(json.dumps({"nodes": [{"id": n["NodeID"], "res": n["Resources"]} for n in nodes], "tasks": out}))
    """
    proc = run_py(code, cluster.env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def client_server_logs(cluster: Any, limit: int = 3000) -> str:
    """The head's Ray Client server logs, for a failing assertion's message."""
    import glob

    out = []
    for path in sorted(glob.glob(f"{cluster._temp_root}/session_latest/logs/ray_client_server*.err")):
        with open(path, errors="replace") as f:
            out.append(f"== {path}\n{f.read()[-limit:]}")
    return "\n".join(out)


def run_program(name: str, *args: str, home: Path | None = None, timeout: float = 900,
                prefix: Sequence[str] = ()) -> dict:
    """Run a program as a user would, in a fresh process (under ``prefix``:
    ``ip netns exec <ns>``, say); its RESULT line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if home is not None:
        env["RAYDIST_HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    # Its own process group: a program that hangs is ended whole (its Spark
    # JVMs and their Python workers with it), not only its first process.
    proc = subprocess.Popen([*prefix, sys.executable, str(PROGRAMS / name), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # it may have ended just now
            os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        # The Python traceback, not only the tail (Spark's shutdown noise comes after it).
        at = proc.stderr.rfind("Traceback (most recent call last)")
        why = proc.stderr[at:at + 4000] if at >= 0 else ""
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{why}\n...\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):]) | {"_output": proc.stdout + proc.stderr}


def run_original(name: str, *args: str, timeout: float = 600, **kwargs: Any) -> dict:
    """:func:`run_program` with ``--original`` (the program on pyspark's own
    class), once more if it hangs: pyspark's TorchDistributor sometimes loses
    a rank here (torch elastic's rendezvous on a loaded 2-core host: one rank's
    ``torch.distributed.run`` ends with "terminate called without an active
    exception" and the other waits for it for ever). That flake is upstream's;
    what the comparison needs is the original's answers."""
    try:
        return run_program(name, *args, "--original", timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        print(f"{name} --original hung (an upstream flake): running it again", file=sys.stderr)
        return run_program(name, *args, "--original", timeout=timeout, **kwargs)
