"""raydist from a Spark Connect client: a real Connect server (pip's pyspark,
over local-cluster executors), the user's program in a process of its own
(a process that opens a Connect session stays in Connect mode for good)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from raydist.testing.connect import ConnectServer
from raydist.testing.netns import HostNetwork, netns_unavailable_reason
from tests.probe import CONNECT_URL, recorded_original, run_client_py, run_program
from tests.test_first_runs import check_first_runs

pytestmark = pytest.mark.integration

# spark-tensorflow-distributor's MirroredStrategyRunner asks for the classic
# SparkContext, which a Connect client has not got: how the original fails there.
THEIR_MIRRORED_ERROR = "PySparkRuntimeError: [CONNECT_URL_NOT_SET]"


@pytest.fixture(scope="module")
def connect_server() -> Iterator[ConnectServer]:
    # Three slots: a head's task and two workers (a Connect cluster's head runs in a task).
    server = ConnectServer(master="local-cluster[3,1,1024]").start()
    yield server
    left = server.stop()
    assert not left, f"the Connect server left processes behind: {left}"


def _client(url: str, code: str) -> dict:
    """``code`` in a fresh Connect client process; the JSON it prints last."""
    prog = textwrap.dedent("""
        import json, sys
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    """) + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", prog, url], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_engine_sees_a_connect_session_as_spark(connect_server, no_leftover_ray) -> None:
    seen = _client(connect_server.url, """
        import threading, time
        from raydist.engine.spark import session as spark_side
        from raydist.engine.spark.sides import side_of
        side = side_of(spark)
        cap = spark_side.capacity(spark)
        profile = side.resource_profile(1, 0)
        said = side.run_tasks(lambda: "ran", 2, group="g", profile=profile)
        ended = {}
        def long():
            try:
                side.run_tasks(lambda: __import__("time").sleep(120) or "", group="g2", tag="t2", profile=profile)
                ended["how"] = "finished"
            except Exception as e:
                ended["how"] = type(e).__name__
        t = threading.Thread(target=long)
        t.start()
        time.sleep(3)
        t0 = time.monotonic()
        side.cancel(tag="t2")
        t.join(60)
        cancel_s = time.monotonic() - t0
        # Waiting work: nodes' tasks (raydist's threads) hold every slot; the
        # user's own job waits, and only it counts, from its progress reports.
        from raydist.engine.threads import spawn
        hog = spawn(lambda: side.run_tasks(lambda: __import__("time").sleep(12) or "", 3, group="g3",
                                           profile=profile), name="hog")
        time.sleep(2)
        user = threading.Thread(target=lambda: spark.range(2, numPartitions=2).collect())
        user.start()
        waiting, deadline = [], time.monotonic() + 8
        while time.monotonic() < deadline and not any(waiting):
            waiting.append(side.waiting_tasks("g3"))
            time.sleep(0.2)
        hog.join(30)
        user.join(30)
        print(json.dumps({"kind": side.kind, "executors": cap.executors, "cores": cap.cores_per_executor,
                          "active": spark_side.active_session() is spark, "said": said,
                          "cancelled": ended.get("how"), "cancel_s": cancel_s,
                          "waiting": waiting[-1], "waiting_after": side.waiting_tasks("g3")}))
    """)
    assert seen["kind"] == "connect" and seen["active"]
    assert (seen["executors"], seen["cores"]) == (3, 1)
    assert seen["said"] == ["ran", "ran"]
    assert seen["cancelled"] not in (None, "finished"), seen  # a tag's cancel ends its running job
    # Connect shows a client no scheduler state: it counts its own queries'
    # tasks not started, from their progress reports, and not the nodes' own.
    assert seen["waiting"] == 2 and seen["waiting_after"] == 0, seen


def test_up_on_a_connect_session_runs_ray_and_gives_spark_back(connect_server, no_leftover_ray, tmp_path) -> None:
    out = run_program("connect_user.py", connect_server.url, home=tmp_path)
    assert out["state"] == "RUNNING" and out["workers_up"] == 1, out
    assert out["squares"] == [0, 1, 4, 9]
    assert out["nodes"] == 2  # the head (in a Spark task) and one worker
    assert out["spark_sum"] == 4950  # the user's own Spark job after down()
    assert out["left"] == []


def test_executors_without_raydist_fail_at_once_naming_their_python(tmp_path, no_leftover_ray) -> None:
    # The executors' Python: this venv's interpreter with site-packages on the
    # path but no .pth files, so Ray and pyarrow import and raydist (an
    # editable install) does not: what a cluster without raydist installed sees.
    import site

    wrapper = tmp_path / "python-without-raydist"
    wrapper.write_text(f'#!/bin/bash\nexport PYTHONPATH="{site.getsitepackages()[0]}:$PYTHONPATH"\n'
                       f'exec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    with ConnectServer(master="local-cluster[2,1,1024]", conf={"spark.pyspark.python": str(wrapper)}) as server:
        seen = _client(server.url, """
            import time
            import raydist
            from raydist.errors import RaydistError
            t0 = time.monotonic()
            try:
                raydist.up(spark, workers=1, cpus_per_worker=1)
                print(json.dumps({"error": None}))
            except RaydistError as e:
                print(json.dumps({"error": str(e), "type": type(e).__name__, "after_s": time.monotonic() - t0}))
        """)
    assert seen["error"] is not None, seen
    assert str(wrapper) in seen["error"] and "cannot import raydist" in seen["error"], seen
    assert "spark.pyspark.python" in seen["error"]  # the fix, named


def test_serve_runs_clusters_on_a_spark_it_reaches_only_through_connect(connect_server, tmp_path) -> None:
    from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
    from raydist.engine.ports import free_port
    from tests.control_server import Server

    before = {p.pid for p in ray_processes()}
    server = Server(tmp_path, free_port(), extra=["--spark-remote", connect_server.url], master=None).start()
    try:
        up = server.cli("up", "viaconnect", "-w", "1", "--cpus-per-worker", "1")
        assert up.returncode == 0, up.stdout + up.stderr + (tmp_path / "test-server.log").read_text()[-3000:]
        info = json.loads(server.cli("status", "viaconnect", "-o", "json").stdout)
        assert info["state"] == "RUNNING" and info["ready_workers"] == 1
        assert [n["key"] for n in info["nodes"]] == ["head", "w0"]
        # A Ray user, as `raydist up` tells them: eval "$(raydist env NAME)", then plain ray.init().
        # (Ray Client: retried on its proxy's known flake, as tests/probe.py says.)
        code = "import ray; ray.init(); print(ray.get(ray.remote(lambda: 'hi').remote()))"
        ran = run_client_py(f'eval "$({sys.executable} -m raydist.cli env viaconnect)" && {sys.executable} -c "{code}"',
                            {k: v for k, v in server.env.items() if k.startswith("RAYDIST_")}, 180, shell=True)
        assert ran.returncode == 0 and ran.stdout.strip().splitlines()[-1] == "hi", ran.stderr[-3000:]
        down = server.cli("down", "viaconnect")
        assert down.returncode == 0, down.stderr
    finally:
        assert server.stop() == 0
    assert not wait_no_ray_processes(ignore=before)


def test_a_tenants_clusters_run_in_the_spark_application_of_its_own(connect_server, tmp_path) -> None:
    """``[tenants.NAME] spark_remote``: the tenant's clusters run in its own
    Spark application (here the module's Connect server), none in the control
    plane's, so that no other party's code shares their executors. Another
    tenant's Spark is the control plane's. (The control plane's own is
    ``local[1]``: one slot, where a head and a worker could never fit.)"""
    import psutil

    from raydist.control.client import Client
    from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
    from raydist.engine.ports import free_port
    from tests.control_server import NO_CLUSTERS, Server
    from tests.probe import until

    tokens = {name: f"{name}-" + "k" * 24 for name in ("alice", "bob")}
    lines = []
    for name, token in tokens.items():
        path = tmp_path / f"{name}.token"
        path.write_text(token)
        path.chmod(0o600)
        lines += [f"[tenants.{name}]", f'token_file = "{path}"']
    lines.insert(2, f'spark_remote = "{connect_server.url}"')  # alice's own application
    config = tmp_path / "raydist.toml"
    config.write_text("\n".join([*lines, "[ray]", 'head = "executor"']) + "\n")
    before = {p.pid for p in ray_processes()}
    server = Server(tmp_path, free_port(), ["--config", str(config)], master=NO_CLUSTERS).start().wait_serving()
    try:
        with Client(server.address, token=tokens["alice"]) as alice, Client(server.address, token=tokens["bob"]) as bob:
            # Hers, once it has started (in the background, as the control plane's own does).
            assert until(lambda: alice.server_info().spark_master, timeout=120), "alice's Spark never started"
            assert alice.server_info().spark_master == "local-cluster[3,1,1024]"
            assert bob.server_info().spark_master == NO_CLUSTERS  # the control plane's
        env = {**server.env, "RAYDIST_TOKEN": tokens["alice"], "RAYDIST_HOME": str(tmp_path / "alice-home")}
        up = subprocess.run([sys.executable, "-m", "raydist.cli", "up", "mine", "-w", "1", "--cpus-per-worker", "1"],
                            env=env, capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr + (tmp_path / "test-server.log").read_text()[-3000:]
        # Every Ray process of her cluster descends from her Connect server's
        # driver (its executors), none from the control plane's process.
        ours = [p for p in ray_processes() if p.pid not in before]
        assert ours, "no Ray process started"
        for proc in ours:
            try:
                ancestors = {parent.pid for parent in proc.parents()}
            except psutil.Error:
                continue
            assert connect_server.pid in ancestors and server.proc.pid not in ancestors, proc.cmdline()[:3]
        down = subprocess.run([sys.executable, "-m", "raydist.cli", "down", "mine"], env=env, capture_output=True,
                              text=True, timeout=300)
        assert down.returncode == 0, down.stderr
    finally:
        assert server.stop() == 0
    assert not wait_no_ray_processes(ignore=before)


def test_a_connect_users_ranks_log_into_their_mlflow_run(connect_server, mlflow_server, no_leftover_ray,
                                                          monkeypatch) -> None:
    """A Spark Connect client trains inside an MLflow run: rank 0's metric of
    every step lands in that run, with the driver's credential, which shows
    in no output; the run stays open until the user ends it."""
    import hashlib
    import secrets

    from mlflow import MlflowClient

    token = "tok-" + secrets.token_hex(12)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    out = run_program("mlflow_user.py", "--connect", connect_server.url, mlflow_server.url)
    assert out["status_while_open"] == "RUNNING" and out["status"] == "FINISHED", out
    assert out["returned"]["rank"] == 0 and out["returned"]["pid"] != out["driver_pid"]
    assert out["returned"]["token_sha256"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in out["_output"]
    history = MlflowClient(mlflow_server.url).get_metric_history(out["run_id"], "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 1.0 / (s + 1)) for s in range(5)]


def test_a_client_nothing_can_dial_runs_a_cluster(no_leftover_ray, tmp_path) -> None:
    """The Connect server and its executors on one host, the client on
    another: the node links end in the head's task, and the client's host
    never listens beyond loopback nor accepts a connection."""
    if why := netns_unavailable_reason():
        pytest.skip(why)
    with HostNetwork(hosts=2) as net:
        server_host = net.addresses[0]
        server = ConnectServer(master="local-cluster[2,1,1024]", host=server_host, netns=net.names[0]).start()
        try:
            out = run_program("connect_unreachable.py", server.url, home=tmp_path,
                              prefix=("ip", "netns", "exec", net.names[1]))
        finally:
            left = server.stop()
    assert not left, f"the Connect server left processes behind: {left}"
    assert out["state"] == "RUNNING" and out["workers_up"] == 1, out
    assert out["address"].startswith(server_host + ":"), out  # the head runs on the server's host
    assert out["squares"] == [0, 1, 4, 9]
    assert any("relay" in event for event in out["events"]), out["events"]
    assert out["listening"] == [] and out["accepted"] == [], out
    # pyspark's TorchDistributor contract from that host: two ranks' averaged
    # gradients train as the whole batch does in one process.
    assert out["losses"] == pytest.approx(out["alone"], rel=1e-4), out
    assert out["spark_sum"] == 4950


@pytest.mark.timeout(900)
def test_every_distributor_runs_on_connect_as_on_the_original(connect_server, no_leftover_ray, tmp_path) -> None:
    """Every distributor, a facade and the data handoff in one user program,
    then a wait past the session cluster's retirement: about 2.5 min here.
    The originals' run of the same program is recorded in tests/originals.json."""
    ours = run_program("connect_surface.py", connect_server.url, home=tmp_path / "ours")
    theirs = recorded_original("connect_surface.py", CONNECT_URL)

    # TorchDistributor on the cluster and on the client: the original's results.
    assert [r["loss"] for r in ours["runs"]] == [r["loss"] for r in theirs["runs"]]
    assert ours["local"] == theirs["local"] and ours["local"]["world"] == 2
    # DeepSpeed's config reaches the function on its command line, as under Spark.
    assert ours["deepspeed"] == theirs["deepspeed"]
    assert ours["deepspeed"]["config"] == {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
    # MirroredStrategyRunner: two replicas in sync on the session cluster,
    # where spark-tensorflow-distributor's needs the classic SparkContext.
    assert ours["mirrored"] == {"replicas": 2, "sum": 2.0}, ours.get("mirrored_error")
    assert "mirrored" not in theirs, theirs
    assert theirs["mirrored_error"].startswith(THEIR_MIRRORED_ERROR), theirs["mirrored_error"]

    # A facade and the DataFrame handoff, on the same session cluster.
    assert ours["facade"] == 3.0
    assert (ours["ray_rows"], ours["ray_sum"]) == (1000, 999000)
    assert ours["back"] == [1000, 1000000]
    # One session cluster served the runs that followed each other; on Connect
    # it idles 15 s at most (the client cannot see Spark work waiting), so the
    # local run in between may have outlasted the first one.
    assert ours["session_cluster_torch"] and ours["session_cluster"]
    assert ours["session_cluster_after"] == ours["session_cluster"]
    assert ours["spark_sum"] == theirs["spark_sum"] == 4950
    # The user's own time past the cluster's retirement and Ray's GCS timeout:
    # the process let go of it first, is still whole, and trains again.
    assert ours["session_cluster_after_wait"] is None and ours["connected_after_wait"] is False
    assert ours["run_after_wait"] == ours["runs"][0]
    assert ours["session_cluster_after_stop"] is None and ours["ray_processes_after_stop"] == []


@pytest.mark.timeout(600)
def test_first_runs_go_to_sparks_tasks_from_a_connect_client(connect_server, no_leftover_ray, tmp_path) -> None:
    """tests/programs/first_runs.py as a Connect client (about 60 s): the
    runs in Spark's tasks go through mapInArrow's barrier mode, and the
    session cluster that warms up in a pause has its head in a task."""
    check_first_runs(run_program("first_runs.py", "--connect", connect_server.url, home=tmp_path, timeout=500))


@pytest.mark.timeout(900)
def test_a_pyspark_ml_connect_program_fits_on_connect_as_on_pyspark(connect_server, no_leftover_ray,
                                                                     tmp_path) -> None:
    """tests/test_ml_connect.py's program on this Connect server: about
    2.5 min here (five fits, each after its own Spark jobs)."""
    from tests.test_ml_connect import assert_fits_as_pyspark

    ours = run_program("ml_connect_user.py", "--connect", connect_server.url, home=tmp_path)
    assert_fits_as_pyspark(ours, recorded_original("ml_connect_user.py", "--connect", CONNECT_URL))


@pytest.mark.timeout(900)
def test_horovods_torch_estimator_runs_from_a_connect_client(connect_server, no_leftover_ray, tmp_path) -> None:
    """test_horovod.py's estimator program as a Connect client, where
    Horovod's own estimators cannot run (they need ``df.rdd``): about 2 min here."""
    from tests.test_horovod import check_estimator_program

    out = run_program("horovod_estimator_user.py", "--connect", connect_server.url, str(tmp_path / "store"),
                      home=tmp_path / "home")
    check_estimator_program(out)


@pytest.mark.timeout(900)
def test_horovods_lightning_estimator_runs_from_a_connect_client(connect_server, no_leftover_ray, tmp_path) -> None:
    """test_horovod.py's Lightning estimator program as a Connect client: about 2 min here."""
    from tests.test_horovod import check_lightning_estimator_program

    out = run_program("horovod_lightning_estimator_user.py", "--connect", connect_server.url,
                      str(tmp_path / "store"), home=tmp_path / "home")
    check_lightning_estimator_program(out)


@pytest.mark.timeout(900)
def test_horovods_keras_estimator_runs_from_a_connect_client(connect_server, no_leftover_ray, tmp_path) -> None:
    """test_horovod.py's Keras estimator program as a Connect client: about
    2 min here, most of it TensorFlow's import in each process."""
    from tests.test_horovod import check_keras_estimator_program

    out = run_program("horovod_keras_estimator_user.py", "--connect", connect_server.url,
                      str(tmp_path / "store"), home=tmp_path / "home")
    check_keras_estimator_program(out)
