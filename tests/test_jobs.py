"""Ray Jobs on a served cluster, as a user runs them: `raydist submit` as a
subprocess (its output, its exit code), `raydist jobs`, `raydist stop`, and
the Python API's `cluster.submit`, against a real `raydist serve`."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
from tests.control_server import Server

pytestmark = pytest.mark.integration

JOB = textwrap.dedent("""
    import sys
    import ray

    import helper  # from the uploaded working dir

    ray.init()
    squares = ray.get([ray.remote(helper.square).remote(i) for i in range(10)])
    print("sum of squares", sum(squares), "args", sys.argv[1:], flush=True)
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0)
""")


@pytest.fixture(scope="module")
def server(control_plane: Server) -> Iterator[Server]:
    """The suite's shared control plane with a cluster "jobs" on it, for this module."""
    before = {p.pid for p in ray_processes()}
    try:
        up = control_plane.cli("up", "jobs", "-w", "1", "--cpus-per-worker", "1")  # a served cluster takes jobs
        assert up.returncode == 0, up.stdout + up.stderr
        yield control_plane
    finally:
        down = control_plane.cli("down", "jobs")
        assert down.returncode == 0, down.stdout + down.stderr
        assert not wait_no_ray_processes(ignore=before)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "helper.py").write_text("def square(i):\n    return i * i\n")
    return tmp_path


def test_submit_streams_output_and_exits_with_the_jobs_outcome(server: Server, workdir: Path) -> None:
    ok = server.cli("submit", "jobs", "--working-dir", str(workdir), "--", "python", "job.py", "--flag", "x y")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "sum of squares 285 args ['--flag', 'x y']" in ok.stdout  # the job's argv, word for word
    assert "SUCCEEDED" in ok.stderr
    job_id = ok.stderr.split(" submitted to jobs")[0].split()[-1]
    states = [line.split(": ")[1].split()[0] for line in ok.stderr.splitlines() if line.startswith(f"job {job_id}: ")]
    assert states[0] in ("PENDING", "RUNNING") and states[-1] == "SUCCEEDED", ok.stderr  # its state while it waits

    failed = server.cli("submit", "jobs", "--working-dir", str(workdir), "--", "python", "job.py", "3")
    assert failed.returncode == 1 and "FAILED" in failed.stderr, failed.stdout + failed.stderr

    listed = json.loads(server.cli("jobs", "jobs", "-o", "json").stdout)
    assert [j["status"] for j in listed][-2:] == ["SUCCEEDED", "FAILED"]
    assert listed[-2]["entrypoint"] == "python job.py --flag 'x y'"
    table = server.cli("jobs", "jobs").stdout
    assert "SUCCEEDED" in table and "FAILED" in table

    token = server.client().credentials("jobs").ray_token
    for out in (ok.stdout, ok.stderr, failed.stderr, table):
        assert token not in out
    assert "credentials given to" in server.cli("logs", "jobs").stdout  # each use is on record


def test_no_wait_then_stop(server: Server) -> None:
    started = server.cli("submit", "jobs", "--no-wait", "--", "python", "-c",
                         "import time; print('working', flush=True); time.sleep(600)")
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    assert job_id and f"raydist stop jobs {job_id}" in " ".join(started.stderr.split())
    stopped = server.cli("stop", "jobs", job_id)
    assert stopped.returncode == 0 and "STOPPED" in stopped.stdout, stopped.stdout + stopped.stderr
    one = server.cli("jobs", "jobs", job_id, "-o", "json")
    assert json.loads(one.stdout)["status"] == "STOPPED"

    missing = server.cli("stop", "jobs", "no-such-job")
    assert missing.returncode == 1 and "has no job 'no-such-job'" in missing.stderr


def test_python_api_submit(server: Server, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import raydist

    monkeypatch.setenv("RAYDIST_TOKEN", server.token)
    # A process that points Ray at another cluster: the jobs still go to this one (and its token with them).
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    cluster = raydist.attach("jobs", address=server.address)
    job_id = cluster.submit(["python", "job.py", "py"], working_dir=str(workdir))
    info = cluster.ray_jobs().wait(job_id, timeout=120)
    assert info.status == "SUCCEEDED", info
    assert "sum of squares 285 args ['py']" in cluster.ray_jobs().logs(job_id)


def test_usage_errors_say_what_to_do(server: Server) -> None:
    nothing = server.cli("submit", "jobs")
    assert nothing.returncode == 2 and "raydist submit NAME -- python train.py" in nothing.stderr
    stray = server.cli("status", "jobs", "--", "python", "x.py")
    assert stray.returncode == 2 and "only `raydist submit` takes a command" in stray.stderr



def _get(url: str, token: str) -> dict[str, object]:
    import urllib.request

    request = urllib.request.Request(f"{url}/api/version", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def test_a_cluster_without_the_dashboard_gets_one_on_demand(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """`raydist dashboard NAME` on a cluster made with --no-dashboard: its URL
    (and Ray Jobs from then on), a local port forwarded through the control
    plane for a caller that cannot reach the head, `--stop`; the same from
    Python (``cluster.dashboard()``)."""
    import subprocess
    import sys

    import raydist

    up = server.cli("up", "plain", "-w", "0", "--no-dashboard")
    forward = None
    try:
        assert up.returncode == 0, up.stderr
        refused = server.cli("submit", "plain", "--", "python", "-c", "pass")
        assert refused.returncode == 1 and "raydist dashboard plain" in refused.stderr, refused.stderr

        started = server.cli("dashboard", "plain", "-o", "json")
        assert started.returncode == 0, started.stdout + started.stderr
        url = json.loads(started.stdout)["url"]
        token = server.client().credentials("plain").ray_token
        assert _get(url, token)["ray_version"]  # served on the head, with every module
        job = server.cli("submit", "plain", "--", "python", "-c", "print(6 * 7)")
        assert job.returncode == 0 and "42" in job.stdout, job.stdout + job.stderr

        # Through the control plane: what a caller that cannot reach the head gets.
        forward = subprocess.Popen([sys.executable, "-m", "raydist.cli", "dashboard", "plain", "--forward"],
                                   env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert forward.stdout is not None
        said = forward.stdout.readline()
        local = said.split()[3]
        assert local.startswith("http://127.0.0.1:") and url in said, said
        assert _get(local, token) == _get(url, token)
        forward.send_signal(2)  # Ctrl-C ends the forward, not the dashboard
        assert forward.wait(timeout=30) == 0, forward.stderr.read() if forward.stderr else ""
        assert _get(url, token)["ray_version"]

        monkeypatch.setenv("RAYDIST_TOKEN", server.token)
        cluster = raydist.attach("plain", address=server.address)
        forwarded = cluster.dashboard(forward=True)
        assert forwarded != url and _get(forwarded, token)["ray_version"]
        assert cluster.dashboard(stop=True) == ""
        assert server.cli("submit", "plain", "--", "python", "-c", "pass").returncode == 1
        events = server.cli("logs", "plain").stdout
        assert "dashboard started at" in events and "dashboard stopped on demand" in events
        for out in (started.stdout, said, events):
            assert token not in out
    finally:
        if forward is not None and forward.poll() is None:
            forward.kill()
        server.cli("down", "plain")
