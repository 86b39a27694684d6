"""The control plane's configuration: defaults, a TOML file, then flags.

A deployment (the Kubernetes ConfigMap, a systemd unit) keeps everything in
one file, ``raydist.toml``::

    [server]
    host = "0.0.0.0"
    port = 50151
    metrics_port = 9090
    metrics_host = "0.0.0.0"        # unauthenticated: 127.0.0.1 unless scraped from elsewhere
    events_keep = 1000              # each cluster's newest events kept
    events_max_age_s = 604800       # and none older (7 days)

    [spark]
    master = "k8s://https://kubernetes.default.svc"
    # or, for a Spark reached only through Spark Connect:
    # remote = "sc://spark-connect:15002"

    [spark.conf]
    "spark.executor.instances" = "2"

    [ray]
    gcs_port = 6379

    [tenants.alice]                 # see raydist.control.tenants
    token_file = "/etc/raydist/tokens/alice"

The file is named by ``--config`` or ``RAYDIST_CONFIG``; command-line flags
win over it. Every mistake is a :class:`~raydist.errors.SpecError` naming the
key as written in the file.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.control.tenants import TenantConfig
from raydist.engine.node.launch import HEAD_PORTS
from raydist.errors import SpecError

__all__ = ["CONFIG_ENV", "ServerConfig"]

#: Environment variable naming the configuration file.
CONFIG_ENV = "RAYDIST_CONFIG"

_SERVER_KEYS = {"host": str, "port": int, "metrics_port": int, "metrics_host": str, "grace_s": float,
                "idle_stop_s": float,
                "events_keep": int, "events_max_age_s": float,
                "tls_cert": str, "tls_key": str,
                "tls_client_ca": str, "link_ports": str}
_KIND_WORDS = {str: "a string", int: "a whole number", float: "a number"}
#: `[ray] <name>_port` for each head port the engine lets a deployment pin.
_RAY_KEYS = {f"{name}_port": name for name in HEAD_PORTS}
#: Where each cluster's head runs.
HEAD_PLACES = ("auto", "executor", "driver")


@dataclass
class ServerConfig:
    """What ``raydist serve`` runs with.

    Attributes:
        host / port: where the gRPC API listens (127.0.0.1 unless exposed on
            purpose, e.g. ``0.0.0.0`` in a pod).
        metrics_port: Prometheus port; 0 picks a free one, -1 turns it off.
        metrics_host: where the metrics listen: 127.0.0.1 unless exposed on
            purpose (a pod's scrape target), since they are not authenticated.
        grace_s: how long in-flight RPCs may finish on SIGTERM.
        idle_stop_s: stop after this long without a cluster (0: never). The
            control plane that ``raydist up`` starts for you uses 600 s.
        tls_cert / tls_key / tls_client_ca: TLS, and mTLS with a client CA.
        spark_master: the Spark target; an embedded ``local-cluster`` when unset.
        spark_remote: a Spark Connect target (``sc://host:port``) instead of
            a master: the control plane is then a Connect client, and every
            cluster's head runs in a Spark task.
        spark_conf: Spark settings for the server's SparkSession.
        head_ports: fixed head ports (``gcs``, ``client``, ``dashboard``) for
            the first cluster on a host, so a firewall rule can name them;
            later clusters there get free ports.
        link_ports: ``"low-high"``: the ports the node links of clusters
            listen on, one per running cluster (default: any free port), so
            that a firewall rule or a NetworkPolicy can let executors reach
            the control plane on these and Spark's ports alone.
        head: where each cluster's head runs: ``executor``, a Spark task of
            its own, so that no tenant code runs in the control plane's
            process tree where its secrets are; ``driver``, beside the control
            plane (one task slot fewer per cluster); ``auto`` (default):
            ``executor`` on a cluster manager (``spark://``, ``k8s://``,
            YARN), ``driver`` on a ``local``/``local-cluster`` master, whose
            executors are the control plane's own children anyway.
        tenants: who may call besides the control plane's own token, each
            seeing only its own clusters (:mod:`raydist.control.tenants`).
        events_keep / events_max_age_s: each cluster's events kept (the
            newest 1,000, none older than 7 days, by default): every
            credentials call and node change adds one. A DELETED cluster is
            forgotten (its row and events) ``events_max_age_s`` after its
            deletion.
    """

    host: str = "127.0.0.1"
    port: int = 50151
    spark_master: str | None = None
    spark_remote: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    grace_s: float = 10.0
    idle_stop_s: float = 0.0
    spark_conf: dict[str, str] = field(default_factory=dict)
    head_ports: dict[str, int] = field(default_factory=dict)
    head: str = "auto"
    link_ports: str = ""
    tenants: tuple[TenantConfig, ...] = ()
    events_keep: int = 1000
    events_max_age_s: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        if not isinstance(self.events_keep, int) or isinstance(self.events_keep, bool) or self.events_keep < 1:
            raise SpecError("server.events_keep", self.events_keep, "a whole number of events, 1 or more")
        if not isinstance(self.events_max_age_s, (int, float)) or self.events_max_age_s <= 0:
            raise SpecError("server.events_max_age_s", self.events_max_age_s, "a number of seconds above 0")
        if self.head not in HEAD_PLACES:
            raise SpecError("ray.head", self.head, f"one of {', '.join(HEAD_PLACES)}")
        for name in ("port", "metrics_port"):
            value = getattr(self, name)
            low = -1 if name == "metrics_port" else 0
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 65535:
                raise SpecError(f"server.{name}", value, f"an integer port from {low} to 65535")
        for name in ("host", "metrics_host"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise SpecError(f"server.{name}", value, "an address to listen on, such as 127.0.0.1 or 0.0.0.0")
        taken: dict[int, str] = {}
        named = [("server.port", self.port), ("server.metrics_port", self.metrics_port)]
        named += [(f"ray.{name}_port", port) for name, port in self.head_ports.items()]
        for label, port in named:
            if isinstance(port, int) and not isinstance(port, bool) and port > 0:
                if port in taken:
                    raise SpecError(label, port, f"a port of its own; {taken[port]} uses it already")
                taken[port] = label
        for name, port in self.head_ports.items():
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                raise SpecError(f"ray.{name}_port", port, "an integer port from 1 to 65535")
            if 10002 <= port <= 19999:
                raise SpecError(f"ray.{name}_port", port, "a port outside Ray's worker ports 10002-19999")
        links = self.link_port_range()  # raises for a malformed range
        if links is not None:
            for label, port in named:
                if isinstance(port, int) and links[0] <= port <= links[1]:
                    raise SpecError("server.link_ports", self.link_ports, f"a range without {label} ({port})")
        for name in ("grace_s", "idle_stop_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
                raise SpecError(f"server.{name}", value, "seconds >= 0 (a finite number)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SpecError("server.tls_cert" if not self.tls_cert else "server.tls_key", None,
                            "give tls_cert and tls_key together")
        if self.tls_client_ca and not self.tls_cert:
            raise SpecError("server.tls_client_ca", self.tls_client_ca, "mTLS needs tls_cert and tls_key as well")
        if self.spark_remote is not None:
            if not isinstance(self.spark_remote, str) or not self.spark_remote.startswith("sc://"):
                raise SpecError("spark.remote", self.spark_remote, "a Spark Connect address such as sc://host:15002")
            if self.spark_master:
                raise SpecError("spark.remote", self.spark_remote, "either spark.master or spark.remote, not both")
            if self.head == "driver":
                raise SpecError("ray.head", self.head, "'executor' or 'auto' with spark.remote: a Connect "
                                "client runs no Spark driver, so heads run in Spark tasks")
        for key, value in self.spark_conf.items():
            if not key.startswith("spark."):
                raise SpecError(f"spark.conf.{key}", value, "Spark settings start with 'spark.'")
        remotes: dict[str, str] = {self.spark_remote: "the control plane"} if self.spark_remote else {}
        for tenant in self.tenants:
            if tenant.subject and not self.tls_client_ca:
                raise SpecError(f"tenants.{tenant.name}.subject", tenant.subject,
                                "a certificate subject needs mTLS: set server.tls_client_ca (and tls_cert, tls_key)")
            if tenant.spark_remote:
                if tenant.spark_remote in remotes:
                    raise SpecError(f"tenants.{tenant.name}.spark_remote", tenant.spark_remote,
                                    f"a Spark application of its own ({remotes[tenant.spark_remote]} has this one)")
                remotes[tenant.spark_remote] = f"tenant {tenant.name}"
                if self.head == "driver":
                    raise SpecError("ray.head", self.head,
                                    f"'executor' or 'auto': tenant {tenant.name}'s clusters run on a Spark Connect "
                                    "server, whose client runs no Spark driver, so heads run in Spark tasks")

    @classmethod
    def from_toml(cls, text: str, source: str = "config") -> ServerConfig:
        """Parse a ``raydist.toml`` document (see the module docstring)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(source, "(unparsable)", f"valid TOML ({exc})") from None
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ServerConfig:
        """Build from the parsed file's tables; unknown keys are errors."""
        unknown = set(data) - {"server", "spark", "ray", "tenants"}
        if unknown:
            raise SpecError(sorted(unknown)[0], data[sorted(unknown)[0]],
                            "tables are [server], [spark], [ray] and [tenants]")
        kw: dict[str, Any] = {}
        for key, value in _table(data, "server").items():
            kind = _SERVER_KEYS.get(key)
            if kind is None:
                raise SpecError(f"server.{key}", value, f"one of {', '.join(sorted(_SERVER_KEYS))}")
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise SpecError(f"server.{key}", value, _KIND_WORDS[kind])
            kw[key] = value
        spark = _table(data, "spark")
        for key, value in spark.items():
            if key == "master":
                if not isinstance(value, str) or not value:
                    raise SpecError("spark.master", value, "a Spark master URL such as spark://host:7077")
                kw["spark_master"] = value
            elif key == "remote":
                kw["spark_remote"] = value
            elif key == "conf":
                conf = _table(spark, "conf", "spark.conf")
                kw["spark_conf"] = {k: _conf_value(k, v) for k, v in conf.items()}
            else:
                raise SpecError(f"spark.{key}", value, "keys are 'master', 'remote' and 'conf'")
        ports = {}
        for key, value in _table(data, "ray").items():
            if key == "head":
                kw["head"] = value
            elif key not in _RAY_KEYS:
                raise SpecError(f"ray.{key}", value, f"one of {', '.join(sorted([*_RAY_KEYS, 'head']))}")
            else:
                ports[_RAY_KEYS[key]] = value
        kw["head_ports"] = ports
        kw["tenants"] = tuple(TenantConfig.from_mapping(name, table)
                              for name, table in _table(data, "tenants").items())
        return cls(**kw)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> ServerConfig:
        """The file at ``path``, else at ``RAYDIST_CONFIG``, else the defaults."""
        where = path or os.environ.get(CONFIG_ENV)
        if not where:
            return cls()
        try:
            text = Path(where).read_text()
        except OSError as exc:
            raise SpecError("--config" if path else CONFIG_ENV, str(where),
                            f"a readable raydist.toml ({exc.strerror})") from None
        return cls.from_toml(text, str(where))

    def link_port_range(self) -> tuple[int, int] | None:
        """``link_ports`` as (low, high), or None for any free port."""
        if not self.link_ports:
            return None
        found = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", str(self.link_ports))
        low, high = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
        if not found or not 1 <= low <= high <= 65535:
            raise SpecError("server.link_ports", self.link_ports, 'a port range such as "50200-50263"')
        if low <= 19999 and high >= 10002:
            raise SpecError("server.link_ports", self.link_ports, "a range outside Ray's worker ports 10002-19999")
        return low, high

    def heads_in_tasks(self) -> bool:
        """Whether clusters' heads run in Spark tasks (``head``, resolved)."""
        if self.head != "auto":
            return self.head == "executor"
        return self.on_cluster_manager()

    def check_isolation(self) -> None:
        """Refuse a configuration whose tenants would run code beside the
        control plane: with heads on the driver, a tenant's Ray jobs run on
        the head node, in the control plane's process tree, where its token,
        its store and every cluster's Ray token are; on a cluster manager, a
        tenant's Ray tasks in the executors of a Spark application it shares
        with other clusters can read their task data. SpecError naming the fix."""
        if any(not t.admin for t in self.tenants) and not self.heads_in_tasks():
            raise SpecError("ray.head", self.head,
                            "tenants need each cluster's head in a Spark task of its own: set head = \"executor\" "
                            "in [ray] (or --head executor), or run the control plane on a cluster manager "
                            "(spark://, k8s://, YARN), where that is the default")
        if not self.on_cluster_manager():
            return  # one machine, one user: tenants are kept apart at the API, not by Spark
        for tenant in self.tenants:
            # A Ray task runs in a Spark executor, which holds what an executor
            # needs toward its driver (on Kubernetes, Spark's auth secret): with
            # it, a task can read the task data of every cluster on the same
            # application, other tenants' node keys and Ray tokens among them.
            if not tenant.admin and not tenant.spark_remote and not tenant.shared_spark:
                raise SpecError(f"tenants.{tenant.name}.spark_remote", None,
                                "a Spark application of the tenant's own (spark_remote = \"sc://...\", a Spark "
                                "Connect server run for it): its Ray tasks run in Spark executors, which can read "
                                "the task data of every cluster on the same application. Or set shared_spark = true "
                                "where the tenants trust each other")

    def on_cluster_manager(self) -> bool:
        """Whether the control plane's Spark runs on a cluster manager (or a
        Spark Connect server), not on this machine alone."""
        if self.spark_remote:
            return True
        master = self.spark_master or os.environ.get("RAYDIST_SPARK_MASTER") or ""
        return bool(master) and not master.startswith("local")

    def merged(self, **overrides: Any) -> ServerConfig:
        """A copy with the given fields replaced; ``None`` leaves a field as is,
        and ``spark_conf`` entries are added to the file's."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        if "spark_conf" in changes:
            changes["spark_conf"] = {**self.spark_conf, **changes["spark_conf"]}
        return dataclasses.replace(self, **changes)


def _table(data: Mapping[str, Any], key: str, label: str | None = None) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise SpecError(label or key, value, "a table")
    return value


def _conf_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise SpecError(f"spark.conf.{key}", value, "a string, number or boolean")
