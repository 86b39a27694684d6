"""Sizing rules: shares of the host, /dev/shm caps, GPU address mapping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raydist.engine.sizing import embedded_master, node_size, visible_gpus
from raydist.errors import SpecError
from raydist.spec import MIN_OBJECT_STORE

pytestmark = pytest.mark.unit

GiB = 1 << 30


@given(
    host=st.integers(1 * GiB, 1024 * GiB),
    shm=st.integers(0, 512 * GiB),
    nodes=st.integers(1, 64),
)
def test_object_store_never_exceeds_shm_share(host: int, shm: int, nodes: int) -> None:
    size = node_size(host_memory=host, shm_bytes=shm, nodes_on_host=nodes)
    if shm:
        assert size.object_store <= max(int(shm * 0.8) // nodes, MIN_OBJECT_STORE)
    assert size.object_store >= MIN_OBJECT_STORE
    assert size.memory > 0


def test_share_splits_what_the_jvms_leave() -> None:
    a = node_size(host_memory=24 * GiB, shm_bytes=12 * GiB, nodes_on_host=3, jvm_bytes_on_host=4 * GiB)
    b = node_size(host_memory=24 * GiB, shm_bytes=12 * GiB, nodes_on_host=3)
    assert a.memory + a.object_store < b.memory + b.object_store
    assert a.memory + a.object_store <= (24 - 4) * GiB * 0.8 / 3 + 1


def test_explicit_object_store_over_shm_is_an_error() -> None:
    with pytest.raises(SpecError, match="/dev/shm"):
        node_size(host_memory=64 * GiB, shm_bytes=1 * GiB, nodes_on_host=1, object_store=2 * GiB)


def test_gpu_addresses_without_executor_mask() -> None:
    assert visible_gpus(["0", "3"], None) == ["0", "3"]


def test_gpu_addresses_are_indexes_into_executor_mask() -> None:
    assert visible_gpus(["0", "1"], "4,5,6") == ["4", "5"]
    # A discovery script that reports the ids it sees is also understood.
    assert visible_gpus(["6"], "4,5,6") == ["6"]


def test_gpu_address_outside_mask_is_an_error() -> None:
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        visible_gpus(["7"], "4,5")


@pytest.mark.parametrize("cpus,execs", [(2, 2), (16, 2), (1, 2)])
def test_embedded_master_leaves_room(cpus: int, execs: int) -> None:
    master = embedded_master(cpus, 24 * GiB)
    n, c, m = (int(x) for x in master[len("local-cluster["):-1].split(","))
    assert n == execs and c >= 1 and 1024 <= m <= 8192
    assert n * c <= max(cpus - 1, n)


def test_memory_is_the_containers_limit_when_lower(tmp_path) -> None:
    from raydist.engine.sizing import memory_limit

    host = 64 << 30
    v2 = tmp_path / "memory.max"
    v2.write_text(f"{8 << 30}\n")
    assert memory_limit(host, [str(v2)]) == 8 << 30
    v2.write_text("max\n")
    assert memory_limit(host, [str(v2)]) == host  # no limit
    v2.write_text(f"{128 << 30}\n")
    assert memory_limit(host, [str(v2)]) == host  # a limit above the host's memory is no limit
    v1 = tmp_path / "memory.limit_in_bytes"
    v1.write_text(f"{4 << 30}\n")
    assert memory_limit(host, [str(tmp_path / "absent"), str(v1)]) == 4 << 30
    assert memory_limit(host, [str(tmp_path / "absent")]) == host


def test_an_elastic_cluster_cannot_ask_for_more_than_spark_can_ever_run() -> None:
    from raydist.engine.spark.session import SparkCapacity, check_fits
    from raydist.errors import CapacityError
    from raydist.spec import ClusterSpec

    cap = SparkCapacity(executors=2, cores_per_executor=2, gpus_per_executor=0, memory_per_executor=1 << 30,
                        dynamic=False, hosts={"h": 2})
    check_fits(ClusterSpec(name="ok", min_workers=0, max_workers=4), cap, head_in_task=False, cpus=1)
    with pytest.raises(CapacityError, match="max_workers <= 4"):
        check_fits(ClusterSpec(name="huge", min_workers=0, max_workers=4096), cap, head_in_task=False, cpus=1)
    with pytest.raises(CapacityError, match="workers <= 4"):
        check_fits(ClusterSpec(name="big", workers=5), cap, head_in_task=False, cpus=1)
    # The head's own task (a Connect session's) takes a slot of its own: 4 fit, 3 beside it.
    check_fits(ClusterSpec(name="three", workers=3), cap, head_in_task=True, cpus=1)
    with pytest.raises(CapacityError, match="beside the head's task"):
        check_fits(ClusterSpec(name="four", workers=4), cap, head_in_task=True, cpus=1)


def test_free_ports_taken_one_after_another_never_repeat() -> None:
    """Each call records its port in the caller's set, from the first (empty) one on:
    the kernel may hand a just-closed port out again."""
    from raydist.engine.ports import free_port

    taken: set[int] = set()
    ports = [free_port("127.0.0.1", taken) for _ in range(50)]
    assert len(set(ports)) == 50 and taken == set(ports)


def test_free_ports_stay_out_of_the_ranges_ray_takes_ports_from() -> None:
    """Ray's workers bind in 10002-19999 and Ray Client's proxy binds each
    client's server in 23000-23999, first free first: a node port picked
    there (and bound seconds later) is taken from under the node."""
    from raydist.engine.ports import RAY_CLIENT_SERVER_PORTS, free_port
    from raydist.engine.sizing import RAY_WORKER_PORTS

    ports = [free_port("127.0.0.1") for _ in range(300)]
    assert not [p for p in ports if p in RAY_WORKER_PORTS or p in RAY_CLIENT_SERVER_PORTS]


def test_callers_picking_at_once_with_sets_of_their_own_never_get_one_port() -> None:
    """Two clusters' heads starting at once in one control plane (or two
    supervisors on one host) each pick a handful of ports before either binds
    them: a port handed to one is kept from the other."""
    import threading

    from raydist.engine.ports import free_port

    picked: list[list[int]] = [[], []]
    go = threading.Barrier(2)

    def pick(out: list[int]) -> None:
        go.wait()
        taken: set[int] = set()  # each caller's own, as each head's launch has
        out.extend(free_port("127.0.0.1", taken) for _ in range(200))

    threads = [threading.Thread(target=pick, args=(out,)) for out in picked]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(picked[0]) == len(picked[1]) == 200
    assert not set(picked[0]) & set(picked[1])
