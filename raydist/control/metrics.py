"""The control plane's Prometheus metrics: clusters by state, RPC counts and
latency, and each running cluster's worker-node history."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from raydist._proto import pb
from raydist.engine.cluster.slot import START_BUCKETS, NodeCounters

__all__ = ["Metrics", "cluster_label"]


def cluster_label(engine_name: str) -> str:
    """How the metrics name a cluster. They are not authenticated, so a
    tenant's cluster (``NAME.TENANT``) is named by a digest of its full name,
    which says neither the tenant nor the name; the admin's own keep theirs."""
    if "." not in engine_name:
        return engine_name
    return "t-" + hashlib.sha256(engine_name.encode()).hexdigest()[:16]


class _NodeCollector:
    """Each running cluster's worker-node history, read at scrape time from
    the engines that own it: starts, losses, restarts, start seconds."""

    def __init__(self, counters: Callable[[], dict[str, NodeCounters]]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        by_cluster = self._counters()
        families = {
            "starts": CounterMetricFamily("raydist_node_starts", "Worker nodes that came up", labels=["cluster"]),
            "losses": CounterMetricFamily("raydist_node_losses",
                                          "Worker nodes lost while their cluster wanted them", labels=["cluster"]),
            "restarts": CounterMetricFamily("raydist_node_restarts",
                                            "Worker nodes' Spark tasks run again", labels=["cluster"]),
        }
        seconds = HistogramMetricFamily("raydist_node_start_seconds",
                                        "From a node's Spark task start to its Ray node up", labels=["cluster"])
        for engine_name, c in sorted(by_cluster.items()):
            name = cluster_label(engine_name)
            families["starts"].add_metric([name], c.starts)
            families["losses"].add_metric([name], c.losses)
            families["restarts"].add_metric([name], c.restarts)
            buckets = [(str(le), n) for le, n in zip(START_BUCKETS, c.start_buckets, strict=True)]
            seconds.add_metric([name], [*buckets, ("+Inf", c.starts)], sum_value=c.start_seconds_sum)
        yield from families.values()
        yield seconds


class Metrics:
    """Prometheus metrics: clusters by state, RPC counts and latency, nodes."""

    def __init__(self, manager_states: Callable[[], dict[str, int]],
                 node_counters: Callable[[], dict[str, NodeCounters]]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.registry.register(_NodeCollector(node_counters))  # type: ignore[arg-type]
        self._count = Counter("raydist_rpc_total", "RPCs by method and status code", ["method", "code"],
                              registry=self.registry)
        self._latency = Histogram("raydist_rpc_seconds", "RPC latency", ["method"], registry=self.registry,
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5))
        gauge = Gauge("raydist_clusters", "Clusters by state", ["state"], registry=self.registry)
        self._states = manager_states
        self._gauge = gauge
        self._children: dict[Any, Any] = {}

    def count(self, method: str, code: str) -> None:
        key = (method, code)
        child = self._children.get(key)
        if child is None:  # label lookups cost a lock and a hash per call: cache them
            child = self._children[key] = self._count.labels(method, code)
        child.inc()

    def observe(self, method: str, seconds: float) -> None:
        child = self._children.get(method)
        if child is None:
            child = self._children[method] = self._latency.labels(method)
        child.observe(seconds)

    def refresh_gauges(self) -> None:
        states = self._states()
        for name in pb.State.keys()[1:]:
            self._gauge.labels(name).set(states.get(name, 0))

    def start(self, host: str, port: int) -> int:
        from prometheus_client import start_http_server

        self.refresh_gauges()
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
