"""The control plane's gRPC service: every RPC of ``raydist.v1.ClusterService``.

Each call runs as its caller (:mod:`raydist.control.tenants`), off the event
loop where it may block (a pool per kind of call, a tenant's slow calls
capped), and answers errors through :func:`raydist.control.status.code_for`,
the one map from raydist's exceptions to gRPC status codes. What it serves
from is :class:`~raydist.control.manager.ClusterManager`;
:mod:`raydist.control.server` wires it into a running server.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from raydist import __version__
from raydist._proto import pb, rpc
from raydist.control import forward
from raydist.control.manager import ClusterManager
from raydist.control.metrics import Metrics
from raydist.control.protos import ts as _ts
from raydist.control.status import code_for
from raydist.control.tenants import Caller, current_caller
from raydist.errors import QuotaExceededError, RaydistError
from raydist.spec import spec_from_proto

__all__ = ["ClusterService"]

log = logging.getLogger("raydist.control.server")

_TERMINAL = (pb.DELETED, pb.FAILED)


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
    def _named(caller: Caller, found: Any) -> Any:
        """An answer that names a cluster, naming it as ``caller`` sees it (without its tenant)."""
        found.name = caller.shown(found.name)
        return found

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
            return self._named(caller, self.m.credentials(caller.scoped(request.name),
                                                          f"{context.peer()} ({caller.describe()})"))

        # It writes an event (who asked): never on the event loop.
        return await self._call("GetClusterCredentials", context, credentials, blocking=True, cluster=request.name)

    async def GetNodeLogs(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def logs() -> Any:
            asked = pb.GetNodeLogsRequest()
            asked.CopyFrom(request)
            asked.name = caller.scoped(request.name)
            return self._named(caller, self.m.node_logs(asked))

        return await self._call("GetNodeLogs", context, logs, slow=True, cluster=request.name)

    async def SetDashboard(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        caller = current_caller()

        def dashboard() -> Any:
            return self._named(caller, self.m.dashboard(caller.scoped(request.name), request.stop))

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
