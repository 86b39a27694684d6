"""Ray Jobs on a raydist cluster: submit a script, follow its logs, list, stop.

Ray's Jobs API is served by the head's dashboard, so a cluster made with
``dashboard=True`` (``raydist up NAME --dashboard``) takes jobs. A job's
entrypoint runs as a Ray driver beside the head, inside the cluster: the
submitting machine needs only the dashboard's address and the cluster's token,
which is why this is the way in for a user on another host (Ray's own advice
for remote work, where Ray Client is the older path).

Every request carries the cluster's own Ray token in its ``Authorization``
header, never in this process's environment: one process may talk to the
jobs of clusters with different tokens.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raydist.errors import ClusterNotReadyError, JobNotFoundError

__all__ = ["JobInfo", "RayJobs", "TERMINAL"]

#: Job states after which nothing changes.
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


@dataclass(frozen=True)
class JobInfo:
    """One job as Ray's Jobs API reports it."""

    job_id: str
    status: str
    entrypoint: str
    message: str = ""
    start_time: float = 0.0  # seconds since the epoch; 0 before it starts
    end_time: float = 0.0


class RayJobs:
    """The jobs of one cluster, through its head's dashboard."""

    def __init__(self, cluster: str, dashboard_url: str, ray_token: str) -> None:
        if not dashboard_url:
            raise ClusterNotReadyError(
                f"cluster {cluster!r} runs without the Ray dashboard, which serves Ray Jobs: start it "
                f"(raydist dashboard {cluster}; cluster.dashboard() in Python), or create the cluster with it "
                f"(raydist up {cluster}, without --no-dashboard; raydist.up(..., dashboard=True))"
            )
        self.cluster = cluster
        headers = {"Authorization": f"Bearer {ray_token}"} if ray_token else {}
        self._client = _client_for(dashboard_url, headers)

    def submit(self, entrypoint: str | Sequence[str], *, working_dir: str | None = None,
               pip: Sequence[str] = (), env: Mapping[str, str] | None = None,
               submission_id: str | None = None) -> str:
        """Start ``entrypoint`` (a shell command line, or its words) on the
        cluster; returns the job id. ``working_dir`` is uploaded and becomes
        the job's working directory; ``pip`` packages are installed for it;
        ``env`` is set in its processes."""
        command = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
        runtime_env: dict[str, Any] = {}
        if working_dir:
            runtime_env["working_dir"] = working_dir
        if pip:
            runtime_env["pip"] = list(pip)
        if env:
            runtime_env["env_vars"] = dict(env)
        return str(self._client.submit_job(entrypoint=command, runtime_env=runtime_env or None,
                                           submission_id=submission_id))

    def info(self, job_id: str) -> JobInfo:
        """One job; JobNotFoundError when the cluster has none by that id."""
        try:
            details = self._client.get_job_info(job_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc):
                raise JobNotFoundError(self.cluster, job_id) from None
            raise
        return _info(details)

    def list(self) -> list[JobInfo]:
        """Every job of the cluster, oldest first."""
        return sorted((_info(d) for d in self._client.list_jobs()), key=lambda j: (j.start_time, j.job_id))

    def stop(self, job_id: str) -> bool:
        """Ask the job to stop; False when it had ended already."""
        self.info(job_id)  # a clear error for an unknown id
        return bool(self._client.stop_job(job_id))

    def logs(self, job_id: str) -> str:
        """What the job has printed so far."""
        self.info(job_id)
        return str(self._client.get_job_logs(job_id))

    def follow(self, job_id: str, write: Callable[[str], None],
               on_state: Callable[[str, float], None] | None = None) -> JobInfo:
        """Pass the job's output to ``write`` as it comes, until the job
        ends; returns how it ended. ``on_state`` hears the job's state while
        it runs, first as it is now and then each change with the seconds
        since (a job waiting for resources or its runtime environment prints
        nothing for a while)."""
        import threading
        import time

        first = self.info(job_id)
        ended = threading.Event()

        def watch() -> None:
            assert on_state is not None
            start, said = time.monotonic(), first.status
            on_state(said, 0.0)
            while not ended.wait(1.0):
                try:
                    now = self.info(job_id).status
                except Exception:  # noqa: BLE001 - a missed reading; the output goes on
                    continue
                if now != said and now not in TERMINAL:
                    on_state(now, time.monotonic() - start)
                said = now
                if now in TERMINAL:
                    return

        watcher = threading.Thread(target=watch, daemon=True) if on_state is not None else None
        if watcher is not None:
            watcher.start()

        async def tail() -> None:
            async for chunk in self._client.tail_job_logs(job_id):
                write(chunk)

        try:
            asyncio.run(tail())
        finally:
            ended.set()
        return self.wait(job_id, timeout=30)

    def wait(self, job_id: str, timeout: float) -> JobInfo:
        """Poll until the job ends (or ``timeout`` s pass); returns it as it is then."""
        import time

        deadline = time.monotonic() + timeout
        info = self.info(job_id)
        while info.status not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.5)
            info = self.info(job_id)
        return info


def _client_for(dashboard_url: str, headers: dict[str, str]) -> Any:
    """Ray's Jobs SDK client for exactly this dashboard.

    ``JobSubmissionClient(address)`` prefers ``RAY_API_SERVER_ADDRESS`` and
    ``RAY_ADDRESS`` to the address it is handed, so in a process whose
    default is another cluster it would send this cluster's jobs, and its
    token, there. This client skips that one step: it is the SDK's own
    client, set up by the SDK's base class from the address given, then
    checked as the SDK checks it."""
    import ray
    from ray.dashboard.modules.dashboard_sdk import SubmissionClient
    from ray.job_submission import JobSubmissionClient

    class _ClusterJobsClient(JobSubmissionClient):
        def __init__(self) -> None:  # noqa: D107 - see _client_for
            self._client_ray_version = ray.__version__
            SubmissionClient.__init__(self, address=dashboard_url, headers=headers)
            self._check_connection_and_version(min_version="1.9")

    return _ClusterJobsClient()


def _info(details: Any) -> JobInfo:
    status = getattr(details.status, "value", details.status)
    return JobInfo(
        job_id=str(details.submission_id or details.job_id or ""),
        status=str(status),
        entrypoint=str(details.entrypoint or ""),
        message=str(details.message or ""),
        start_time=(details.start_time or 0) / 1000,
        end_time=(details.end_time or 0) / 1000,
    )
