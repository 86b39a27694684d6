"""A simulated Spark for the scale benchmark: the real engine on fake executors.

``SimSpark(executors)`` stands where a SparkSession would; the engine finds
its :class:`SimSide` through ``raydist_side()`` (:func:`raydist.engine.spark.sides.side_of`).
A job's one task is a simulated node in a :mod:`raydist.testing.simnodes`
process, started at once (no scheduling delay, no Python worker start):
what this measures is the driver's own cost per node, not Spark's.
"""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from raydist.engine.spark.side import SparkJob, SparkSide, TaskBody

__all__ = ["SimSpark", "SimSide"]


class _SimJob(SparkJob):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.why = ""

    def ended(self) -> bool:
        return self.done.is_set()

    def error(self) -> str:
        return self.why


class SimSide(SparkSide):
    kind = "classic"

    def __init__(self, spark: SimSpark) -> None:
        super().__init__(spark)
        self.sim = spark

    def stopped(self) -> bool:
        return self.sim.is_stopped

    def conf(self, key: str, default: str | None = None) -> str | None:
        return self.sim.conf.get(key, default)

    @property
    def master(self) -> str:
        return "spark://simulated:7077"

    def executor_hosts(self) -> dict[str, int]:
        return {f"sim-host-{i}": 1 for i in range(self.sim.executors)}

    def default_parallelism(self) -> int:
        return self.sim.executors

    def run_tasks(self, body: TaskBody, n: int = 1, *, group: str, tag: str = "", profile: Any = None,
                  description: str = "", barrier: bool = False) -> list[str]:
        if barrier:
            raise NotImplementedError("simulated executors run no barrier stages (they run no training)")
        job = self.submit(body, n, group=group, tag=tag, profile=profile, description=description)
        assert isinstance(job, _SimJob)
        job.done.wait()
        if job.why:
            raise RuntimeError(job.why)
        return [""] * n

    def submit(self, body: TaskBody, n: int = 1, *, group: str, tag: str = "", profile: Any = None,
               description: str = "") -> SparkJob:
        plan = getattr(body, "args", (None,))[0]
        job = _SimJob()
        if plan is None or not hasattr(plan, "node_secret"):
            job.done.set()  # a warm-up or probe job: nothing to simulate
            return job
        return self.sim.start_node(job, plan, group, tag)

    def cancel(self, *, group: str = "", tag: str = "") -> None:
        self.sim.order({"op": "cancel", "group": group, "tag": tag})

    def waiting_tasks(self, ignore_group: str = "") -> int | None:
        return 0

    def running_tasks(self) -> int | None:
        return len(self.sim.jobs)

    def on_stop(self, hook: Callable[[Any], None]) -> None:
        self.sim.hooks.append(hook)

    def resource_profile(self, cpus: int, gpus: float) -> Any:
        return None


class SimSpark:
    """Stands for a SparkSession of ``executors`` one-core executors whose
    tasks are simulated nodes (a simulator process started here)."""

    def __init__(self, executors: int) -> None:
        self.executors = executors
        self.is_stopped = False
        self.hooks: list[Callable[[Any], None]] = []
        self.conf = {"spark.driver.host": "127.0.0.1", "spark.executor.cores": "1",
                     "spark.executor.memory": "2g", "spark.executor.instances": str(executors)}
        self.proc = subprocess.Popen([sys.executable, "-m", "raydist.testing.simnodes"], stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        port = int(self.proc.stdout.readline())
        self._control = socket.create_connection(("127.0.0.1", port))
        self._send_lock = threading.Lock()
        self.jobs: dict[str, _SimJob] = {}
        self._ids = itertools.count()
        threading.Thread(target=self._listen, daemon=True, name="raydist-sim-control").start()

    def raydist_side(self) -> SimSide:
        return SimSide(self)

    def start_node(self, job: _SimJob, plan: Any, group: str, tag: str) -> _SimJob:
        job_id = str(next(self._ids))
        self.jobs[job_id] = job
        self.order({"op": "start", "job": job_id, "key": plan.key, "node_secret": plan.node_secret,
                    "channel": list(plan.channel), "head": bool(plan.head), "group": group, "tag": tag})
        return job

    def order(self, msg: dict[str, Any]) -> None:
        with self._send_lock:
            self._control.sendall((json.dumps(msg) + "\n").encode())

    def _listen(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self._control.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                for job in list(self.jobs.values()):
                    job.why = job.why or "the simulator is gone"
                    job.done.set()
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                job = self.jobs.pop(msg["job"], None)
                if job is not None:
                    job.why = msg.get("error", "")
                    job.done.set()

    def stop(self) -> None:
        for hook in list(self.hooks):
            hook(self)
        self.is_stopped = True
        try:
            self._control.shutdown(socket.SHUT_RDWR)  # a close alone leaves the listening thread's recv holding it
        except OSError:
            pass
        self._control.close()
        self.proc.wait(timeout=30)
