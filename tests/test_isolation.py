"""Tenants cannot reach the control plane, or another tenant's cluster.

A real `raydist serve` on a Spark standalone cluster whose worker daemons run
as another Unix user (``nobody``), as executors do on a real deployment. Each
cluster's head runs in a Spark task of its own, so all tenant code runs as
that user, outside the control plane's process tree. A Ray task on one
cluster then tries to read the control token (its file, the server's
environment) and looks for it, and for the other cluster's Ray token, in
every process's command line; and from outside, as root, no process but the
server holds the control token and each Ray process holds its own cluster's
Ray token only.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
from raydist.engine.ports import free_port
from raydist.testing.standalone import StandaloneSpark
from tests.conftest import release_shared_spark
from tests.control_server import Server
from tests.probe import run_client_py

pytestmark = [pytest.mark.integration, pytest.mark.standalone]

PROBE = """
import json, os, sys, ray
ray.init()
home, server_pid, secrets = sys.argv[1], int(sys.argv[2]), json.loads(os.environ.pop("PROBE_SECRETS"))

@ray.remote(num_cpus=1)
def attack():
    out = {"uid": os.getuid(), "own_token": os.environ.get("RAY_AUTH_TOKEN") == secrets["own"]}
    for what, path in (("token_file", f"{home}/control_token"), ("home", home),
                       ("server_environ", f"/proc/{server_pid}/environ")):
        try:
            os.listdir(path) if what == "home" else open(path, "rb").read()
            out[what] = "read"
        except PermissionError:
            out[what] = "denied"
        except OSError as exc:
            out[what] = type(exc).__name__
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        found += [name for name in ("control", "other") if secrets[name] in argv]
    out["in_argv"] = sorted(set(found))
    out["env_holds"] = sorted(n for n in ("control", "other") if secrets[n] in "".join(os.environ.values()))
    return out

print(json.dumps(ray.get(attack.remote())))
"""


@pytest.fixture(scope="module")
def other_user_cluster() -> Iterator[StandaloneSpark]:
    if os.geteuid() != 0:
        pytest.skip("running the Spark workers as another Unix user needs root (setpriv)")
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no 'nobody' user to run the Spark workers as")
    release_shared_spark()
    before = {p.pid for p in ray_processes()}
    # Two hosts of two cores: each cluster's head task and its one worker fit.
    sa = StandaloneSpark(workers=2, cores=2, memory="3g", run_as=nobody).start()
    try:
        yield sa
    finally:
        left = sa.stop()
        assert not left, f"Spark processes left: {[(p.pid, p.name()) for p in left]}"
        assert not wait_no_ray_processes(ignore=before)


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def test_a_tenant_reaches_neither_the_control_plane_nor_another_cluster(
        other_user_cluster: StandaloneSpark, tmp_path: Path) -> None:
    sa = other_user_cluster
    conf = [f"--spark-conf={k}={v}" for k, v in sa.driver_conf().items()]
    control_token = os.urandom(24).hex()
    server = Server(tmp_path, free_port(), conf, master=sa.master_url)
    server.env["RAYDIST_TOKEN"] = control_token  # as the Kubernetes Deployment hands it over
    client = None
    try:
        server.start()
        client = server.client(token=control_token)
        for name in ("tenant-a", "tenant-b"):
            up = server.cli("up", name, "-w", "1", "--cpus-per-worker", "1")
            assert up.returncode == 0, up.stdout + up.stderr
        a, b = client.credentials("tenant-a"), client.credentials("tenant-b")
        secrets = {"control": control_token, "other": b.ray_token, "own": a.ray_token}

        # Every Ray process of both clusters runs as the tenants' user, heads included.
        nobody = pwd.getpwnam("nobody").pw_uid
        ray_procs = [p for p in ray_processes() if p.name() in ("gcs_server", "raylet")]
        assert len([p for p in ray_procs if p.name() == "gcs_server"]) == 2
        assert {p.uids().real for p in ray_procs} == {nobody}

        env = {**server.env, "RAY_ADDRESS": a.client_address, "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN": a.ray_token}
        env.pop("RAYDIST_TOKEN")
        env["PROBE_SECRETS"] = json.dumps(secrets)  # not on a command line, where the probe looks
        ran = run_client_py(f"exec {sys.executable} -c {shlex.quote(PROBE)} {tmp_path} {server.proc.pid}", env,
                            shell=True)
        assert ran.returncode == 0, ran.stderr[-3000:]
        seen = json.loads(ran.stdout.strip().splitlines()[-1])
        assert seen["uid"] == nobody and seen["own_token"]
        assert seen["token_file"] == seen["home"] == seen["server_environ"] == "denied", seen
        assert seen["in_argv"] == [] and seen["env_holds"] == [], seen

        # From outside (root): no process of the deployment (the server's tree, the Spark
        # daemons' trees: executors and every Ray node) but the server holds the control
        # token, and each holds its own cluster's Ray token only.
        roots = [server.proc.pid] + [d.proc.pid for d in sa.daemons if d.proc is not None]
        deployment = [c for r in roots for c in psutil.Process(r).children(recursive=True)]
        assert any(p.name() == "gcs_server" for p in deployment)
        for proc in deployment:
            environ = _environ(proc)
            try:
                argv = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            assert control_token not in argv and control_token not in "".join(environ.values()), proc
            if environ.get("RAY_AUTH_TOKEN"):
                assert environ["RAY_AUTH_TOKEN"] in (a.ray_token, b.ray_token), proc
            assert a.ray_token not in argv and b.ray_token not in argv, proc
    finally:
        for name in ("tenant-a", "tenant-b"):
            try:
                if client is not None:
                    client.delete(name, allow_missing=True)
            except Exception:  # noqa: BLE001 - the server's own teardown follows
                pass
        if server.proc is not None:
            assert server.stop() == 0
