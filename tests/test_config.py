"""`raydist serve`'s configuration: file, flags, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from raydist.control.config import ServerConfig
from raydist.errors import SpecError

pytestmark = pytest.mark.unit

GOOD = """
[server]
host = "0.0.0.0"
port = 50200
grace_s = 5

[spark]
master = "spark://m:7077"

[spark.conf]
"spark.executor.cores" = 4
"spark.dynamicAllocation.enabled" = true

[ray]
gcs_port = 6379
"""


def test_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "raydist.toml"
    path.write_text(GOOD)
    cfg = ServerConfig.load(path)
    assert (cfg.host, cfg.port, cfg.grace_s, cfg.spark_master) == ("0.0.0.0", 50200, 5.0, "spark://m:7077")
    assert cfg.spark_conf == {"spark.executor.cores": "4", "spark.dynamicAllocation.enabled": "true"}
    assert cfg.head_ports == {"gcs": 6379}
    merged = cfg.merged(port=50300, host=None, spark_conf={"spark.executor.memory": "2g"})
    assert (merged.port, merged.host) == (50300, "0.0.0.0")
    assert merged.spark_conf["spark.executor.memory"] == "2g" and merged.spark_conf["spark.executor.cores"] == "4"


def test_a_connect_target_puts_every_head_in_a_task() -> None:
    cfg = ServerConfig.from_toml("[spark]\nremote = 'sc://connect:15002'\n")
    assert cfg.spark_remote == "sc://connect:15002" and cfg.spark_master is None
    assert cfg.heads_in_tasks()  # a Connect client runs no Spark driver to put a head beside


def test_defaults_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYDIST_CONFIG", raising=False)
    assert ServerConfig.load() == ServerConfig()


def test_the_metrics_listen_on_loopback_unless_exposed_on_purpose() -> None:
    # They are not authenticated: a server exposed on 0.0.0.0 keeps them local.
    exposed = ServerConfig.from_toml("[server]\nhost = '0.0.0.0'\n")
    assert (exposed.host, exposed.metrics_host) == ("0.0.0.0", "127.0.0.1")
    assert ServerConfig.from_toml("[server]\nmetrics_host = '0.0.0.0'\n").metrics_host == "0.0.0.0"


def test_metrics_name_a_tenants_cluster_by_a_digest_only() -> None:
    from raydist.control.metrics import cluster_label

    assert cluster_label("train") == "train"  # the admin's own
    label = cluster_label("train.team-a")
    assert label.startswith("t-") and "train" not in label and "team" not in label
    assert label == cluster_label("train.team-a") != cluster_label("train.team-b")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[server]\nport = 'x'\n", "server.port"),
        ("[server]\nport = true\n", "server.port"),
        ("[server]\nprot = 1\n", "server.prot"),
        ("[server]\ntls_client_ca = 'ca.pem'\n", "server.tls_client_ca"),
        ("[spark.conf]\n'executor.cores' = 1\n", "spark.conf.executor.cores"),
        ("[spark]\nmaster = ''\n", "spark.master"),
        ("[ray]\nclient_port = 15000\n", "ray.client_port"),
        ("[server]\ngrace_s = nan\n", "server.grace_s"),
        ("[server]\nhost = ''\n", "server.host"),
        ("[server]\nmetrics_host = ' '\n", "server.metrics_host"),
        ("[server]\nport = 7000\nmetrics_port = 7000\n", "server.metrics_port"),
        ("[server]\nport = 7000\n[ray]\ngcs_port = 7000\n", "ray.gcs_port"),
        ("[server]\nidle_stop_s = -1\n", "server.idle_stop_s"),
        ("[server]\nidle_stop_s = inf\n", "server.idle_stop_s"),
        ("[spark]\nremote = 'http://x:15002'\n", "spark.remote"),
        ("[spark]\nremote = 'sc://x:15002'\nmaster = 'spark://m:7077'\n", "spark.remote"),
        ("[spark]\nremote = 'sc://x:15002'\n[ray]\nhead = 'driver'\n", "ray.head"),
        ("[server]\nlink_ports = '50200'\n", "server.link_ports"),
        ("[server]\nlink_ports = '50263-50200'\n", "server.link_ports"),
        ("[server]\nlink_ports = '15000-15063'\n", "server.link_ports"),
        ("[server]\nlink_ports = '50100-50200'\n", "server.link_ports"),  # holds server.port 50151
        ("[extra]\n", "extra"),
        ("not toml [", "config"),
    ],
)
def test_errors_name_the_key(text: str, field: str) -> None:
    with pytest.raises(SpecError) as info:
        ServerConfig.from_toml(text)
    assert info.value.field == field


def test_a_secret_file_others_can_read_is_narrowed_and_still_read(tmp_path, monkeypatch, caplog) -> None:
    """As Kubernetes' fsGroup leaves it: group-readable. raydist reads it and
    makes it 0600 again, naming the file and never its content."""
    import stat

    from raydist.paths import read_private

    path = tmp_path / "control_token"
    path.write_text("s3cr3t-value\n")
    path.chmod(0o660)
    with caplog.at_level("WARNING"):
        assert read_private(path) == "s3cr3t-value"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "control_token" in caplog.text and "s3cr3t" not in caplog.text
    assert read_private(tmp_path / "missing") is None


def test_link_ports_name_a_range_the_node_links_listen_in() -> None:
    assert ServerConfig().link_port_range() is None  # any free port
    assert ServerConfig.from_toml("[server]\nlink_ports = ' 50200 - 50263 '\n").link_port_range() == (50200, 50263)


def test_event_retention_keys_are_read_and_checked() -> None:
    from raydist.control.config import ServerConfig
    from raydist.errors import SpecError

    cfg = ServerConfig.from_toml("[server]\nevents_keep = 50\nevents_max_age_s = 3600\n")
    assert (cfg.events_keep, cfg.events_max_age_s) == (50, 3600.0)
    with pytest.raises(SpecError, match="server.events_keep"):
        ServerConfig.from_toml("[server]\nevents_keep = 0\n")
