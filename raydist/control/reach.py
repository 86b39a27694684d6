"""Reaching a running cluster through the control plane: its credentials,
its dashboard (started on demand, forwarded), its nodes' logs, live or kept.

A part of :class:`~raydist.control.manager.ClusterManager` (it inherits this):
the calls that read a running cluster rather than change it."""

from __future__ import annotations

from typing import Any

from raydist.control import forward
from raydist.engine import nodelogs
from raydist.engine.cluster import RayCluster
from raydist.errors import (
    ClusterNotFoundError,
    ClusterNotReadyError,
    SpecError,
)
from raydist.paths import logs_dir
from raydist.spec import State, check_name

__all__ = ["ClusterReach"]

#: GetNodeLogs' default and largest answer (bytes of log text).
_LOG_BYTES_DEFAULT = 256 << 10
_LOG_BYTES_MAX = 1 << 20


class ClusterReach:
    """The manager's reads of a running cluster: credentials, dashboard, node logs."""

    def credentials(self, name: str, who: str) -> Any:
        """How to reach cluster ``name`` (its Ray token included); records
        that ``who`` asked, as an event, never the token."""
        engine = self._running(name, "credentials")
        if not engine.address:  # a head that is not up yet
            raise ClusterNotReadyError(f"cluster {name!r} has no address yet: wait for it (`raydist status {name}`)")
        self._store.add_event(name, engine.state.value, f"credentials given to {who or 'a caller'}")
        self._on_change(name)
        return self._pb.ClusterCredentials(
            name=name, address=engine.address, client_address=engine.client_address,
            dashboard_url=engine.dashboard_url, ray_token=engine.token.reveal())

    def _running(self, name: str, what: str) -> RayCluster:
        """Cluster ``name``'s engine while RUNNING or DEGRADED; else
        ClusterNotFoundError, or ClusterNotReadyError naming ``what`` it has
        only then."""
        check_name(name, full=True)
        with self._lock:
            row = self._store.get(name)
            if row is None:
                raise ClusterNotFoundError(name)
            engine = self._engines.get(name)
            state = State(row.state)
        if engine is None or state not in (State.RUNNING, State.DEGRADED):
            raise ClusterNotReadyError(f"cluster {name!r} is {state.value}: it has {what} only while RUNNING or "
                                       f"DEGRADED; wait for it (`raydist status {name}`) or create it again")
        return engine

    def dashboard(self, name: str, stop: bool) -> Any:
        """SetDashboard: Ray's dashboard on ``name``'s head, started now when
        it has none (blocks while it starts: run it off the event loop)."""
        url = self._running(name, "a dashboard").dashboard(stop=stop)
        return self._pb.Dashboard(name=name, url=url)

    def dashboard_address(self, name: str) -> tuple[str, int]:
        """Where ``name``'s dashboard listens (for ForwardDashboard);
        ClusterNotReadyError when it runs none."""
        url = self._running(name, "a dashboard").dashboard_url
        if not url:
            raise ClusterNotReadyError(f"cluster {name!r} runs no Ray dashboard now: start it first "
                                       f"(raydist dashboard NAME)")
        return forward.host_port(url)

    def node_logs(self, request: Any) -> Any:
        """GetNodeLogs: one node's log files, read now by its supervisor
        (blocks up to 10 s: run it off the event loop); or, with ``run``,
        what a teardown of the cluster kept, from this server's disk."""
        name = check_name(request.name, full=True)
        if request.offset < 0 or not 0 <= request.max_bytes <= _LOG_BYTES_MAX:
            field = "offset" if request.offset < 0 else "max_bytes"
            raise SpecError(field, getattr(request, field), f"expected offset >= 0 and 0 <= max_bytes <= "
                                                             f"{_LOG_BYTES_MAX} (0: {_LOG_BYTES_DEFAULT})")
        nodelogs.check_grep(request.grep)
        if request.run:
            return self._kept_logs(name, request)
        if not request.node or len(request.node) > 64:
            raise SpecError("node", request.node[:70], "give the node's index as `raydist status NAME` lists it, "
                                                       "its key (head, w0...) or a prefix of its Ray node id")
        with self._lock:
            if self._store.get(name) is None:
                raise ClusterNotFoundError(name)
            engine = self._engines.get(name)
        if engine is None:
            raise ClusterNotReadyError(f"cluster {name!r} runs no nodes now; what its last teardown kept of "
                                       "its nodes' logs: raydist logs NAME --run last")
        try:
            key, files = engine.node_logs(request.node, name=request.file, offset=request.offset,
                                          max_bytes=request.max_bytes or _LOG_BYTES_DEFAULT)
        except TimeoutError as exc:
            raise ClusterNotReadyError(f"cluster {name!r}: {exc}") from None
        pb = self._pb
        # offset: where the bytes read start in the file (what a follower counts on), lines kept or not.
        read = [(f, size, request.offset if request.offset else size - len(data), nodelogs.grep_lines(
            data, request.grep)) for f, size, data in files]
        return pb.NodeLogs(name=name, node=key, files=[
            pb.LogFile(name=f, size=size, offset=offset, data=data) for f, size, offset, data in read
            if data or not request.grep])

    def _kept_logs(self, name: str, request: Any) -> Any:
        """GetNodeLogs with ``run``: the files a teardown of ``name`` kept
        (``RAYDIST_HOME/logs``), found whether or not the cluster still runs
        or is still listed: the logs outlive it. Each file is named NODE/FILE."""
        if request.offset:
            raise SpecError("offset", request.offset, "0 with run: a kept file is read whole, newest first")
        if len(request.run) > 32:
            raise SpecError("run", request.run[:40], "'last' or a kept run's name (YYYYmmdd-HHMMSS)")
        if len(request.node) > 64:
            raise SpecError("node", request.node[:70], "a node's key (head, w0...)")
        if not nodelogs.kept_runs(logs_dir(), name):
            with self._lock:
                if self._store.get(name) is None:  # neither listed nor ever kept: no such cluster
                    raise ClusterNotFoundError(name)
        _run, files = nodelogs.read_kept(logs_dir(), name, run=request.run, node=request.node, grep=request.grep,
                                         max_bytes=request.max_bytes or _LOG_BYTES_DEFAULT)
        pb = self._pb
        return pb.NodeLogs(name=name, node=request.node, files=[
            pb.LogFile(name=f"{node}/{file}", size=size, offset=max(0, size - len(data)), data=data)
            for node, file, size, data in files])

