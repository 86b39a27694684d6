"""Tenants on one control plane: each sees and controls only its own clusters.

A real `raydist serve` with two tenants by token (alice, bob) beside its own
admin token; alice runs a real cluster; bob, holding a valid token of his
own, tries everything on it through the Python client and the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raydist._proto import pb
from raydist.control.client import Client
from raydist.control.config import ServerConfig
from raydist.control.tenants import Tenants
from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
from raydist.engine.ports import free_port
from raydist.errors import RPCError, SpecError
from tests.control_server import NO_CLUSTERS, Server

pytestmark = pytest.mark.integration


def _token_file(path: Path, token: str, mode: int = 0o600) -> Path:
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    home = tmp_path_factory.mktemp("home")
    tokens = {"alice": "alice-" + os.urandom(12).hex(), "bob": "bob-" + os.urandom(12).hex(),
              "carol": "carol-" + os.urandom(12).hex()}
    lines = []
    for name, token in tokens.items():
        lines += [f"[tenants.{name}]", f'token_file = "{_token_file(home / f"{name}.token", token)}"']
    lines += ["max_slow_calls = 0", "max_watches = 0"]  # carol's quota: nothing that waits, no streams
    lines += ["[ray]", 'head = "executor"']  # tenants run no code beside the control plane
    config = home / "raydist.toml"
    config.write_text("\n".join(lines) + "\n")
    before = {p.pid for p in ray_processes()}
    srv = Server(home, free_port(), ["--config", str(config)]).start()
    yield srv, tokens
    assert srv.stop() == 0
    assert not wait_no_ray_processes(ignore=before)


def _refusal(call: object) -> tuple[str, str]:
    with pytest.raises(RPCError) as err:
        call()  # type: ignore[operator]
    return err.value.code, err.value.details


def _cli(server: Server, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a tenant runs it: the server's address and the tenant's own token."""
    env = {**server.env, "RAYDIST_TOKEN": token, "RAYDIST_HOME": "/nonexistent-tenant-home"}
    return subprocess.run([sys.executable, "-m", "raydist.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_tenant_cannot_see_reach_or_learn_of_another_tenants_cluster(tenants) -> None:
    server, tokens = tenants
    alice, bob, admin = (server.client(token=tokens["alice"]), server.client(token=tokens["bob"]),
                         server.client())
    alice.create(pb.ClusterSpec(name="x", workers=1, cpus_per_worker=1, env={"SECRET_VALUE": "s3cr3t"}))
    try:
        alice.wait("x", timeout=300)
        up = _cli(server, tokens["alice"], "status", "x", "-o", "json")
        assert up.returncode == 0 and json.loads(up.stdout)["state"] == "RUNNING", up.stdout + up.stderr
        # Alice sees her cluster by the name she gave it, env and credentials included.
        mine = alice.get("x")
        assert mine.spec.name == "x" and mine.state == pb.RUNNING and mine.spec.env["SECRET_VALUE"] == "s3cr3t"
        assert [c.spec.name for c in alice.list()] == ["x"]
        creds = alice.credentials("x")
        assert creds.name == "x" and creds.ray_token

        # Bob, with a valid token of his own, finds nothing named x: every
        # by-name call answers exactly as for a name nobody ever used.
        calls = {
            "get": lambda n: bob.get(n),
            "credentials": lambda n: bob.credentials(n),
            "logs": lambda n: bob.node_logs(n, "0"),
            "delete": lambda n: bob.delete(n),
            "resize": lambda n: bob.update(n, workers=2),
            "watch": lambda n: next(iter(bob.watch(n))),
        }
        for what, call in calls.items():
            code, details = _refusal(lambda c=call: c("x"))
            never_code, never_details = _refusal(lambda c=call: c("never-made"))
            assert code == never_code == "NOT_FOUND", (what, code, details)
            assert details == never_details.replace("never-made", "x"), (what, details, never_details)
            assert "alice" not in details
        assert bob.list() == [] and bob.server_info().clusters == 0
        status = _cli(server, tokens["bob"], "status", "-o", "json")
        assert status.returncode == 0 and json.loads(status.stdout) == [], status.stderr
        env = _cli(server, tokens["bob"], "env", "x")
        assert env.returncode != 0 and creds.ray_token not in env.stdout + env.stderr
        # Nor does a name of his own collide with hers: bob's x is his.
        assert bob.create(pb.ClusterSpec(name="x", workers=1), validate_only=True).spec.name == "x"
        # Naming alice's cluster the way an admin does is not a way in either.
        assert _refusal(lambda: bob.get("x.alice"))[0] == "INVALID_ARGUMENT"

        # Alice's cluster is untouched, and the admin sees it under its full name, with its owner on record.
        assert alice.get("x").state == pb.RUNNING and alice.get("x").desired_workers == 1
        assert [c.spec.name for c in admin.list()] == ["x.alice"]
        history = [e.message for e in admin.watch("x.alice", history=True, timeout=5) if e.message]
        assert "accepted from tenant alice" in history, history
        given = [m for m in history if m.startswith("credentials given to")]
        assert given and all(m.endswith("(tenant alice)") for m in given), history
        events = _cli(server, server.token, "logs", "x.alice").stdout
        for text in (events, (server.home / "test-server.log").read_text()):
            assert tokens["alice"] not in text and tokens["bob"] not in text and creds.ray_token not in text
    finally:
        down = _cli(server, tokens["alice"], "down", "x")
    assert down.returncode == 0, down.stderr
    assert alice.get("x").state == pb.DELETED


def test_a_tenant_past_its_quota_is_told_which_and_how_to_free_it(tenants) -> None:
    server, tokens = tenants
    carol, alice = server.client(token=tokens["carol"]), server.client(token=tokens["alice"])
    code, details = _refusal(lambda: carol.create(pb.ClusterSpec(name="y", workers=1), validate_only=True))
    assert code == "RESOURCE_EXHAUSTED" and "max_slow_calls = 0" in details and "[tenants.carol]" in details
    code, details = _refusal(lambda: next(iter(carol.watch("y"))))
    assert code == "RESOURCE_EXHAUSTED" and "max_watches = 0" in details
    assert carol.list() == []  # what waits on nothing is not bounded
    # Another tenant's quota is its own.
    assert alice.create(pb.ClusterSpec(name="y", workers=1), validate_only=True).spec.name == "y"


def test_a_wrong_token_is_refused_and_tokens_live_in_private_files(tenants, tmp_path: Path) -> None:
    server, tokens = tenants
    assert _refusal(lambda: server.client(token=tokens["alice"] + "x").list())[0] == "UNAUTHENTICATED"
    loose = _token_file(tmp_path / "loose.token", "a-token-of-enough-length", 0o644)
    config = ServerConfig.from_toml(f'[tenants.carol]\ntoken_file = "{loose}"\n')
    with pytest.raises(SpecError) as err:
        Tenants("admin-token-of-its-own", config.tenants)
    assert err.value.field == "tenants.carol.token_file" and "chmod 600" in str(err.value)


def test_tenant_settings_name_the_field() -> None:
    with pytest.raises(SpecError) as err:
        ServerConfig.from_toml('[tenants.Bad_Name]\ntoken_file = "/x"\n')
    assert err.value.field == "tenants.Bad_Name"
    with pytest.raises(SpecError) as err:
        ServerConfig.from_toml("[tenants.team-b]\nadmin = true\n")
    assert err.value.field == "tenants.team-b" and "token_file" in str(err.value)
    with pytest.raises(SpecError) as err:
        ServerConfig.from_toml('[tenants.team-b]\nsubject = "CN=team-b"\n')
    assert err.value.field == "tenants.team-b.subject" and "tls_client_ca" in str(err.value)
    with pytest.raises(SpecError) as err:
        ServerConfig.from_toml('[tenants.team-b]\nsubjekt = "CN=team-b"\n')
    assert err.value.field == "tenants.team-b.subjekt"


def test_two_tenants_with_one_token_are_refused(tmp_path: Path) -> None:
    shared = _token_file(tmp_path / "shared", "one-token-for-two-tenants")
    config = ServerConfig.from_toml(f'[tenants.a]\ntoken_file = "{shared}"\n[tenants.b]\ntoken_file = "{shared}"\n')
    with pytest.raises(SpecError) as err:
        Tenants("admin-token-of-its-own", config.tenants)
    assert err.value.field == "tenants.b.token_file" and "tenant a" in str(err.value)
    assert "one-token-for-two-tenants" not in str(err.value)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificate(tmp: Path, name: str, ca: tuple[Path, Path], *, server: bool = False) -> tuple[Path, Path]:
    key, csr, cert = tmp / f"{name}.key", tmp / f"{name}.csr", tmp / f"{name}.pem"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    ext = tmp / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "1", "-extfile", str(ext), "-out", str(cert))
    return cert, key


def test_an_mtls_certificate_names_its_tenant(tmp_path: Path) -> None:
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    ca = (tmp_path / "ca.pem", tmp_path / "ca.key")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=raydist-test-ca",
             "-keyout", str(ca[1]), "-out", str(ca[0]))
    server_cert, server_key = _certificate(tmp_path, "localhost", ca, server=True)
    team_cert, team_key = _certificate(tmp_path, "team-b", ca)
    other_cert, other_key = _certificate(tmp_path, "someone-else", ca)
    config = tmp_path / "raydist.toml"
    config.write_text(f'[server]\ntls_cert = "{server_cert}"\ntls_key = "{server_key}"\ntls_client_ca = "{ca[0]}"\n'
                      '[tenants.team-b]\nsubject = "CN=team-b"\n[ray]\nhead = "executor"\n')
    srv = Server(tmp_path, free_port(), ["--config", str(config)], master=NO_CLUSTERS).start()
    try:
        def client(cert: Path, key: Path, token: str | None) -> Client:
            return Client(srv.address, token=token, tls_ca=str(ca[0]), tls_cert=str(cert), tls_key=str(key),
                          retries=0, retry_s=0)

        team_b = client(team_cert, team_key, None)
        assert team_b.list() == [] and team_b.server_info().version
        # The same CA's certificate of someone no tenant names is nobody, without a token.
        assert _refusal(lambda: client(other_cert, other_key, None).list())[0] == "UNAUTHENTICATED"
        # A token still names its holder, the admin's included, whatever certificate carries it.
        assert client(other_cert, other_key, srv.token).server_info().version
        assert _refusal(lambda: client(team_cert, team_key, "not-a-token-anyone-has").list())[0] == "UNAUTHENTICATED"
    finally:
        assert srv.stop() == 0


def test_the_control_token_leaves_no_trace_in_the_servers_environment(tmp_path: Path) -> None:
    token = "deployment-" + os.urandom(16).hex()
    srv = Server(tmp_path, free_port(), master=NO_CLUSTERS)
    srv.env["RAYDIST_TOKEN"] = token  # as the Kubernetes Deployment hands it over
    srv.start()
    try:
        assert srv.client(token=token).list() == []
        # /proc/<pid>/environ keeps what a process started with: the server started again without it.
        environ = Path(f"/proc/{srv.proc.pid}/environ").read_bytes()
        assert token.encode() not in environ and b"RAYDIST_TOKEN=" not in environ
        assert not (tmp_path / "control_token").exists()  # nor did it make a token of its own
    finally:
        assert srv.stop() == 0
