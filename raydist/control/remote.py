"""A cluster handle for clusters that live in a control plane.

``raydist.up(..., address="host:port")`` returns one, so notebook code reads
the same whether the engine runs in the notebook or behind ``raydist serve``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from raydist.control.client import Client
from raydist.control.forward import DashboardForward, reachable
from raydist.engine.auth import RayToken
from raydist.engine.connection import process_ray
from raydist.errors import ClusterFailedError
from raydist.ray_jobs import RayJobs
from raydist.spec import ClusterSpec, ClusterStatus, NodeStatus, State

__all__ = ["RemoteCluster"]


class RemoteCluster:
    """A control-plane cluster: ``address``, ``client_address``,
    ``dashboard_url``, ``status()``, ``down()``; a context manager."""

    def __init__(self, client: Client, spec: ClusterSpec) -> None:
        self._client = client
        self.spec = spec
        self.address = ""
        self.client_address = ""
        self.dashboard_url = ""
        self._forward: DashboardForward | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self, timeout: float) -> RemoteCluster:
        self._client.create(self.spec)
        cluster = self._client.wait(self.name, timeout=timeout)
        self._update(cluster)
        if cluster.state not in (2, 3):  # RUNNING, DEGRADED
            raise ClusterFailedError(f"cluster {self.name!r} is {State(self._state_name(cluster)).value}: "
                                     f"{cluster.message}")
        return self

    def status(self) -> ClusterStatus:
        cluster = self._client.get(self.name)
        self._update(cluster)
        return ClusterStatus(
            name=self.name, state=State(self._state_name(cluster)), ready_workers=cluster.ready_workers,
            desired_workers=cluster.desired_workers, message=cluster.message, address=cluster.address,
            client_address=cluster.client_address, dashboard_url=cluster.dashboard_url,
            created_at=cluster.create_time.ToNanoseconds() / 1e9, updated_at=cluster.update_time.ToNanoseconds() / 1e9,
            idle_workers=cluster.idle_workers,
            nodes=tuple(NodeStatus(key=n.key, up=n.state == 2, host=n.host, node_ip=n.node_ip, cpus=n.cpus,  # UP
                                   gpus=n.gpus, restarts=n.restarts, message=n.message, idle_s=n.idle_seconds,
                                   ray_node_id=n.ray_node_id) for n in cluster.nodes),
        )

    def resize(self, workers: int | None = None, *, min_workers: int | None = None,
               max_workers: int | None = None, idle_timeout_s: float | None = None) -> None:
        """Change the cluster's size while it runs (see ``RayCluster.resize``)."""
        self._update(self._client.update(self.name, workers=workers, min_workers=min_workers,
                                         max_workers=max_workers, idle_timeout_s=idle_timeout_s))

    def node_logs(self, node: str, *, name: str = "", offset: int = 0,
                  max_bytes: int = 0) -> tuple[str, list[tuple[str, int, bytes]]]:
        """One node's Ray log files, read now by its supervisor (as
        ``RayCluster.node_logs``): (its key, [(file, size, bytes)])."""
        logs = self._client.node_logs(self.name, node, file=name, offset=offset, max_bytes=max_bytes)
        return logs.node, [(f.name, f.size, f.data) for f in logs.files]

    def logs(self, run: str = "last", *, node: str = "", grep: str = "") -> list[tuple[str, bytes]]:
        """What a teardown of this cluster kept of its nodes' logs, on the
        control plane's host (as ``RayCluster.logs``): [(NODE/FILE, bytes)],
        newest first; ``grep``: only the lines containing that text."""
        got = self._client.node_logs(self.name, node, run=run, grep=grep)
        return [(f.name, f.data) for f in got.files]

    def dashboard(self, *, stop: bool = False, forward: bool | None = None) -> str:
        """Ray's dashboard for this cluster, started now when it has none
        (as ``RayCluster.dashboard``): its URL. When the head cannot be
        reached from here (or ``forward=True``), the URL is a local port this
        process forwards to it through the control plane, until ``down()``
        or ``dashboard(stop=True)``."""
        found = self._client.set_dashboard(self.name, stop=stop)
        self.dashboard_url = found.url
        if stop and self._forward is not None:
            self._forward.close()
            self._forward = None
        if stop or not (forward if forward is not None else not reachable(found.url)):
            return found.url
        if self._forward is None:
            self._forward = DashboardForward(self._client, self.name)
        return self._forward.url

    def ray_jobs(self) -> RayJobs:
        """This cluster's Ray jobs (it needs ``dashboard=True``); the control
        plane records the credentials it hands out for them."""
        creds = self._client.credentials(self.name)
        return RayJobs(self.name, creds.dashboard_url, creds.ray_token)

    def jobs(self) -> RayJobs:
        """Deprecated name of :meth:`ray_jobs` ("jobs" alone also meant Spark's)."""
        warnings.warn("cluster.jobs() is now cluster.ray_jobs()", DeprecationWarning, stacklevel=2)
        return self.ray_jobs()

    def submit(self, entrypoint: str | Sequence[str], **options: Any) -> str:
        """Submit a Ray job (``RayJobs.submit``: working_dir, pip, env); returns its id."""
        return self.ray_jobs().submit(entrypoint, **options)

    def env(self, *, client: bool = True) -> dict[str, str]:
        """Environment for a process that should use this cluster:
        ``RAY_ADDRESS`` (the ``ray://`` address, or the GCS address with
        ``client=False``) and the cluster's own Ray token. The control plane
        records each call."""
        creds = self._client.credentials(self.name)
        address = creds.client_address if client else creds.address
        return {"RAY_ADDRESS": address, **RayToken(creds.ray_token).env()}

    def connect(self, **init_kwargs: Any) -> Any:
        """``ray.init`` against this cluster over Ray Client, with its token;
        works from any host that reaches the control plane and the head's
        client port. The token is this connection's alone: nothing of it
        stays in this process's environment."""
        creds = self._client.credentials(self.name)
        self.address = creds.address
        return process_ray().connect(creds.address, RayToken(creds.ray_token), target=creds.client_address,
                                     **init_kwargs)

    def down(self) -> None:
        """Delete the cluster; this process disconnects from it first."""
        if not self.address:  # a handle from attach(): which GCS a connection here would reach
            from raydist.errors import RPCError

            try:
                self._update(self._client.get(self.name))
            except RPCError as exc:
                if exc.code != "NOT_FOUND":
                    raise
        process_ray().cluster_gone(self, self.address)
        if self._forward is not None:
            self._forward.close()
            self._forward = None
        self._client.delete(self.name, allow_missing=True)

    def __enter__(self) -> RemoteCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"<RemoteCluster {self.name!r} at {self._client.address}>"

    def _update(self, cluster: Any) -> None:
        self.address, self.client_address, self.dashboard_url = (
            cluster.address, cluster.client_address, cluster.dashboard_url)

    @staticmethod
    def _state_name(cluster: Any) -> str:
        from raydist._proto import pb

        return str(pb.State.Name(cluster.state))
