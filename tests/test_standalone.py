"""raydist on a real Spark standalone cluster: master and worker daemons from
pip's pyspark, first on loopback, then with each worker in its own network
namespace (its own address), so Ray nodes sit on different hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

import raydist
from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
from raydist.engine.ports import free_port
from raydist.engine.spark.session import embedded_session
from raydist.spec import State
from raydist.testing.netns import netns_unavailable_reason
from raydist.testing.standalone import StandaloneSpark
from tests.conftest import RESOURCES, release_shared_spark
from tests.control_server import Server
from tests.probe import client_server_logs, node_tasks, run_client_py

pytestmark = [pytest.mark.integration, pytest.mark.standalone]


@dataclass
class Deployment:
    kind: str
    cluster: StandaloneSpark
    _spark: Any = None

    @property
    def spark(self) -> Any:
        """This process's session on the cluster, started on first use (the
        control-plane test runs first, while the server's session has the
        executors to itself)."""
        if self._spark is None:
            self._spark = embedded_session(self.cluster.master_url, self.cluster.driver_conf())
            self._spark.sparkContext.setLogLevel("ERROR")
        return self._spark

    def gpus_of(self, node_ip: str) -> list[str]:
        """The fake GPUs of the host at ``node_ip`` (any host on loopback)."""
        if self.kind == "loopback":
            return [g for d in self.cluster.daemons for g in d.gpus]
        return next(d.gpus for d in self.cluster.daemons if d.host == node_ip)


@pytest.fixture(scope="module", params=["loopback", "netns"])
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    if request.param == "netns" and (why := netns_unavailable_reason()):
        pytest.skip(f"separate hosts need network namespaces: {why}")
    release_shared_spark()
    before = {p.pid for p in ray_processes()}
    # Two workers ("hosts") of one core and two GPUs each: one executor per
    # host, and no spare core anywhere, so a lost host's Ray node can only
    # come back on that host.
    sa = StandaloneSpark(workers=2, cores=1, memory="3g", gpus_per_worker=2,
                         gpu_discovery_script=str(RESOURCES / "fake_gpus.sh"),
                         isolate=request.param == "netns", client_hosts=1).start()
    d = Deployment(request.param, sa)
    try:
        yield d
    finally:
        if d._spark is not None:
            d._spark.stop()
        left = sa.stop()
        assert not left, f"Spark processes left: {[(p.pid, p.name()) for p in left]}"
        assert not wait_no_ray_processes(ignore=before)


def test_control_plane_on_standalone(deployment: Deployment, tmp_path: Path, no_leftover_ray: None) -> None:
    """The control plane on a cluster manager puts each cluster's head in a
    Spark task of its own: with one core per host, the head takes one host
    and the worker the other, and neither is the driver's."""
    if deployment.kind != "netns":
        pytest.skip("the control plane is checked across hosts only")
    sa = deployment.cluster
    conf = [f"--spark-conf={k}={v}" for k, v in sa.driver_conf().items()]
    port = free_port()
    # Listening beyond loopback: a user on another host reaches it with its address and token.
    server = Server(tmp_path, port, [*conf, "--host", "0.0.0.0"], master=sa.master_url).start()
    try:
        up = server.cli("up", "sa", "-w", "1", "--cpus-per-worker", "1", "-o", "json")
        assert up.returncode == 0, up.stdout + up.stderr
        info = json.loads(server.cli("status", "sa", "-o", "json").stdout)
        assert info["state"] == "RUNNING" and info["ready_workers"] == 1
        head_host = info["address"].split(":")[0]
        assert head_host in {d.host for d in sa.daemons} and head_host != sa.driver_host
        assert sorted(n["node_ip"] for n in info["nodes"]) == sorted(d.host for d in sa.daemons)

        # Another host: its own network namespace, nothing but the control
        # plane's address and token (no RAYDIST_HOME of the server's).
        remote_home = tmp_path / "remote-home"
        remote_home.mkdir()
        remote = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(remote_home),
                  "RAYDIST_HOME": str(remote_home), "RAYDIST_ADDRESS": f"{sa.driver_host}:{port}",
                  "RAYDIST_TOKEN": server.token, "RAY_USAGE_STATS_ENABLED": "0"}
        code = ("import ray; ray.init(); "
                "print(sorted({n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']})); "
                "print(ray.get(ray.remote(lambda: 6 * 7).remote()))")
        script = (f'eval "$(raydist env sa)" && python -c "{code}" && '
                  "raydist submit sa -- python -c 'import ray; ray.init(); print(\"job says\", len(ray.nodes()))'")
        proc = subprocess.run(["ip", "netns", "exec", sa.client_netns[0], "env", "-i",
                               *(f"{k}={v}" for k, v in remote.items()), "bash", "-c", script],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        lines = proc.stdout.strip().splitlines()
        assert str(sorted(d.host for d in sa.daemons)) in lines and "42" in lines, proc.stdout
        assert "job says 2" in proc.stdout  # the job ran inside the cluster: head and worker
        assert server.token not in proc.stdout + proc.stderr
        given = [line for line in server.cli("logs", "sa").stdout.splitlines() if "credentials given to" in line]
        assert len(given) >= 2 and any(sa.client_host in line for line in given), given  # env, then submit
        down = server.cli("down", "sa")
        assert down.returncode == 0, down.stderr
        assert json.loads(server.cli("status", "sa", "-o", "json").stdout)["state"] == "DELETED"
    finally:
        assert server.stop() == 0
    assert os.path.exists(tmp_path / "state.db")


def test_cluster_spans_both_hosts_with_their_gpus(deployment: Deployment, no_leftover_ray: None) -> None:
    with raydist.up(deployment.spark, name="across", workers=2, cpus_per_worker=1, gpus_per_worker=1) as cluster:
        nodes = {n.key: n for n in cluster.status().nodes}
        workers = [nodes["w0"], nodes["w1"]]
        if deployment.kind == "netns":
            # Each Ray worker node on its own host, none on the driver's.
            hosts = {d.host for d in deployment.cluster.daemons}
            assert {n.node_ip for n in workers} == hosts
            assert nodes["head"].node_ip == deployment.cluster.driver_host
        info = node_tasks(cluster)
        assert len(info["tasks"]) == 2
        by_id = {n["id"]: n for n in info["nodes"]}
        for task in info["tasks"]:
            node = by_id[task["node"]]
            assert node["res"].get("GPU") == 1.0
            # The GPU Spark gave the task, and only it, is the node's GPU.
            node_ip = next(k.split(":")[1] for k in node["res"] if k.startswith("node:") and "__internal" not in k)
            assert task["cuda"] in deployment.gpus_of(node_ip), (task, node_ip)
        assert sorted(n.gpu_ids[0] for n in workers) == sorted(t["cuda"] for t in info["tasks"])

        # Ray Client from the driver's host reaches the head across hosts.
        proc = run_client_py(
            f"""
            import ray
            ray.init("{cluster.client_address}")
            print(sorted(ray.get([ray.remote(lambda: ray.util.get_node_ip_address()).options(
                num_cpus=1).remote() for _ in range(4)])))
            """,
            {k: v for k, v in cluster.env().items() if k != "RAY_ADDRESS"},
        )
        assert proc.returncode == 0, proc.stderr[-3000:] + client_server_logs(cluster)
        gcs = cluster.address
    assert cluster.status().state == State.DELETED
    assert not [p for p in ray_processes() if gcs in " ".join(p.cmdline())]


def test_gpu_ranks_across_hosts_each_see_their_own_task_gpu(deployment: Deployment, tmp_path: Path,
                                                            no_leftover_ray: None) -> None:
    """pyspark's GPU contract across hosts: one rank a host (one core each),
    each seeing the GPU Spark gave its task and LOCAL_RANK 0."""
    from raydist.compat import TorchDistributor
    from tests import train_fns

    TorchDistributor(num_processes=2, local_mode=False, use_gpu=True, keep_warm_s=0).run(
        train_fns.gpu_seen, str(tmp_path))
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert [(r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"]) for r in ranks] == [("0", "1"), ("0", "1")]
    for rank in ranks:
        assert rank["CUDA_VISIBLE_DEVICES"] in deployment.gpus_of(rank["ip"]), rank
    assert len({r["CUDA_VISIBLE_DEVICES"] for r in ranks}) == 2
    if deployment.kind == "netns":
        assert {r["ip"] for r in ranks} == {d.host for d in deployment.cluster.daemons}


def _ended(procs: dict[str, psutil.Process], wait_s: float = 20.0) -> list[str]:
    """Keys of the processes that end (or are zombies) within ``wait_s``,
    waiting until at least one has."""
    deadline = time.monotonic() + wait_s
    while True:
        ended = [k for k, p in procs.items() if not p.is_running() or p.status() == psutil.STATUS_ZOMBIE]
        if ended or time.monotonic() > deadline:
            time.sleep(1.0)  # let a second (wrong) loss show, if there is one
            return [k for k, p in procs.items() if not p.is_running() or p.status() == psutil.STATUS_ZOMBIE]
        time.sleep(0.2)


def test_lost_worker_daemon_degrades_then_heals(deployment: Deployment, no_leftover_ray: None) -> None:
    sa = deployment.cluster
    before = {p.pid for p in ray_processes()}
    with raydist.up(deployment.spark, name="heal", workers=2, cpus_per_worker=1, gpus_per_worker=1) as cluster:
        links = cluster._channel.links()
        supervisors = {key: psutil.Process(links[key].pid) for key in ("w0", "w1")}
        host = sa.daemons[0]
        sa.kill_worker(host.index)
        deadline = time.monotonic() + 60
        while cluster.status().state != State.DEGRADED and time.monotonic() < deadline:
            time.sleep(0.2)
        status = cluster.status()
        assert status.state == State.DEGRADED, cluster.events()
        assert status.ready_workers == 1
        lost = _ended(supervisors)
        assert len(lost) == 1, f"exactly the node on the dead host is lost, not {lost}"
        # No other host has a free core: it stays degraded until the host's
        # worker daemon is back.
        time.sleep(3)
        assert cluster.status().state == State.DEGRADED
        sa.start_worker(host.index)
        assert cluster.wait_for_workers(2, timeout=180), "\n".join(m for _, m in cluster.events())
        status = cluster.status()
        assert status.state == State.RUNNING
        restarts = {n.key: n.restarts for n in status.nodes if n.key != "head"}
        survivor = ({"w0", "w1"} - set(lost)).pop()
        assert restarts[survivor] == 0 and restarts[lost[0]] >= 1, (restarts, cluster.events())
        if deployment.kind == "netns":
            back = next(n for n in status.nodes if n.key == lost[0])
            assert back.node_ip == host.host, "the node came back on the host that returned"
        assert len(node_tasks(cluster)["tasks"]) == 2
    # down() returned: nothing raydist started for the cluster is left, not
    # even for a moment (a supervisor outlived it now and then, and
    # bench-startup-standalone counted it).
    ours = f"raydist-{cluster._uid}"  # this cluster's processes: its nodes' temp dirs name it, supervisors included
    left = [p for p in ray_processes() if p.pid not in before and ours in " ".join(p.cmdline())]
    assert not left, [" ".join(p.cmdline()[:4]) for p in left]
