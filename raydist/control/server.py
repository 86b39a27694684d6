"""``raydist serve``: the gRPC control plane (grpc.aio).

One SparkSession for the server's Spark target; many named clusters on it.
Bearer-token auth on every RPC but health checks; TLS (and mTLS) when given
certificates; standard health and reflection services; Prometheus metrics;
graceful shutdown on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextvars
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from raydist import __version__
from raydist._proto import pb, rpc
from raydist.control import forward
from raydist.control.auth import AuthInterceptor
from raydist.control.config import ServerConfig
from raydist.control.manager import ClusterManager
from raydist.control.metrics import Metrics
from raydist.control.protos import ts as _ts
from raydist.control.sparkhost import SparkHost
from raydist.control.status import code_for
from raydist.control.store import Store
from raydist.control.tenants import Caller, Tenants, current_caller
from raydist.errors import QuotaExceededError, RaydistError
from raydist.paths import hold_home, home, private_file, read_private
from raydist.spec import spec_from_proto

__all__ = ["ServerConfig", "serve", "load_or_create_server_token", "SERVER_FILE"]

log = logging.getLogger(__name__)

SERVER_FILE = "server.json"
_TOKEN_FILE = "control_token"
_TERMINAL = (pb.DELETED, pb.FAILED)


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


class ClusterService(rpc.ClusterServiceServicer):
    """The API. Each RPC acts as its caller (:mod:`raydist.control.tenants`):
    names in requests are the caller's, turned into the engine's full names
    here, and every answer names clusters as the caller does."""

    def __init__(self, manager: ClusterManager, metrics: Metrics, changed: asyncio.Condition) -> None:
        self.m = manager
        self.metrics = metrics
        self.changed = changed
        # Nothing that may block runs on the event loop (health checks and
        # reads answer from it), and each kind of blocking work has a bounded
        # pool of its own: slow calls (a create waits for Spark, a delete for
        # a teardown, logs for a node) cannot starve the quick writes, nor
        # either of them the Watch streams' reads.
        self.slow = ThreadPoolExecutor(16, thread_name_prefix="raydist-rpc-slow")
        self.quick = ThreadPoolExecutor(8, thread_name_prefix="raydist-rpc")
        self.watch = ThreadPoolExecutor(8, thread_name_prefix="raydist-watch")
        # Each tenant's slow calls and Watch streams in flight (its quota
        # bounds them); read and written on the event loop only.
        self._in_flight: dict[str, int] = {}
        self._watching: dict[str, int] = {}

    def close(self) -> None:
        for pool in (self.slow, self.quick, self.watch):
            pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    async def _off_loop(pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Any:
        """``fn`` on ``pool``, in this call's context (its caller)."""
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(pool, ctx.run, fn)

    async def _call(self, name: str, context: grpc.aio.ServicerContext, fn: Callable[[], Any],
                    blocking: bool = False, cluster: str = "", slow: bool = False) -> Any:
        """Run ``fn`` as the RPC ``name``: on the event loop (it only reads
        memory), or ``blocking`` (it writes the store) on the quick pool, or
        ``slow`` (it waits on Spark or nodes) on the slow one. ``cluster``:
        the cluster the request names, as its caller names it (for the
        error's message)."""
        start = time.perf_counter()
        code = "OK"
        held = None
        try:
            if slow:
                held = self._take_slow_place(current_caller())
            if slow or blocking:
                return await self._off_loop(self.slow if slow else self.quick, fn)
            return fn()
        except RaydistError as exc:
            code = code_for(exc).name
            await context.abort(code_for(exc), self._said(exc, cluster))
        except Exception:
            code = "INTERNAL"
            log.exception("%s failed", name)
            await context.abort(grpc.StatusCode.INTERNAL, f"{name} failed inside the server; see its log")
        finally:
            if held is not None:
                self._in_flight[held] -= 1
            self.metrics.count(name, code)
            self.metrics.observe(name, time.perf_counter() - start)

    def _take_slow_place(self, caller: Caller) -> str | None:
        """One of ``caller``'s slow-call places (QuotaExceededError when all
        are taken); the tenant's name to give it back under, None for an admin.
        On the event loop only: no lock needed."""
        if caller.quota is None:
            return None
        if self._in_flight.get(caller.name, 0) >= caller.quota.max_slow_calls:
            raise QuotaExceededError(caller.name, "max_slow_calls", caller.quota.max_slow_calls,
                                     f"{caller.quota.max_slow_calls} of its calls that wait on Spark or nodes "
                                     "are running")
        self._in_flight[caller.name] = self._in_flight.get(caller.name, 0) + 1
        return caller.name

    @staticmethod
    def _said(exc: RaydistError, cluster: str) -> str:
        """``exc``'s message naming ``cluster`` as the current caller does
        (the engine's messages use its full name)."""
        caller = current_caller()
        if not cluster or caller.admin:
            return str(exc)
        try:
            full = caller.scoped(cluster)
        except RaydistError:
            return str(exc)  # a name it could not have: no full name to hide
        return str(exc).replace(full, cluster)

    @staticmethod
    def _as_seen(caller: Caller, cluster: Any) -> Any:
        """``cluster`` as ``caller`` names it."""
        if caller.admin:
            return cluster
        seen = pb.Cluster()
        seen.CopyFrom(cluster)
        seen.spec.name = caller.shown(cluster.spec.name)
        return seen

    async def CreateCluster(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def create() -> Any:
            spec_from_proto(request.spec)  # the spec's own checks first, in their order
            spec = pb.ClusterSpec()
            spec.CopyFrom(request.spec)
            spec.name = caller.scoped(request.spec.name)
            return self._as_seen(caller, self.m.create(spec, request.request_id, validate_only=request.validate_only,
                                                       who=caller.describe(), quota=caller.quota))

        return await self._call("CreateCluster", context, create, slow=True, cluster=request.spec.name)

    async def GetCluster(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()
        return await self._call("GetCluster", context,
                                lambda: self._as_seen(caller, self.m.get(caller.scoped(request.name))),
                                cluster=request.name)

    async def ListClusters(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def run() -> Any:
            clusters, token = self.m.list(request.page_size, request.page_token, visible=caller.sees,
                                          full_name=lambda name: caller.scoped(name, "page_token"))
            return pb.ListClustersResponse(clusters=[self._as_seen(caller, c) for c in clusters],
                                           next_page_token=caller.shown(token) if token else "")

        return await self._call("ListClusters", context, run)

    async def DeleteCluster(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()
        return await self._call("DeleteCluster", context, lambda: self._as_seen(caller, self.m.delete(
            caller.scoped(request.name), request.allow_missing, who=caller.describe())), slow=True,
            cluster=request.name)

    async def UpdateCluster(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def update() -> Any:
            spec = pb.ClusterSpec()
            spec.CopyFrom(request.spec)
            spec.name = caller.scoped(request.spec.name, "spec.name")
            return self._as_seen(caller, self.m.update(spec, list(request.update_mask.paths), who=caller.describe(),
                                                       quota=caller.quota))

        return await self._call("UpdateCluster", context, update, slow=True, cluster=request.spec.name)

    async def GetClusterCredentials(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def credentials() -> Any:
            # The peer first: a line cut at a terminal's width keeps where the call came from.
            found = self.m.credentials(caller.scoped(request.name), f"{context.peer()} ({caller.describe()})")
            found.name = caller.shown(found.name)
            return found

        # It writes an event (who asked): never on the event loop.
        return await self._call("GetClusterCredentials", context, credentials, blocking=True, cluster=request.name)

    async def GetNodeLogs(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def logs() -> Any:
            asked = pb.GetNodeLogsRequest()
            asked.CopyFrom(request)
            asked.name = caller.scoped(request.name)
            found = self.m.node_logs(asked)
            found.name = caller.shown(found.name)
            return found

        return await self._call("GetNodeLogs", context, logs, slow=True, cluster=request.name)

    async def SetDashboard(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def dashboard() -> Any:
            found = self.m.dashboard(caller.scoped(request.name), request.stop)
            found.name = caller.shown(found.name)
            return found

        return await self._call("SetDashboard", context, dashboard, slow=True, cluster=request.name)

    async def ForwardDashboard(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        """A stream held open as long as a browser's connection: counted
        against the caller's Watch streams (``max_watches``)."""
        caller = current_caller()
        first = pb.DashboardBytes()
        try:
            quota = caller.quota
            if quota is not None and self._watching.get(caller.name, 0) >= quota.max_watches:
                raise QuotaExceededError(caller.name, "max_watches", quota.max_watches,
                                         f"{quota.max_watches} of its streams are open")
            first = await anext(aiter(request_iterator), first)  # a caller that sent nothing names no cluster
            full = caller.scoped(first.name)
            host, port = await self._off_loop(self.quick, lambda: self.m.dashboard_address(full))
            reader, writer = await asyncio.open_connection(host, port)
        except RaydistError as exc:
            self.metrics.count("ForwardDashboard", code_for(exc).name)
            await context.abort(code_for(exc), self._said(exc, first.name))
            return
        except OSError as exc:
            self.metrics.count("ForwardDashboard", "UNAVAILABLE")
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cluster {first.name!r}: its dashboard did not "
                                                             f"answer the control plane ({exc.strerror or exc})")
            return
        self.metrics.count("ForwardDashboard", "OK")
        self._watching[caller.name] = self._watching.get(caller.name, 0) + 1
        try:
            async for data in forward.carry(first.data, request_iterator, reader, writer):
                yield pb.DashboardBytes(data=data)
        finally:
            self._watching[caller.name] -= 1

    async def GetServerInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def info() -> Any:
            # A tenant with a Spark application of its own is told about that one.
            master, ui = self.m.tenant_hosts.get(caller.name, self.m.spark_host).info()
            return pb.ServerInfo(version=__version__, spark_master=master, spark_ui_url=ui,
                                 clusters=self.m.count(visible=caller.sees))

        return await self._call("GetServerInfo", context, info)

    async def WatchCluster(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()
        try:
            quota = caller.quota
            if quota is not None and self._watching.get(caller.name, 0) >= quota.max_watches:
                raise QuotaExceededError(caller.name, "max_watches", quota.max_watches,
                                         f"{quota.max_watches} of its Watch streams are open")
            full = caller.scoped(request.name)
            current = self._as_seen(caller, self.m.get(full))
        except RaydistError as exc:
            self.metrics.count("WatchCluster", code_for(exc).name)
            await context.abort(code_for(exc), self._said(exc, request.name))
            return
        self.metrics.count("WatchCluster", "OK")
        self._watching[caller.name] = self._watching.get(caller.name, 0) + 1
        try:
            async for event in self._watch(request, caller, full, current):
                yield event
        finally:
            self._watching[caller.name] -= 1

    async def _watch(self, request: Any, caller: Caller, full: str, current: Any) -> Any:
        """WatchCluster's events, once the stream is admitted."""
        if request.history:
            events = await self._off_loop(self.watch, lambda: self.m.events_after(full, 0))
            last = events[-1][0] if events else 0
        else:
            events, last = [], await self._off_loop(self.watch, lambda: self.m.last_event_id(full))
        if request.history and events:
            for _, when, state, message in events:
                yield pb.ClusterEvent(name=request.name, state=pb.State.Value(state), message=message,
                                      time=_ts(when), cluster=current)
        else:
            yield pb.ClusterEvent(name=request.name, state=current.state, message=current.message,
                                  time=current.update_time, cluster=current)
        if current.state in _TERMINAL:
            return
        while True:
            async with self.changed:
                try:
                    await asyncio.wait_for(self.changed.wait(), timeout=1.0)
                except TimeoutError:
                    pass
            new = await self._off_loop(self.watch, functools.partial(self.m.events_after, full, last))
            if not new:
                continue
            cluster = self._as_seen(caller, self.m.get(full))
            for event_id, when, state, message in new:
                last = event_id
                yield pb.ClusterEvent(name=request.name, state=pb.State.Value(state), message=message,
                                      time=_ts(when), cluster=cluster)
                if pb.State.Value(state) in _TERMINAL:
                    return


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
