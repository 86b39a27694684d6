"""Who a control-plane call acts as: the caller the auth layer named, and
no one where it named none (a path that missed the auth layer fails closed)."""

from __future__ import annotations

import contextvars

import pytest

from raydist.control.tenants import ADMIN, Caller, calling_as, current_caller
from raydist.errors import AuthenticationError

pytestmark = pytest.mark.unit


def test_code_no_auth_layer_ran_for_acts_as_nobody() -> None:
    def unauthenticated() -> Caller:
        return current_caller()

    nobody = contextvars.Context().run(unauthenticated)  # a context the auth layer never touched
    assert not nobody.admin and nobody.describe() == "nobody"
    assert not nobody.sees("train") and not nobody.sees("train.team-a") and not nobody.sees("x.")
    with pytest.raises(AuthenticationError):
        nobody.scoped("train")


def test_the_named_caller_is_current_for_its_call_only() -> None:
    team = Caller("team-a", admin=False)

    def as_team() -> tuple[Caller, str, bool]:
        calling_as(team)
        return current_caller(), current_caller().scoped("train"), current_caller().sees("train.team-b")

    assert contextvars.Context().run(as_team) == (team, "train.team-a", False)
    assert contextvars.Context().run(lambda: (calling_as(ADMIN), current_caller())[1]) is ADMIN
    assert contextvars.Context().run(current_caller).describe() == "nobody"  # nothing leaked


def test_a_tenants_quota_is_read_from_its_table_with_defaults(tmp_path) -> None:
    from raydist.control.config import ServerConfig
    from raydist.control.tenants import Quota, Tenants
    from raydist.errors import SpecError

    token = tmp_path / "t"
    token.write_text("a-token-of-the-team-" + "x" * 8)
    token.chmod(0o600)
    admin_token = tmp_path / "ops"
    admin_token.write_text("a-token-of-the-ops-" + "y" * 8)
    admin_token.chmod(0o600)
    cfg = ServerConfig.from_toml(f'[tenants.team]\ntoken_file = "{token}"\nmax_clusters = 2\nmax_watches = 0\n'
                                 f'[tenants.ops]\ntoken_file = "{admin_token}"\nadmin = true\n')
    team, ops = cfg.tenants
    assert team.quota == Quota(max_clusters=2, max_workers=Quota().max_workers, max_slow_calls=4, max_watches=0)
    tenants = Tenants("the-admins-own-token-0123", cfg.tenants)
    header = f"Bearer {token.read_text()}".encode()
    assert tenants.by_bearer(header).quota == team.quota
    assert tenants.by_bearer(f"Bearer {admin_token.read_text()}".encode()).quota is None  # an admin has none
    for bad in ("max_clusters = -1", "max_workers = true", "max_slow_calls = 'many'", "max_watchs = 1"):
        with pytest.raises(SpecError) as caught:
            ServerConfig.from_toml(f'[tenants.team]\ntoken_file = "{token}"\n{bad}\n')
        assert caught.value.field == f"tenants.team.{bad.split(' = ')[0]}", bad


def test_tenants_beside_heads_on_the_driver_are_refused_with_the_fix(tmp_path) -> None:
    from raydist.control.config import ServerConfig
    from raydist.errors import SpecError

    token = tmp_path / "t"
    token.write_text("a-token-of-the-team-" + "x" * 8)
    token.chmod(0o600)
    tenant = f'[tenants.team]\ntoken_file = "{token}"\n'
    with pytest.raises(SpecError) as caught:
        ServerConfig.from_toml(tenant + "[spark]\nmaster = 'local-cluster[2,1,1024]'\n").check_isolation()
    assert caught.value.field == "ray.head" and 'head = "executor"' in str(caught.value)
    ServerConfig.from_toml(tenant + "[ray]\nhead = 'executor'\n").check_isolation()  # heads in tasks: served
    own = tenant + "spark_remote = 'sc://spark-team:15002'\n"
    ServerConfig.from_toml(own + "[spark]\nmaster = 'spark://m:7077'\n").check_isolation()
    ServerConfig.from_toml("[spark]\nmaster = 'local[2]'\n").check_isolation()  # no tenants: the admin's alone


def test_tenants_sharing_a_spark_application_on_a_cluster_manager_are_refused_with_the_fix(tmp_path) -> None:
    """On a cluster manager a tenant's Ray tasks run in Spark executors, which
    can act toward their driver as executors (on Kubernetes with Spark's auth
    secret) and read the task data of every cluster of that application:
    each tenant needs a Spark application of its own, or says it shares."""
    from raydist.control.config import ServerConfig
    from raydist.errors import SpecError

    token = tmp_path / "t"
    token.write_text("a-token-of-the-team-" + "x" * 8)
    token.chmod(0o600)
    tenant = f'[tenants.team]\ntoken_file = "{token}"\n'
    for spark in ("[spark]\nmaster = 'spark://m:7077'\n", "[spark]\nmaster = 'k8s://https://k:443'\n",
                  "[spark]\nremote = 'sc://spark:15002'\n"):
        with pytest.raises(SpecError) as caught:
            ServerConfig.from_toml(tenant + spark).check_isolation()
        assert caught.value.field == "tenants.team.spark_remote", spark
        assert "spark_remote = \"sc://" in str(caught.value) and "shared_spark = true" in str(caught.value)
        ServerConfig.from_toml(tenant + "shared_spark = true\n" + spark).check_isolation()  # said so: served
        ServerConfig.from_toml(tenant + "spark_remote = 'sc://team:15002'\n" + spark).check_isolation()
    admin = f'[tenants.ops]\ntoken_file = "{token}"\nadmin = true\n'
    ServerConfig.from_toml(admin + "[spark]\nmaster = 'spark://m:7077'\n").check_isolation()  # sees all anyway
    # Each application is one tenant's: a second tenant, or the control plane, on it is refused.
    two = (f'[tenants.a]\ntoken_file = "{token}"\nspark_remote = "sc://s:1"\n'
           f'[tenants.b]\ntoken_file = "{token}"\nspark_remote = "sc://s:1"\n')
    with pytest.raises(SpecError) as caught:
        ServerConfig.from_toml(two)
    assert caught.value.field == "tenants.b.spark_remote" and "tenant a has this one" in str(caught.value)
    with pytest.raises(SpecError) as caught:
        ServerConfig.from_toml("[spark]\nremote = 'sc://s:1'\n" + two.split("[tenants.b]")[0])
    assert caught.value.field == "tenants.a.spark_remote" and "the control plane has this one" in str(caught.value)
    for bad, field in (("spark_remote = 'http://s:1'", "spark_remote"), ("spark_remote = 1", "spark_remote"),
                       ("spark_remote = 'sc://s:1'\nshared_spark = true", "shared_spark")):
        with pytest.raises(SpecError) as caught:
            ServerConfig.from_toml(tenant + bad + "\n")
        assert caught.value.field == f"tenants.team.{field}", bad


def test_a_head_on_the_driver_gets_an_environment_of_its_own() -> None:
    from raydist.engine.node.launch import head_env

    server = {"PATH": "/usr/bin", "HOME": "/home/svc", "LC_ALL": "C.UTF-8", "CUDA_HOME": "/usr/local/cuda",
              "RAY_DEDUP_LOGS": "0", "RAYDIST_TOKEN": "admin-secret", "RAYDIST_HOME": "/home/svc/.raydist",
              "RAY_AUTH_TOKEN": "ray-secret", "RAY_ADDRESS": "10.0.0.1:6379",
              "AWS_SECRET_ACCESS_KEY": "cloud-secret", "SPARK_HOME": "/opt/spark"}
    assert head_env(server) == {"PATH": "/usr/bin", "HOME": "/home/svc", "LC_ALL": "C.UTF-8",
                                "CUDA_HOME": "/usr/local/cuda", "RAY_DEDUP_LOGS": "0"}
