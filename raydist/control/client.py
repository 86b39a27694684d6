"""``raydist.control.Client``: the typed, synchronous control-plane client.

Every call has a deadline; only ``UNAVAILABLE`` is retried (with backoff), as
the other codes are answers, not transport trouble. Errors arrive as
:class:`raydist.errors.RPCError` carrying the status code's name.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from raydist.backoff import Backoff
from raydist.errors import ControlPlaneUnavailableError, RPCError
from raydist.paths import home, read_private

__all__ = ["Client", "default_address"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0


def default_address() -> str | None:
    """``RAYDIST_ADDRESS``, else the local server recorded in ``RAYDIST_HOME``."""
    given = os.environ.get("RAYDIST_ADDRESS")
    if given:
        return given
    try:
        return str(json.loads((home() / "server.json").read_text())["address"])
    except (OSError, ValueError, KeyError):
        return None


def _default_token(*, from_home: bool = True) -> str | None:
    given = os.environ.get("RAYDIST_TOKEN")
    if given:
        return given
    return read_private(home() / "control_token") if from_home else None


def _on_this_host(address: str) -> bool:
    """Whether ``address`` (``host:port``, ``unix:path``) stays on this
    machine: a Unix socket, or a host whose every address is loopback."""
    import ipaddress
    import socket

    if address.startswith("unix:"):
        return True
    host = address.rpartition(":")[0].strip("[]") or address
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


class Client:
    """A connection to one control plane.

    Args:
        address: ``host:port``; default ``RAYDIST_ADDRESS`` or the local server.
        token: bearer token; default ``RAYDIST_TOKEN`` or ``RAYDIST_HOME``'s.
        tls_ca: CA certificate (PEM path) to verify a TLS server; enables TLS.
        tls_cert / tls_key: client certificate for mTLS.
        timeout: default deadline per call, in seconds.
        retries / retry_s: an UNAVAILABLE answer (the server restarts, the
            network blips) is retried at least ``retries`` times and for up
            to ``retry_s`` seconds; nothing else is retried.
    """

    def __init__(self, address: str | None = None, *, token: str | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, retries: int = 3, retry_s: float = 10.0) -> None:
        from raydist._proto import pb, rpc

        address = address or default_address()
        if not address:
            raise ControlPlaneUnavailableError(
                "no control plane address: set RAYDIST_ADDRESS or start one with `raydist serve`"
            )
        self.address = address
        self._pb = pb
        self.timeout = timeout
        self.retries = retries
        self.retry_s = retry_s
        # TLS settings default to RAYDIST_TLS_CA / _CERT / _KEY, so the CLI and
        # raydist.up(address=...) reach a TLS control plane with no code change.
        tls_ca = tls_ca or os.environ.get("RAYDIST_TLS_CA") or None
        tls_cert = tls_cert or os.environ.get("RAYDIST_TLS_CERT") or None
        tls_key = tls_key or os.environ.get("RAYDIST_TLS_KEY") or None
        # A client certificate can be the caller's identity (a tenant's):
        # then only a token given on purpose goes with it, not the home's.
        self._token = token if token is not None else _default_token(from_home=not tls_cert)
        if tls_ca:
            creds = grpc.ssl_channel_credentials(
                root_certificates=Path(tls_ca).read_bytes(),
                private_key=Path(tls_key).read_bytes() if tls_key else None,
                certificate_chain=Path(tls_cert).read_bytes() if tls_cert else None,
            )
            self._channel = grpc.secure_channel(address, creds)
        else:
            if self._token and not _on_this_host(address):
                log.warning("the control token goes in clear to %s: set RAYDIST_TLS_CA (and serve with TLS) "
                            "to reach a control plane on another host", address)
            self._channel = grpc.insecure_channel(address)
        self._stub = rpc.ClusterServiceStub(self._channel)

    def _metadata(self, extra: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
        md = [("authorization", f"Bearer {self._token}")] if self._token else []
        return md + list(extra or [])

    def _call(self, method: str, request: Any, timeout: float | None, metadata: list[tuple[str, str]] | None) -> Any:
        """One RPC. UNAVAILABLE (a restarting server, a blip) is retried with
        backoff (0.2 s doubling to 2 s) for up to ``retry_s`` seconds, at
        least ``retries`` times; every other error is raised at once."""
        fn = getattr(self._stub, method)
        delays = Backoff(0.2, 2.0)
        give_up = time.monotonic() + self.retry_s
        attempt = 0
        while True:
            try:
                return fn(request, timeout=timeout or self.timeout, metadata=self._metadata(metadata))
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNAVAILABLE and (attempt < self.retries or time.monotonic() < give_up):
                    attempt += 1
                    time.sleep(delays.next())
                    continue
                raise self._error(exc) from None

    def _error(self, exc: grpc.RpcError) -> Exception:
        """The raydist exception for a failed call (after any retries)."""
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return ControlPlaneUnavailableError(f"the control plane at {self.address} is unavailable: {exc.details()}")
        return RPCError(exc.code().name, exc.details() or "")

    # the API -------------------------------------------------------------------

    def create(self, spec: Any, request_id: str = "", *, restart_on_server_restart: bool = False,
               validate_only: bool = False, timeout: float | None = None,
               metadata: list[tuple[str, str]] | None = None) -> Any:
        """Create a cluster from a ``ClusterSpec`` (or its proto); returns at once in CREATING.
        ``validate_only``: the server checks the request and creates nothing."""
        from raydist.spec import ClusterSpec, spec_to_proto

        msg = spec_to_proto(spec) if isinstance(spec, ClusterSpec) else spec
        msg.restart_on_server_restart = restart_on_server_restart
        request = self._pb.CreateClusterRequest(spec=msg, request_id=request_id, validate_only=validate_only)
        # The first create on a fresh server waits for its Spark to start.
        return self._call("CreateCluster", request, timeout or max(self.timeout, 180.0), metadata)

    def get(self, name: str, *, timeout: float | None = None, metadata: list[tuple[str, str]] | None = None) -> Any:
        return self._call("GetCluster", self._pb.GetClusterRequest(name=name), timeout, metadata)

    def list(self, *, page_size: int = 0, timeout: float | None = None,
             metadata: list[tuple[str, str]] | None = None) -> list[Any]:
        """Every cluster, following pages."""
        out, token = [], ""
        while True:
            resp = self._call("ListClusters", self._pb.ListClustersRequest(page_size=page_size, page_token=token),
                              timeout, metadata)
            out.extend(resp.clusters)
            token = resp.next_page_token
            if not token:
                return out

    def delete(self, name: str, *, allow_missing: bool = False, timeout: float | None = None,
               metadata: list[tuple[str, str]] | None = None) -> Any:
        return self._call("DeleteCluster", self._pb.DeleteClusterRequest(name=name, allow_missing=allow_missing),
                          timeout or max(self.timeout, 120.0), metadata)

    def update(self, name: str, *, workers: int | None = None, min_workers: int | None = None,
               max_workers: int | None = None, idle_timeout_s: float | None = None,
               timeout: float | None = None) -> Any:
        """Resize a running cluster (UpdateCluster with a field mask of the
        arguments given); returns the cluster."""
        spec = self._pb.ClusterSpec(name=name)
        paths = []
        for field, value in (("workers", workers), ("min_workers", min_workers), ("max_workers", max_workers),
                             ("idle_timeout_s", idle_timeout_s)):
            if value is not None:
                setattr(spec, field, value)
                paths.append(field)
        request = self._pb.UpdateClusterRequest(spec=spec, update_mask={"paths": paths})
        return self._call("UpdateCluster", request, timeout or max(self.timeout, 60.0), None)

    def credentials(self, name: str, *, timeout: float | None = None) -> Any:
        """Cluster ``name``'s addresses and Ray token (``ClusterCredentials``);
        the server records the call as an event."""
        return self._call("GetClusterCredentials", self._pb.GetClusterCredentialsRequest(name=name), timeout, None)

    def node_logs(self, name: str, node: str, *, file: str = "", offset: int = 0, max_bytes: int = 0,
                  run: str = "", grep: str = "", timeout: float | None = None) -> Any:
        """One node's Ray log files (``NodeLogs``), read now by its supervisor:
        ``node`` is its index in ``Cluster.nodes``, its key or a Ray node id
        prefix; ``file`` one file; ``offset`` from that byte on (0: the tail).
        ``run``: what a teardown kept instead ("last" or a kept run's name;
        ``node`` may be empty then: every node's). ``grep``: only the lines
        containing that text."""
        request = self._pb.GetNodeLogsRequest(name=name, node=node, file=file, offset=offset, max_bytes=max_bytes,
                                              run=run, grep=grep)
        return self._call("GetNodeLogs", request, timeout, None)

    def set_dashboard(self, name: str, *, stop: bool = False, timeout: float | None = None) -> Any:
        """Start Ray's dashboard on cluster ``name`` when it has none (or,
        ``stop``, stop one started so); ``Dashboard`` with its URL once it
        serves (the first start takes seconds)."""
        request = self._pb.SetDashboardRequest(name=name, stop=stop)
        return self._call("SetDashboard", request, timeout or max(self.timeout, 120.0), None)

    def forward_dashboard(self, sent: Iterator[Any]) -> Iterator[Any]:
        """One TCP connection to a cluster's dashboard through the server:
        ``sent`` yields ``DashboardBytes`` (the first names the cluster), the
        answer's messages carry what the dashboard says. No deadline: it
        lasts as long as the connection."""
        try:
            yield from self._stub.ForwardDashboard(sent, metadata=self._metadata())
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise self._error(exc) from None

    def server_info(self, *, timeout: float | None = None) -> Any:
        return self._call("GetServerInfo", self._pb.GetServerInfoRequest(), timeout, None)

    def watch(self, name: str, *, timeout: float | None = None, history: bool = False) -> Iterator[Any]:
        """Events of one cluster: its current state first (``history``: every
        recorded event), then each change until DELETED or FAILED (or the
        deadline). A stream refused with UNAVAILABLE before its first event is
        opened again, as :meth:`_call` retries."""
        request = self._pb.WatchClusterRequest(name=name, history=history)
        give_up = time.monotonic() + self.retry_s
        delay = 0.2
        while True:
            started = False
            try:
                for event in self._stub.WatchCluster(request, timeout=timeout or 600.0, metadata=self._metadata()):
                    started = True
                    yield event
                return
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return
                if code == grpc.StatusCode.UNAVAILABLE and not started and time.monotonic() < give_up:
                    time.sleep(delay)
                    delay = min(2.0, delay * 2)
                    continue
                raise self._error(exc) from None

    def wait(self, name: str, *, timeout: float = 600.0) -> Any:
        """Block until the cluster is RUNNING, DEGRADED or terminal; returns it.
        A watch the server drops (it restarts) is opened again, up to the
        timeout."""
        pb = self._pb
        deadline = time.monotonic() + timeout
        while True:
            try:
                for event in self.watch(name, timeout=max(1.0, deadline - time.monotonic())):
                    if event.state in (pb.RUNNING, pb.DEGRADED, pb.FAILED, pb.DELETED):
                        return event.cluster
            except ControlPlaneUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
                continue
            if time.monotonic() >= deadline:
                return self.get(name)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
