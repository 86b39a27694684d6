"""``raydist serve``: the gRPC control plane (grpc.aio).

One SparkSession for the server's Spark target; many named clusters on it.
Bearer-token auth on every RPC but health checks; TLS (and mTLS) when given
certificates; standard health and reflection services; Prometheus metrics;
graceful shutdown on SIGTERM.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from raydist._proto import pb, rpc
from raydist.control.auth import AuthInterceptor
from raydist.control.config import ServerConfig
from raydist.control.manager import ClusterManager
from raydist.control.metrics import Metrics
from raydist.control.service import ClusterService
from raydist.control.sparkhost import SparkHost
from raydist.control.store import Store
from raydist.control.tenants import Tenants
from raydist.paths import hold_home, home, private_file, read_private

__all__ = ["ServerConfig", "serve", "load_or_create_server_token", "SERVER_FILE"]

log = logging.getLogger(__name__)

SERVER_FILE = "server.json"
_TOKEN_FILE = "control_token"


#: The descriptor ``raydist serve`` reads ``RAYDIST_TOKEN`` from once it has
#: started itself again without it (see raydist.cli).
TOKEN_FD_ENV = "RAYDIST_TOKEN_FD"


def load_or_create_server_token() -> str:
    """``RAYDIST_TOKEN``, else the token in ``RAYDIST_HOME`` (made on first start, 0600).

    ``RAYDIST_TOKEN`` leaves this process's environment here, before Spark
    or any Ray node starts: nothing the control plane starts inherits it.
    ``raydist serve`` goes further: it starts itself again with the token on
    a pipe (``RAYDIST_TOKEN_FD``), so that not even this process's
    ``/proc/<pid>/environ`` holds it.
    """
    fd = os.environ.pop(TOKEN_FD_ENV, None)
    if fd is not None and fd.isdigit():
        with os.fdopen(int(fd), "rb") as pipe:
            handed = pipe.read().decode().strip()
        if handed:
            os.environ.pop("RAYDIST_TOKEN", None)
            return handed
    given = os.environ.pop("RAYDIST_TOKEN", None)
    if given:
        return given
    path = home() / _TOKEN_FILE
    found = read_private(path)
    if found:
        return found
    token = secrets.token_urlsafe(32)
    private_file(path, token + "\n")
    return token


#: Full method names this server serves (metric labels are limited to them).
_KNOWN_METHODS = frozenset(
    f"/{service.full_name}/{method.name}" for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
) | {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
     "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"}


#: How often DELETED clusters past their retention are forgotten.
PRUNE_EVERY_S = 60.0
#: How often the server asks whether its SparkContext still runs.
SPARK_CHECK_S = 2.0


def _keep_spark(manager: ClusterManager, on_state: Callable[[bool, str], None], stop: threading.Event,
                host: SparkHost | None = None) -> None:
    """Start one of the server's Sparks (its own when ``host`` is None),
    then watch it: when it dies (its JVM was killed, it stopped itself)
    ``on_state`` hears it (the server's own: the service answers
    NOT_SERVING), the clusters that ran on it are torn down, a new session
    is built, and the clusters that ask to come back start again on it."""
    host = host or manager.spark_host
    host.start(on_state, stop)
    if not host.error:
        _freeze_heap()
    while not stop.wait(SPARK_CHECK_S):
        try:
            _heal_spark(manager, host, on_state, stop)
        except Exception:  # noqa: BLE001 - this watch must outlive one failure (a store error, a py4j fault)
            log.exception("watching %s failed; watching on", host.label)


def _heal_spark(manager: ClusterManager, host: SparkHost, on_state: Callable[[bool, str], None],
                stop: threading.Event) -> None:
    """One look at ``host``: when its Spark died, its clusters go, a new
    session starts, and the clusters that ask to come back start on it."""
    if host.alive():
        if not host.started:
            host.start(on_state, stop)  # a heal that failed half-way left no session: start one
        return
    log.error("%s died; tearing its clusters down and starting a new one", host.label)
    on_state(False, "its SparkContext died")
    try:
        back = manager.spark_died(host)
    finally:
        host.start(on_state, stop)  # whatever tearing down did, the server gets a Spark again
    if back and not stop.is_set():
        log.info("starting again on the new SparkContext: %s", ", ".join(back))
        manager.restart(back)


def _freeze_heap() -> None:
    """Move what exists now (Spark's py4j objects, grpc, protobuf modules)
    out of the garbage collector's reach. A full collection otherwise walks
    that whole heap, and under load it runs about once a second: tens of
    milliseconds each, straight into the RPC tail latency."""
    gc.collect()
    gc.freeze()


async def serve(config: ServerConfig, ready: Callable[[str], None] | None = None) -> int:
    """Run the control plane until SIGTERM/SIGINT; returns the exit code."""
    from raydist.engine.spark.session import connect_session, embedded_session

    loop = asyncio.get_running_loop()
    changed = asyncio.Condition()

    def notify(_name: str) -> None:
        async def bump() -> None:
            async with changed:
                changed.notify_all()

        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(bump()))

    config.check_isolation()  # before anything starts
    state_dir = home()
    home_lock = hold_home(state_dir)  # one control plane per home, held until this process ends
    store = Store.open(state_dir / "state.db", events_keep=config.events_keep,
                       events_max_age_s=config.events_max_age_s)
    def spark() -> Any:
        if config.spark_remote:
            return connect_session(config.spark_remote, config.spark_conf)
        return embedded_session(config.spark_master, config.spark_conf)

    manager = ClusterManager(store, spark, notify,
                             head_ports=config.head_ports, head_in_task=config.heads_in_tasks(),
                             link_ports=config.link_port_range(),
                             # A tenant's application is configured where its Connect server runs.
                             tenant_sparks={t.name: functools.partial(connect_session, t.spark_remote)
                                            for t in config.tenants if t.spark_remote})
    metrics = Metrics(manager.states, manager.node_counters)
    # Before Spark starts (see load_or_create_server_token).
    tenants = Tenants(load_or_create_server_token(), config.tenants)
    auth = AuthInterceptor(tenants, lambda method, code: metrics.count(
        method if method in _KNOWN_METHODS else "unknown", code))

    # Spark starts in the background (it takes seconds): reads, deletes and
    # health answer at once; a create waits for it off the event loop. A
    # Spark that does not start is retried with backoff; meanwhile creates
    # answer UNAVAILABLE with the reason and ClusterService's health is
    # NOT_SERVING (the process's own, "", stays SERVING: a restart would
    # not help, and a liveness probe must not kill the clusters).
    health_servicer = health.aio.HealthServicer()
    service_name = pb.DESCRIPTOR.services_by_name["ClusterService"].full_name
    spark_stop = threading.Event()

    def on_spark(running: bool, reason: str) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if running else health_pb2.HealthCheckResponse.NOT_SERVING
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(health_servicer.set(service_name, status)))

    threading.Thread(target=_keep_spark, args=(manager, on_spark, spark_stop), name="raydist-spark",
                     daemon=True).start()
    for tenant, host in manager.tenant_hosts.items():
        # A tenant's Spark that is down is that tenant's creates' UNAVAILABLE
        # (with the reason), not the service's health: the others are served.
        threading.Thread(target=_keep_spark, args=(manager, lambda running, reason: None, spark_stop, host),
                         name=f"raydist-spark-{tenant}", daemon=True).start()
    # Before serving, the store tells the truth (store writes only); the
    # clusters that come back start once the server serves.
    restart = await asyncio.to_thread(manager.reconcile)

    server = grpc.aio.server(interceptors=[auth],
                             options=[("grpc.max_receive_message_length", 1 << 20)])
    service = ClusterService(manager, metrics, changed)
    rpc.add_ClusterServiceServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (pb.DESCRIPTOR.services_by_name["ClusterService"].full_name, health.SERVICE_NAME,
             reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    address = f"{config.host}:{config.port}"
    if config.tls_cert and config.tls_key:
        creds = grpc.ssl_server_credentials(
            [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())],
            root_certificates=Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None,
            require_client_auth=bool(config.tls_client_ca),
        )
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    await server.start()
    _freeze_heap()
    bound = f"{config.host}:{port}"
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set(service_name, health_pb2.HealthCheckResponse.NOT_SERVING if manager.spark_host.error
                              else health_pb2.HealthCheckResponse.SERVING)
    metrics_port = metrics.start(config.metrics_host, config.metrics_port) if config.metrics_port >= 0 else 0
    info = {"address": bound, "pid": os.getpid(), "tls": bool(config.tls_cert), "metrics_port": metrics_port,
            "idle_stop_s": config.idle_stop_s}
    private_file(state_dir / SERVER_FILE, json.dumps(info))
    log.info("raydist control plane serving on %s", bound)
    if restart:
        log.info("starting again after a control-plane restart: %s", ", ".join(restart))
        threading.Thread(target=manager.restart, args=(restart,), name="raydist-restart", daemon=True).start()
    if ready is not None:
        ready(bound)

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def gauges() -> None:
        idle_since = time.monotonic()
        pruned_at = 0.0
        while not stop.is_set():
            metrics.refresh_gauges()
            if time.monotonic() - pruned_at >= PRUNE_EVERY_S:
                pruned_at = time.monotonic()
                try:  # DELETED clusters are kept as long as their events (events_max_age_s)
                    await asyncio.to_thread(manager.prune_deleted, config.events_max_age_s)
                except Exception:  # noqa: BLE001 - pruned on the next round
                    log.exception("pruning deleted clusters")
            if config.idle_stop_s > 0:
                live = sum(n for state, n in manager.states().items() if state not in ("DELETED", "FAILED"))
                if live:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= config.idle_stop_s:
                    log.info("no cluster for %g s: stopping (idle_stop_s)", config.idle_stop_s)
                    stop.set()
            await asyncio.sleep(1.0)

    gauge_task = asyncio.create_task(gauges())
    await stop.wait()
    log.info("shutting down: draining and tearing clusters down")
    spark_stop.set()
    await health_servicer.enter_graceful_shutdown()
    gauge_task.cancel()
    await server.stop(config.grace_s)
    service.close()
    await asyncio.to_thread(manager.shutdown)
    try:
        current = json.loads((state_dir / SERVER_FILE).read_text())
        if current.get("pid") == os.getpid():
            (state_dir / SERVER_FILE).unlink()
    except (OSError, ValueError):
        pass
    os.close(home_lock)
    return 0
