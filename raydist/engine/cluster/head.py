"""A cluster's head node: where it runs, whether it is up, how it ended.

The head runs either on the driver (a notebook's ``raydist.up``: the driver
is the user's own process) or in a Spark task of its own (the control plane:
tenant code must not run in the process tree that holds the control plane's
secrets). Either way one supervisor owns its processes; this object is what
the cluster knows of it. The cluster's lock guards its fields.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from raydist.engine.cluster.slot import first_error_line
from raydist.engine.link.nodelink import NodeLink
from raydist.engine.node.launch import HEAD_KEY, NodePlan, run_head_node, start_head
from raydist.engine.spark.sides import side_of
from raydist.spec import NodeStatus

__all__ = ["Head"]

log = logging.getLogger(__name__)


class Head:
    """The head node of one cluster (``in_task``: in a Spark task of its own)."""

    def __init__(self, in_task: bool, relay: bool = False) -> None:
        self.in_task = in_task or relay
        #: The node links end in the head's task (:mod:`raydist.engine.link.relay`).
        self.relay = relay
        #: Where the head's relay and its GCS listen ("host:port"), once its task said so.
        self.relay_address = ""
        self.gcs_address = ""
        self.announced = threading.Event()
        self.link: NodeLink | None = None
        self.up = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        self.job_end = ""  # why the head's Spark job ended, once it has

    def gone(self) -> bool:
        """The head's process (on the driver) or Spark job (in a task) ended."""
        if self.proc is not None:
            return self.proc.poll() is not None
        return bool(self.job_end)

    def status(self, cpus: int, gpus: float) -> NodeStatus:
        link = self.link
        return NodeStatus(key=HEAD_KEY, up=self.up, host=link.host if link else "",
                          node_ip=link.node_ip if link else "", cpus=cpus, gpus=gpus,
                          ray_node_id=str(link.info.get("node_id", "")) if link else "")

    def tail(self) -> list[str]:
        """The last lines of the head's ``ray start`` output."""
        return list(self.link.log_tail) if self.link is not None else []

    def start(self, plan: NodePlan, *, spark: Any, group: str, cluster: str, head_cpus: int, head_gpus: float,
              on_job_end: Callable[[str], None]) -> None:
        """Start the head: on the driver, or by submitting its Spark job.
        ``on_job_end(reason)`` runs when the head's supervisor (on the driver)
        or its Spark job ends, whoever ended it."""
        if not self.in_task:
            proc = self.proc = start_head(plan, psutil.Process())

            def watch() -> None:
                on_job_end(f"its supervisor exited with code {proc.wait()}")

            self.thread = threading.Thread(target=watch, daemon=True, name=f"raydist-{cluster}-head")
            self.thread.start()
            return

        def run() -> None:
            reason = "its Spark task ended"
            side = side_of(spark)
            try:
                try:
                    profile = side.resource_profile(max(1, head_cpus), head_gpus)
                except Exception as exc:  # noqa: BLE001 - stage-level scheduling is optional
                    log.info("head task without its own resource profile (%s)", exc)
                    profile = None
                description = f"raydist cluster {cluster}: Ray head"
                if self.relay:
                    side.run_announcing(functools.partial(run_head_node, plan), group=group, profile=profile,
                                        description=description, on_announce=self._on_announce)
                else:
                    side.run_tasks(functools.partial(run_head_node, plan), group=group, profile=profile,
                                   description=description)
            except Exception as exc:  # noqa: BLE001 - any end of the job ends the head
                reason = first_error_line(exc)
            on_job_end(reason)
            self.announced.set()  # nobody waits for an address that never comes

        self.thread = threading.Thread(target=run, daemon=True, name=f"raydist-{cluster}-head")
        self.thread.start()

    def _on_announce(self, line: str) -> None:
        said = json.loads(line)
        self.relay_address, self.gcs_address = str(said["relay"]), str(said["gcs"])
        self.announced.set()

    def wait_relay(self, deadline: float) -> tuple[str, str]:
        """Where the head's relay and GCS will listen, once its task
        announced them; ("", "") when the head's job ended first or
        ``deadline`` passed."""
        self.announced.wait(max(0.0, deadline - time.monotonic()))
        return self.relay_address, self.gcs_address

    def wait_stopped(self, deadline: float) -> None:
        """After the head was told to stop: wait for its supervisor on the
        driver, killing its whole session when it does not end in time (a
        head in a task ends with its job; the cluster cancels that)."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # The supervisor runs in a session of its own: end its whole
            # process group, not the supervisor alone.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
            self.proc.wait(timeout=5)
