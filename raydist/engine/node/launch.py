"""Starting one Ray node under a supervisor: the head on the driver, or a
worker inside a Spark task.

``run_worker_node`` is the function each worker's Spark task runs. It lives at
module level (not in a closure) so Spark pickles a reference to it, and it
imports neither Ray nor anything heavy: the Ray node runs in the supervisor's
``ray start`` child, and the task only maps Spark's resources into it and
waits.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from raydist.engine.link.keys import relay_key
from raydist.engine.link.relay import LinkRelay
from raydist.engine.link.wire import HEAD_FROM_LINK
from raydist.engine.node.procs import SCOPE_VARIABLE
from raydist.engine.node.reaper import KILL_GRACE_S, started_at
from raydist.engine.ports import preferred_or_free_port
from raydist.engine.sizing import NodeSize, memory_limit, node_size, visible_gpus
from raydist.paths import private_dir

if TYPE_CHECKING:
    from raydist.engine.spark.session import SparkCapacity
    from raydist.spec import ClusterSpec

__all__ = ["HEAD_KEY", "HEAD_PORTS", "NodePlan", "node_plans", "spawn_supervisor", "run_worker_node", "run_head_node",
           "route_ip", "ray_executable"]

#: The head node's key on the node channel (workers are w0, w1...).
HEAD_KEY = "head"
#: How often the head of an elastic cluster reports Ray's unplaced demand: a
#: GCS read each time (about 1% of a core at 0.2 s), and on average half of
#: it is added to every scale-up.
DEMAND_S = 0.2
#: The head ports a deployment may pin (``head_ports``): the rest are free ports.
HEAD_PORTS = ("gcs", "dashboard", "client")


@dataclass(frozen=True, repr=False)
class NodePlan:
    """Everything a supervisor needs to run one node; pickled into Spark tasks.

    ``node_secret`` is this node's own node secret (:mod:`raydist.engine.link.keys`),
    never the cluster's; ``secret_env`` holds the Ray token. The repr hides both.
    """

    cluster: str
    key: str
    channel: tuple[str, int]
    node_secret: str
    secret_env: Mapping[str, str]
    gcs_address: str = ""
    head: bool = False
    cpus: int | None = None
    gpus: float = 0.0
    memory: int | None = None
    object_store: int | None = None
    nodes_on_host: int = 1
    jvm_bytes_on_host: int = 0
    head_ports: Mapping[str, int] = field(default_factory=dict)
    ray_options: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    temp_dir: str = ""
    node_ip: str = ""
    deadline_s: float = 180.0
    dashboard: bool = False
    demand_s: float = 0.0  # the head reports Ray's demand this often (elastic clusters)
    #: The head's task hosts the node links (:mod:`raydist.engine.link.relay`):
    #: ``channel`` only names the host whose route picks the head's address.
    relay: bool = False

    def __repr__(self) -> str:
        return f"NodePlan(cluster={self.cluster!r}, key={self.key!r}, head={self.head})"


def node_plans(
    spec: ClusterSpec,
    cap: SparkCapacity,
    cpus: int,
    *,
    head_ip: str,
    ports: Mapping[str, int],
    channel: tuple[str, int],
    head_node_secret: str,
    secret_env: Mapping[str, str],
    temp_dir: str,
) -> tuple[NodePlan, NodePlan]:
    """The head's plan (with the head's node secret, ``head_node_secret``) and the
    plan every worker's is made from (its key, node secret and temp dir filled
    in per worker), for ``spec`` on Spark of ``cap`` with
    ``cpus`` per worker node. With ``head_ip`` empty the head runs in a Spark
    task: ``ports`` are only preferences it tries on its host, and workers
    learn its address over the link."""
    per_exec = max(1, cap.cores_per_executor // max(cpus, 1))
    busiest = max(cap.hosts.values(), default=1)
    common: dict[str, Any] = dict(
        cluster=spec.name,
        channel=channel,
        secret_env=dict(secret_env),
        gcs_address=f"{head_ip}:{ports['gcs']}" if head_ip else HEAD_FROM_LINK,
        nodes_on_host=busiest * per_exec + 1,
        jvm_bytes_on_host=busiest * cap.memory_per_executor,
        ray_options=dict(spec.ray_start_options),
        env=dict(spec.env),
        deadline_s=spec.start_timeout_s,
    )
    head = NodePlan(
        key=HEAD_KEY,
        node_secret=head_node_secret,
        head=True,
        cpus=spec.head_cpus,
        gpus=spec.head_gpus,
        memory=spec.head_memory,  # type: ignore[arg-type]
        object_store=spec.head_object_store,  # type: ignore[arg-type]
        head_ports=dict(ports),
        temp_dir=temp_dir,
        node_ip=head_ip,
        dashboard=spec.dashboard,
        demand_s=DEMAND_S if spec.required_workers < spec.desired_workers else 0.0,
        **common,
    )
    worker = NodePlan(
        key="",
        node_secret="",
        cpus=cpus,
        gpus=spec.gpus_per_worker,
        memory=spec.memory_per_worker,  # type: ignore[arg-type]
        object_store=spec.object_store_per_worker,  # type: ignore[arg-type]
        **common,
    )
    return head, worker


def ray_executable() -> str:
    """The ``ray`` script of the running interpreter's environment."""
    beside = Path(sys.executable).with_name("ray")
    if beside.exists():
        return str(beside)
    found = shutil.which("ray")
    if not found:
        raise FileNotFoundError("the `ray` command is not installed in this Python environment")
    return found


def route_ip(towards: str) -> str:
    """This host's address on the interface that reaches ``towards``."""
    try:
        target = socket.gethostbyname(towards)
    except OSError:
        target = towards
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def _shm_bytes() -> int:
    try:
        st = os.statvfs("/dev/shm")
        return st.f_blocks * st.f_frsize
    except OSError:
        return 0


def _ancestor_jvm() -> psutil.Process | None:
    try:
        for proc in psutil.Process().parents():
            if proc.name() == "java":
                return proc
    except psutil.Error:
        pass
    return None


def node_argv(plan: NodePlan, *, cpus: int, gpus: int, memory: int, object_store: int, node_ip: str) -> list[str]:
    """The ``ray start --block`` command line for one node."""
    argv = [ray_executable(), "start", "--block", "--disable-usage-stats", f"--node-ip-address={node_ip}"]
    if plan.head:
        ports = plan.head_ports
        argv += [
            "--head",
            f"--port={ports['gcs']}",
            f"--dashboard-port={ports['dashboard']}",
            f"--ray-client-server-port={ports['client']}",
            f"--dashboard-host={node_ip}",
            f"--include-dashboard={'true' if plan.dashboard else 'false'}",
            # raydist sizes its clusters itself: Ray's autoscaler monitor
            # would be one more Python process on the driver's host.
            "--no-monitor",
        ]
    else:
        argv.append(f"--address={plan.gcs_address}")
    argv += [
        f"--num-cpus={cpus}",
        f"--num-gpus={gpus}",
        f"--memory={memory}",
        f"--object-store-memory={object_store}",
    ]
    if plan.temp_dir:
        argv.append(f"--temp-dir={plan.temp_dir}")
    for key, value in plan.ray_options.items():
        argv.append(f"--{key}={value}" if value != "" else f"--{key}")
    return argv


#: What a head started on the driver keeps of the driver's environment: what
#: Python, Ray and the CUDA stack need to run, nothing of the control plane's
#: own (its token, its home, cloud credentials, whatever else it was given).
_HEAD_ENV_KEEP = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                            "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH",
                            "JAVA_HOME", "RAY_USAGE_STATS_ENABLED", SCOPE_VARIABLE})
_HEAD_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_")


def head_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a head's supervisor gets on the driver: built for it
    from ``environ`` (the driver's), not a copy of it. Ray's own settings
    (``RAY_*``) pass, but for its address and auth, which the node's plan sets."""
    return {k: v for k, v in environ.items()
            if k in _HEAD_ENV_KEEP or k.startswith(_HEAD_ENV_PREFIXES)
            or (k.startswith("RAY_") and not k.startswith(("RAY_AUTH_", "RAY_ADDRESS")))}


def spawn_supervisor(plan: NodePlan, *, argv: list[str], node_ip: str, env: Mapping[str, str],
                     watch: Iterable[psutil.Process], info: Mapping[str, Any],
                     base_env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start the supervisor for one node in its own session and hand it its
    configuration on stdin (never on a command line, where secrets would show).
    ``base_env``: the supervisor's own environment (None: this process's)."""
    cfg = {
        "key": plan.key,
        "channel": list(plan.channel),
        "node_secret": plan.node_secret,
        "argv": argv,
        "env": {**env, **plan.secret_env},
        "node_ip": node_ip,
        "watch": [[p.pid, started_at(p.pid)] for p in watch],
        "wait_for": "" if plan.head else plan.gcs_address,
        "deadline_s": plan.deadline_s,
        "info": dict(info),
        "log_path": os.path.join(plan.temp_dir, f"raydist-{plan.key}.log") if plan.temp_dir else "",
        "temp_dir": plan.temp_dir,
        "demand_s": plan.demand_s,
    }
    if plan.temp_dir:
        private_dir(plan.temp_dir)
    # The node's temp dir on the command line names the cluster (raydist-<id>):
    # the driver's teardown waits for every local process that names it, the
    # supervisors as well as their Ray processes.
    proc = subprocess.Popen(
        [sys.executable, "-m", "raydist.engine.node.supervisor", *([plan.temp_dir] if plan.temp_dir else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env=dict(base_env) if base_env is not None else None,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(cfg).encode())
    proc.stdin.close()
    return proc


def _node_env(plan: NodePlan, cuda_visible: str | None) -> dict[str, str]:
    env = {"RAY_USAGE_STATS_ENABLED": "0", **plan.env}
    if plan.head and plan.demand_s > 0:
        # The GCS learns each raylet's unplaced demand by pulling it, by
        # default once a second (Ray's autoscaler reads every 5 s); an elastic
        # cluster's head pulls as often as it reports, or a demand reading
        # lags the demand by up to a second (measured: 0.2-0.9 s, 0.05-0.2 s so).
        env.setdefault("RAY_gcs_pull_resource_loads_period_milliseconds", str(int(plan.demand_s * 1000)))
    if not plan.head:
        # Ray reports each node's "cloud instance id": the node's raydist key,
        # so demand and idle readings name the slot they are about.
        env["RAY_CLOUD_INSTANCE_ID"] = plan.key
    if cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    return env


def _size_on_this_host(plan: NodePlan) -> NodeSize:
    """What ``plan``'s node may take of this host's memory and shared memory,
    beside the other nodes and JVMs the plan says share it."""
    return node_size(host_memory=memory_limit(psutil.virtual_memory().total), shm_bytes=_shm_bytes(),
                     nodes_on_host=plan.nodes_on_host, jvm_bytes_on_host=plan.jvm_bytes_on_host,
                     memory=plan.memory, object_store=plan.object_store)


def start_head(plan: NodePlan, driver: psutil.Process) -> subprocess.Popen[bytes]:
    """Start the head node on this (the driver's) host, watched by the driver."""
    node_ip = plan.node_ip or "127.0.0.1"
    size = _size_on_this_host(plan)
    argv = node_argv(plan, cpus=plan.cpus or 0, gpus=int(plan.gpus), memory=size.memory,
                     object_store=size.object_store, node_ip=node_ip)
    info = {"cpus": plan.cpus or 0, "gpus": int(plan.gpus), "memory": size.memory,
            "object_store": size.object_store, "gpu_ids": []}
    return spawn_supervisor(plan, argv=argv, node_ip=node_ip, env=_node_env(plan, None),
                            watch=[driver], info=info, base_env=head_env(os.environ))


def run_worker_node(plan: NodePlan) -> str:
    """Body of a worker node's Spark task: run the node until it ends.

    Maps the task's CPUs and GPU addresses into the Ray node, starts the
    supervisor (which watches this process and the executor JVM), and waits.
    Returns one JSON line describing how the node ended.
    """
    return _run_in_task(plan)


def prestart_python_worker() -> str:
    """Body of a prestart task: nothing but being run. Spark starts an
    executor's Python worker daemon for the first Python task with given
    task resources (about 1.5 s here); a prestart task with a worker node's
    resources takes that off the first scale-up. Returns this host's name."""
    return socket.gethostname()


def run_head_node(plan: NodePlan, announce: Callable[[str], None] | None = None) -> str:
    """Body of the head's Spark task (the control plane's clusters, a Spark
    Connect client's): the head runs on an executor, away from the driver's
    process tree, on the head ports it prefers when they are free on this
    host, else free ones. Its ``started`` report carries the ports it got.

    With ``plan.relay`` the node links end here: the task runs the
    cluster's :class:`~raydist.engine.link.relay.LinkRelay` for as long as the
    head lives and ``announce`` tells the driver where it and the GCS listen."""
    node_ip = route_ip(plan.channel[0])
    taken: set[int] = set()
    ports = {name: preferred_or_free_port(node_ip, plan.head_ports.get(name), taken) for name in HEAD_PORTS}
    plan = replace(plan, head_ports=ports, node_ip=node_ip)
    if not plan.relay:
        return _run_in_task(plan)
    relay = LinkRelay(node_ip, relay_key(plan.node_secret))
    try:
        # The head starts before the announcement: `ray start --head` runs
        # while the driver learns where the relay is and links the node.
        proc = _start_in_task(replace(plan, channel=(node_ip, relay.port)))
        try:
            if announce is not None:
                # The GCS address too: workers start their raylets once it
                # listens, seconds before `ray start --head` has returned.
                announce(json.dumps({"relay": relay.address, "gcs": f"{node_ip}:{ports['gcs']}"}))
        except BaseException:
            _stop_supervisor(proc)
            raise
        return _ended(plan, proc)
    finally:
        relay.close()


def _stop_supervisor(proc: subprocess.Popen[bytes]) -> None:
    """End a node this task started and will not wait for (its supervisor
    watches the task's process, which a Spark Python worker outlives)."""
    proc.terminate()  # the supervisor tears its node down on SIGTERM
    try:
        proc.wait(timeout=KILL_GRACE_S + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ended(plan: NodePlan, proc: subprocess.Popen[bytes]) -> str:
    """Wait for the node to end; one JSON line saying how it did."""
    code = proc.wait()
    return json.dumps({"key": plan.key, "code": code, "host": socket.gethostname()})


def _run_in_task(plan: NodePlan) -> str:
    return _ended(plan, _start_in_task(plan))


def _start_in_task(plan: NodePlan) -> subprocess.Popen[bytes]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    cpus = plan.cpus if plan.head else plan.cpus or (ctx.cpus() if ctx is not None else 1)
    cpus = cpus or 0
    resources = ctx.resources() if ctx is not None else {}
    addresses = list(resources["gpu"].addresses) if "gpu" in resources else []
    cuda: str | None = None
    gpu_ids: list[str] = []
    num_gpus = 0
    if plan.gpus > 0:
        gpu_ids = visible_gpus(addresses, os.environ.get("CUDA_VISIBLE_DEVICES"))
        cuda = ",".join(gpu_ids)
        # A fractional share still shows the node one whole device: Ray counts
        # GPUs per node in whole numbers; the sharing is Spark's to enforce.
        num_gpus = len(gpu_ids)
    elif os.environ.get("CUDA_VISIBLE_DEVICES"):
        cuda = ""  # a CPU node must not see the executor's GPUs
    node_ip = route_ip(plan.channel[0])
    size = _size_on_this_host(plan)
    argv = node_argv(plan, cpus=cpus, gpus=num_gpus, memory=size.memory,
                     object_store=size.object_store, node_ip=node_ip)
    me = psutil.Process()
    watch = [me]
    jvm = _ancestor_jvm()
    if jvm is not None:
        watch.append(jvm)
    info = {
        "cpus": cpus, "gpus": num_gpus, "gpu_ids": gpu_ids, "memory": size.memory,
        "object_store": size.object_store,
        "executor": ctx.getLocalProperty("spark.executor.id") if ctx is not None else None,
        "partition": ctx.partitionId() if ctx is not None else 0,
        "attempt": ctx.attemptNumber() if ctx is not None else 0,
    }
    if plan.head:
        info["ports"] = dict(plan.head_ports)
    return spawn_supervisor(plan, argv=argv, node_ip=node_ip, env=_node_env(plan, cuda), watch=watch, info=info)
