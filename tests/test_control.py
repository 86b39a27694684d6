"""The control plane end to end: a real `raydist serve` on a free port, the CLI
as a subprocess, the Python client, Ray Client against what it starts."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raydist.control.client import Client
from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
from raydist.engine.ports import free_port
from raydist.errors import RPCError
from raydist.spec import ClusterSpec
from tests.control_server import NO_CLUSTERS, Server
from tests.probe import run_client_py, run_py

pytestmark = pytest.mark.integration

@pytest.fixture
def server(control_plane: Server) -> Server:
    """The suite's shared control plane (conftest.py); each test here deletes what it made."""
    return control_plane


def test_cli_up_status_client_down(server: Server) -> None:
    up = server.cli("up", "demo", "-w", "2", "--cpus-per-worker", "1")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "ray://" in up.stdout and "raydist down demo" in up.stdout
        assert re.search(r"demo is RUNNING with 2/2 workers after \d+ s", up.stdout), up.stdout
        status = server.cli("status", "demo", "-o", "json")
        info = json.loads(status.stdout)
        assert info["state"] == "RUNNING" and info["ready_workers"] == 2
        table = server.cli("status").stdout
        assert "NAME" in table and "demo" in table and "RUNNING" in table
        # Each node: the head first, then the workers, all up, with where they run and Ray's id.
        nodes = info["nodes"]
        assert [n["key"] for n in nodes] == ["head", "w0", "w1"]
        assert all(n["state"] == "NODE_STATE_UP" and n["host"] and n["node_ip"] for n in nodes), nodes
        assert [n.get("cpus", 0) for n in nodes[1:]] == [1, 1]
        one = server.cli("status", "demo").stdout
        assert "RESTARTS" in one and one.count(" UP ") >= 3 and nodes[1]["ray_node_id"][:12] in one

        # A Ray Client user, as `raydist up` tells them: eval "$(raydist env demo)", then plain ray.init().
        exports = server.cli("env", "demo")
        assert exports.returncode == 0, exports.stderr
        token = next(line.split("=", 1)[1] for line in exports.stdout.splitlines() if "RAY_AUTH_TOKEN=" in line)
        assert f"RAY_ADDRESS={info['client_address']}" in exports.stdout
        code = ("import ray; ray.init(); print(ray.get(ray.remote(lambda: 'hi').remote())); "
                "print(sorted(n['NodeID'] for n in ray.nodes() if n['Alive']))")
        env = {k: v for k, v in server.env.items()}
        ran = run_client_py(f'eval "$(raydist env demo)" && exec {sys.executable} -c "{code}"', env, shell=True)
        assert ran.returncode == 0 and "hi" in ran.stdout, ran.stderr[-2000:]
        # The node ids status shows are Ray's own.
        assert ran.stdout.strip().splitlines()[-1] == str(sorted(n["ray_node_id"] for n in nodes))
        logs = server.cli("logs", "demo").stdout
        assert "credentials given to" in logs  # each hand-out is on record
        for text in (up.stdout, up.stderr, status.stdout, table, logs, (server.home / "test-server.log").read_text()):
            assert token not in text
    except BaseException:
        server.cli("down", "demo")  # the module's later tests need the executors back
        raise

    down = server.cli("down", "demo")
    assert down.returncode == 0, down.stderr
    assert json.loads(server.cli("status", "demo", "-o", "json").stdout)["state"] == "DELETED"
    gcs = info["address"]
    assert not [p for p in ray_processes() if gcs in " ".join(p.cmdline())]


def test_node_logs_through_the_supervisor_and_kept_at_down(server: Server) -> None:
    up = server.cli("up", "logged", "-w", "1", "--cpus-per-worker", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        # Node 1 is the worker (the head is 0), as `raydist status logged` lists them.
        shown = server.cli("logs", "logged", "--node", "1")
        assert shown.returncode == 0, shown.stderr
        assert "==> w0/raylet.out" in shown.stderr and "raylet" in shown.stdout
        listed = json.loads(server.cli("logs", "logged", "--node", "w0", "-o", "json").stdout)
        names = {f["name"] for f in listed["files"]}
        assert listed["node"] == "w0" and {"raylet.out", "raydist-w0.log"} <= names, names
        one = json.loads(server.cli("logs", "logged", "--node", "head", "--file", "gcs_server.out",
                                    "-o", "json").stdout)
        assert [f["name"] for f in one["files"]] == ["gcs_server.out"] and one["files"][0]["text"]
        # From an offset on: what a follower reads next.
        size = one["files"][0]["size"]
        tail = server.client().node_logs("logged", "head", file="gcs_server.out", offset=max(0, size - 10))
        assert tail.files[0].offset == max(0, size - 10) and len(tail.files[0].data) >= min(10, size)
        bad = server.cli("logs", "logged", "--node", "7")
        assert bad.returncode == 1 and "0=head, 1=w0" in bad.stderr, bad.stderr
    finally:
        down = server.cli("down", "logged")
    assert down.returncode == 0, down.stderr
    # At down every node's logs were kept, before the temp dirs went.
    runs = list((server.home / "logs" / "logged").iterdir())
    assert len(runs) == 1 and {p.name for p in runs[0].iterdir()} == {"head", "w0"}
    assert (runs[0] / "w0" / "raylet.out").stat().st_size > 0
    assert f"raydist logs NAME --run {runs[0].name}" in server.cli("logs", "logged").stdout
    # What a user reads next, the cluster gone: the kept run, every node's
    # files or one node's, only the lines that matter.
    kept = server.cli("logs", "logged", "--run", "last", "-o", "json")
    assert kept.returncode == 0, kept.stderr
    names = {f["name"] for f in json.loads(kept.stdout)["files"]}
    assert {"head/gcs_server.out", "w0/raylet.out", "w0/raydist-w0.log"} <= names, names
    grepped = server.cli("logs", "logged", "--run", runs[0].name, "--node", "w0", "--grep", "raylet")
    lines = grepped.stdout.splitlines()
    assert grepped.returncode == 0 and lines and all("raylet" in line for line in lines), grepped.stderr
    assert "==> w0/raylet.out" in grepped.stderr and "head/" not in grepped.stderr
    wrong = server.cli("logs", "logged", "--run", "20000101-000000")
    assert wrong.returncode != 0 and runs[0].name in wrong.stderr and "run" in wrong.stderr, wrong.stderr


def test_watch_in_order_and_idempotent_create(server: Server) -> None:
    client = server.client()
    spec = ClusterSpec(name="watched", workers=1, cpus_per_worker=1)
    first = client.create(spec, request_id="req-1")
    again = client.create(spec, request_id="req-1")
    assert first.spec.name == again.spec.name == "watched"
    assert first.create_time == again.create_time
    with pytest.raises(RPCError) as exists:
        client.create(spec.replace(workers=2), request_id="req-2")
    assert exists.value.code == "ALREADY_EXISTS"
    from raydist._proto import pb

    states = []
    for event in client.watch("watched", timeout=180):
        states.append(event.state)
        if event.state in (pb.RUNNING, pb.FAILED):
            break
    assert states[0] == pb.CREATING and states[-1] == pb.RUNNING, states
    client.delete("watched")
    client.delete("watched", allow_missing=True)  # idempotent
    # The name is free again; a new create of it (a new request id, as the CLI
    # sends) is checked against Spark's capacity like any other.
    with pytest.raises(RPCError) as huge:
        client.create(spec.replace(workers=50), request_id="req-3")
    assert huge.value.code == "RESOURCE_EXHAUSTED"
    with pytest.raises(RPCError) as missing:
        client.delete("never-was")
    assert missing.value.code == "NOT_FOUND"
    client.delete("never-was", allow_missing=True)


def test_python_api_through_the_control_plane(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    import raydist

    monkeypatch.setenv("RAYDIST_TOKEN", server.token)
    with raydist.up(name="via-api", workers=1, cpus_per_worker=1, address=server.address) as cluster:
        status = cluster.status()
        assert status.state.value == "RUNNING" and status.ready_workers == 1
        assert cluster.client_address.startswith("ray://")
        env = {**server.env, **cluster.env()}  # what a subprocess of the notebook gets
        ran = run_client_py("import ray; ray.init(); print(ray.get(ray.remote(lambda: 6 * 7).remote()))", env)
        assert ran.returncode == 0 and ran.stdout.strip().endswith("42"), ran.stderr[-2000:]
    assert server.client().get("via-api").state == 5  # DELETED


def test_scale_an_elastic_cluster_from_the_cli(server: Server) -> None:
    up = server.cli("up", "elastic", "--min-workers", "0", "--max-workers", "2", "--cpus-per-worker", "1",
                    "--idle-timeout", "30")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        info = json.loads(server.cli("status", "elastic", "-o", "json").stdout)
        assert info["state"] == "RUNNING" and info.get("desired_workers", 0) == 0  # nothing asked for yet
        assert "(0..2" in server.cli("status").stdout
        scaled = server.cli("scale", "elastic", "1")
        assert scaled.returncode == 0 and "1 workers" in scaled.stdout, scaled.stdout + scaled.stderr
        cluster = server.client().wait("elastic", timeout=60)
        deadline = time.monotonic() + 120
        while cluster.ready_workers < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
            cluster = server.client().get("elastic")
        events = server.cli("logs", "elastic").stdout  # what happened to the node, when it did not come up
        assert (cluster.ready_workers, cluster.desired_workers) == (1, 1), events[-4000:]
        assert "scaling from 0 to 1" in events
        # The engine's node history is in the metrics: one start, how long it took, no loss.
        import urllib.request

        port = json.loads((server.home / "server.json").read_text())["metrics_port"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'raydist_node_starts_total{cluster="elastic"} 1.0' in text
        assert 'raydist_node_losses_total{cluster="elastic"} 0.0' in text
        assert 'raydist_node_start_seconds_count{cluster="elastic"} 1.0' in text
        assert 'raydist_node_start_seconds_bucket{cluster="elastic",le="300.0"} 1.0' in text
        bad = server.cli("scale", "elastic", "50")
        assert bad.returncode == 1 and "Spark cannot fit" in bad.stderr
        with pytest.raises(RPCError) as err:
            server.client()._call("UpdateCluster", server.client()._pb.UpdateClusterRequest(
                spec={"name": "elastic"}, update_mask={"paths": ["env"]}), None, None)
        assert err.value.code == "INVALID_ARGUMENT" and err.value.details.startswith("update_mask")
    finally:
        server.cli("down", "elastic")


def test_each_cluster_has_its_own_ray_token(server: Server) -> None:
    """A user of one cluster holds a token that no other cluster takes."""
    client = server.client()
    for name in ("tenant-a", "tenant-b"):
        client.create(ClusterSpec(name=name, workers=1, cpus_per_worker=1))
    try:
        a, b = (client.wait(name, timeout=180) for name in ("tenant-a", "tenant-b"))
        assert a.state == b.state == 2, (a.message, b.message)
        creds_a, creds_b = client.credentials("tenant-a"), client.credentials("tenant-b")
        assert creds_a.ray_token != creds_b.ray_token
        code = "import ray; ray.init(); print(ray.get(ray.remote(lambda: 'in').remote()))"
        base = {k: v for k, v in server.env.items()}
        own = run_client_py(code, {**base, "RAY_ADDRESS": creds_b.client_address, "RAY_AUTH_MODE": "token",
                                   "RAY_AUTH_TOKEN": creds_b.ray_token})
        assert own.returncode == 0 and own.stdout.strip().endswith("in"), own.stderr[-2000:]
        other = run_py(code, {**base, "RAY_ADDRESS": creds_b.client_address, "RAY_AUTH_MODE": "token",
                              "RAY_AUTH_TOKEN": creds_a.ray_token}, timeout=120)
        assert other.returncode != 0 and not other.stdout.strip().endswith("in")
        with pytest.raises(RPCError) as missing:
            client.credentials("no-such-cluster")
        assert missing.value.code == "NOT_FOUND"
        with pytest.raises(RPCError) as unauthenticated:
            server.client(token="not-the-token").credentials("tenant-a")
        assert unauthenticated.value.code == "UNAUTHENTICATED"
    finally:
        for name in ("tenant-a", "tenant-b"):
            client.delete(name, allow_missing=True)


def test_auth(server: Server) -> None:
    with pytest.raises(RPCError) as none:
        Client(server.address, token="").list()
    assert none.value.code == "UNAUTHENTICATED"
    with pytest.raises(RPCError) as wrong:
        server.client(token="not-the-token").list()
    assert wrong.value.code == "UNAUTHENTICATED"
    assert "not-the-token" not in (server.home / "test-server.log").read_text()

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    info = server.client().server_info()
    assert info.version


def test_metrics_endpoint(server: Server) -> None:
    import urllib.request

    server.client().list()
    port = json.loads((server.home / "server.json").read_text())["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'raydist_rpc_total{code="OK",method="ListClusters"}' in text
    assert "raydist_clusters" in text

    # Method names callers make up never become metric labels.
    with grpc.insecure_channel(server.address) as ch:
        for i in range(3):
            call = ch.unary_unary(f"/made.Up/Method{i}", request_serializer=bytes, response_deserializer=bytes)
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "made.Up" not in text and 'method="unknown"' in text


#: Characters a proto string can hold (a lone surrogate is refused by protobuf itself).
_CHARS = st.characters(blacklist_categories=("Cs",))
NAMES = st.one_of(st.text(_CHARS, max_size=80), st.sampled_from(["", "UPPER", "-lead", "trail-", "a" * 64, "a_b"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, workers=st.integers(-10, 10_000_000), conf_key=st.text(_CHARS, max_size=20))
def test_bad_input_is_invalid_argument_and_server_stays_healthy(server: Server, name: str, workers: int,
                                                                 conf_key: str) -> None:
    from raydist._proto import pb

    msg = pb.ClusterSpec(name=name, workers=workers)
    msg.spark_conf[conf_key or "x"] = "1"
    try:
        ClusterSpec(name=name, workers=workers, spark_conf={conf_key or "x": "1"})
        return  # a valid spec is not this test's business
    except Exception as exc:  # noqa: BLE001
        expected_field = exc.field  # type: ignore[attr-defined]
    with pytest.raises(RPCError) as err:
        server.client().create(msg)
    assert err.value.code == "INVALID_ARGUMENT"
    assert err.value.details.startswith(expected_field.split("[")[0])
    assert server.client().server_info().version


def test_a_second_server_on_the_same_home_refuses_with_the_reason(server: Server) -> None:
    second = server.cli("serve", "--port", str(free_port()), timeout=120)
    assert second.returncode == 3
    assert f"RAYDIST_HOME={server.home}" in second.stderr
    assert str(server.proc.pid) in second.stderr  # names the server that holds it
    assert server.client().server_info().version  # the first one is untouched


def test_cli_usage_errors(server: Server) -> None:
    bad = server.cli("up", "Not_A_Name", "-w", "1")
    assert bad.returncode == 2 and "name" in bad.stderr and "DNS label" in bad.stderr
    missing = server.cli("up")
    assert missing.returncode == 2
    huge = server.cli("up", "huge", "-w", "50", "--cpus-per-worker", "1", "--no-wait")
    assert huge.returncode == 1 and "Spark cannot fit" in huge.stderr and "workers <= 2" in huge.stderr
    with pytest.raises(RPCError) as err:
        server.client().create(ClusterSpec(name="huge", workers=50, cpus_per_worker=1))
    assert err.value.code == "RESOURCE_EXHAUSTED"
    with pytest.raises(RPCError) as conf:  # the server's Spark runs already: not silently ignored
        server.client().create(ClusterSpec(name="conf", workers=1, spark_conf={"spark.executor.memory": "1g"}))
    assert conf.value.code == "INVALID_ARGUMENT" and conf.value.details.startswith("spark_conf")
    assert server.client().server_info().version  # still healthy


def test_server_killed_then_restarted_reconciles(tmp_path: Path) -> None:
    before = {p.pid for p in ray_processes()}
    srv = Server(tmp_path, free_port()).start()
    client = srv.client()
    client.create(ClusterSpec(name="doomed", workers=1, cpus_per_worker=1))
    cluster = client.wait("doomed", timeout=180)
    gcs = cluster.address
    assert cluster.state == 2, cluster.message  # RUNNING
    srv.stop(signal.SIGKILL)
    # Every Ray process of the dead server's cluster goes: supervisors watch it.
    assert not wait_no_ray_processes(timeout=30, ignore=before), "orphans after the control plane died"
    srv.start()
    try:
        again = srv.client().get("doomed")
        assert again.state == 6 and "restarted" in again.message  # FAILED, with the reason
        assert not [p for p in ray_processes() if gcs in " ".join(p.cmdline())]
    finally:
        assert srv.stop() == 0


def test_a_cluster_that_asks_to_come_back_survives_a_rolling_restart(tmp_path: Path) -> None:
    """SIGTERM (a rolling update) stops the cluster without forgetting it;
    the next server starts it again once it serves."""
    before = {p.pid for p in ray_processes()}
    srv = Server(tmp_path, free_port()).start()
    try:
        srv.client().create(ClusterSpec(name="phoenix", workers=1, cpus_per_worker=1), restart_on_server_restart=True)
        first = srv.client().wait("phoenix", timeout=180)
        assert first.state == 2, first.message  # RUNNING
        assert srv.stop() == 0
        assert not wait_no_ray_processes(timeout=30, ignore=before), "orphans after the control plane stopped"
        srv.start()
        again = srv.client().wait("phoenix", timeout=240)
        assert again.state == 2, again.message  # RUNNING again
        assert again.address != first.address
        srv.client().delete("phoenix")
    finally:
        srv.stop()
    assert not wait_no_ray_processes(timeout=30, ignore=before)


def test_an_idle_control_plane_stops_itself_and_serve_stop_stops_one(tmp_path: Path) -> None:
    idle = Server(tmp_path / "idle", free_port(), extra=["--idle-stop-s", "2"], master=NO_CLUSTERS)
    (tmp_path / "idle").mkdir()
    idle.start()
    try:
        assert idle.proc.wait(timeout=120) == 0  # no cluster for 2 s: it stopped by itself
    finally:
        idle.stop()
    busy = Server(tmp_path / "busy", free_port(), master=NO_CLUSTERS)
    (tmp_path / "busy").mkdir()
    busy.start()
    try:
        stopped = busy.cli("serve", "--stop", timeout=240)
        assert stopped.returncode == 0 and "stopped the control plane" in stopped.stdout, stopped.stderr
        assert busy.proc.poll() == 0
        again = busy.cli("serve", "--stop")
        assert again.returncode == 0 and "no control plane is running" in again.stdout
    finally:
        busy.stop()


def test_a_spark_that_cannot_start_is_retried_and_creates_say_why(tmp_path: Path) -> None:
    import time

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from raydist.errors import ControlPlaneUnavailableError

    srv = Server(tmp_path, free_port(), master="bogus://nowhere:1").start()
    try:
        service = "raydist.v1.ClusterService"
        with grpc.insecure_channel(srv.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            deadline = time.monotonic() + 90
            while stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status != 2:  # NOT_SERVING
                assert time.monotonic() < deadline, "ClusterService never became NOT_SERVING"
                time.sleep(0.5)
            # The process itself is alive: a liveness probe must not restart it.
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1  # SERVING
        with pytest.raises(ControlPlaneUnavailableError, match="Spark is not running"):
            srv.client(retries=0, retry_s=0).create(ClusterSpec(name="later", workers=1, cpus_per_worker=1))
        assert srv.client().list() == []  # reads still answer
        assert "retrying in" in (tmp_path / "test-server.log").read_text()
    finally:
        assert srv.stop() == 0


def test_token_over_tls(tmp_path: Path) -> None:
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    srv = Server(tmp_path, free_port(), ["--tls-cert", str(cert), "--tls-key", str(key)], master=NO_CLUSTERS).start()
    try:
        assert srv.client(tls_ca=str(cert)).list() == []
        with pytest.raises(RPCError) as wrong:
            srv.client(tls_ca=str(cert), token="wrong").list()
        assert wrong.value.code == "UNAUTHENTICATED"
        from raydist.errors import ControlPlaneUnavailableError

        with pytest.raises(ControlPlaneUnavailableError):
            srv.client(retries=0, retry_s=0).list()  # plaintext to a TLS port
        # The CLI, by flag or by RAYDIST_TLS_CA (raydist.up(address=) reads it too).
        by_flag = srv.cli("status", "--tls-ca", str(cert), "-o", "json")
        assert by_flag.returncode == 0 and json.loads(by_flag.stdout) == [], by_flag.stderr
        srv.env["RAYDIST_TLS_CA"] = str(cert)
        by_env = srv.cli("status", "-o", "json")
        assert by_env.returncode == 0 and json.loads(by_env.stdout) == [], by_env.stderr
    finally:
        assert srv.stop() == 0
