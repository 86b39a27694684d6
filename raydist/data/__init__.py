"""Spark DataFrames into Ray Data and back, in memory, with no files between.

raydist's Ray nodes live inside the executors that hold a DataFrame's
partitions. :func:`from_spark` has each Spark task stream its partition as
Arrow to a block agent on its own host's Ray node (``raydist.data._agent``),
which puts it into that node's object store; the Dataset then reads those
blocks, in partition order. :func:`to_spark` does the reverse. The usual way
off Databricks (``df.write.parquet`` then ``ray.data.read_parquet``) writes
every row to storage and reads it back.

Both need this process connected to the cluster (``ray.init``), as after
``raydist.up()`` (which exports ``RAY_ADDRESS``) or ``cluster.connect()``;
``cluster=`` connects for you.
"""

from __future__ import annotations

import functools
import os
import secrets
import uuid
from typing import Any

from raydist.data._agent import AGENT_NAMESPACE, BlockAgent, fetch_blocks, send_partitions
from raydist.engine.connection import process_ray
from raydist.engine.spark.sides import side_of
from raydist.errors import DataFormatError, SpecError

__all__ = ["from_spark", "to_spark"]


def from_spark(df: Any, cluster: Any = None) -> Any:
    """A ``ray.data.Dataset`` with ``df``'s rows, in ``df``'s order.

    Args:
        df: a Spark DataFrame whose columns Arrow can hold (a column that
            cannot is named in a DataFormatError before anything runs).
        cluster: the raydist cluster to put the blocks in (a handle from
            ``raydist.up``); by default the Ray cluster this process is
            connected to, or ``RAY_ADDRESS``.

    On the session cluster (after a training run), the handoff is use: the
    cluster's idle time counts from its end, and the Dataset lives as long
    as the cluster does.
    """
    with process_ray().using():
        return _from_spark(df, cluster)


def _from_spark(df: Any, cluster: Any) -> Any:
    import pyarrow as pa
    import ray

    _connect(cluster)
    schema = arrow_schema(df)
    _check_free_slot(df.sparkSession)
    agents = _agents()
    job, secret = uuid.uuid4().hex, secrets.token_hex(16)
    ray.get([agent.expect.remote(job, secret, _max_part_bytes()) for agent in agents.values()])
    addresses = {ip: (ip, port) for ip, (_, port) in _ports(agents).items()}
    driver_host = side_of(df.sparkSession).driver_host()
    body = functools.partial(send_partitions, job, secret, addresses, driver_host, schema.serialize().to_pybytes())
    try:
        reported = {int(r["part"]): int(r["rows"]) for r in df.mapInArrow(body, "part int, rows long").collect()}
    finally:
        taken = ray.get([agent.take.remote(job) for agent in agents.values()])
    parts: dict[int, tuple[Any, int]] = {}
    errors: list[str] = []
    for got, errs in taken:
        # The plan is what the Spark tasks reported: a part none of them sent
        # (or of other rows) came from elsewhere, and is left out.
        parts.update({part: got[part] for part in got if reported.get(part) == got[part][1]})
        errors += errs
    if errors:
        raise RuntimeError(f"Ray nodes could not take {len(errors)} partition(s): {errors[0]}")
    if parts.keys() != reported.keys():
        missing = sorted(reported.keys() - parts.keys())
        raise RuntimeError(f"Ray nodes did not take partition(s) {missing[:5]} that Spark sent; see the driver's log")
    if not parts:
        return ray.data.from_arrow(pa.Table.from_batches([], schema))
    return ray.data.from_arrow_refs([parts[i][0] for i in sorted(parts)])


def _max_part_bytes() -> int:
    """RAYDIST_MAX_PART_BYTES, else the agents' default."""
    value = os.environ.get("RAYDIST_MAX_PART_BYTES", "")
    if not value:
        return 0
    if not value.isdigit() or int(value) < 1:
        raise SpecError("RAYDIST_MAX_PART_BYTES", value, "a whole number of bytes (the most one partition may send)")
    return int(value)


def to_spark(ds: Any, spark: Any) -> Any:
    """A Spark DataFrame with ``ds``'s rows, in order, materialized in
    Spark's executors (cached) before it returns, so the Dataset may go."""
    with process_ray().using():
        return _to_spark(ds, spark)


def _to_spark(ds: Any, spark: Any) -> Any:
    import ray
    from pyspark.sql.pandas.types import from_arrow_schema

    _check_free_slot(spark)
    refs = ds.to_arrow_refs()
    if not refs:
        return spark.createDataFrame([], from_arrow_schema(ds.schema().base_schema))
    agents = _agents()
    ports = _ports(agents)
    where = _holders(refs, agents)
    job, secret = uuid.uuid4().hex, secrets.token_hex(16)
    by_agent: dict[str, dict[int, Any]] = {}
    for i, ref in enumerate(refs):
        by_agent.setdefault(where[i], {})[i] = ref
    ray.get([agents[ip].offer.remote(job, secret, blocks) for ip, blocks in by_agent.items()])
    holders = {i: (where[i], ports[where[i]][1]) for i in range(len(refs))}
    schema = ray.get(refs[0]).schema
    body = functools.partial(fetch_blocks, job, secret, holders)
    try:
        out = spark.range(len(refs), numPartitions=len(refs)).mapInArrow(body, from_arrow_schema(schema))
        out = out.persist()
        out.count()  # materialized in Spark now: the blocks may go
    finally:
        ray.get([agents[ip].drop.remote(job) for ip in by_agent])
    return out


def arrow_schema(df: Any) -> Any:
    """``df``'s schema as Arrow, or DataFormatError naming the first column
    Arrow cannot hold."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    tz = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    try:
        return to_arrow_schema(df.schema, timezone=tz)
    except Exception as first:  # noqa: BLE001 - find the column to name
        for field in df.schema.fields:
            try:
                to_arrow_schema(StructType([field]), timezone=tz)
            except Exception as exc:  # noqa: BLE001
                detail = (str(exc).strip().splitlines() or [""])[0]
                raise DataFormatError(field.name, field.dataType.simpleString(), detail) from None
        raise DataFormatError("?", "?", str(first)) from None


# ------------------------------------------------------------------ internals


def _check_free_slot(spark: Any) -> None:
    """The handoff is a Spark job: refuse at once, saying why, when Ray nodes
    (long-running tasks) hold every task slot, instead of waiting forever."""
    from raydist.engine.spark import session as spark_side
    from raydist.errors import CapacityError

    cap = spark_side.capacity(spark, wait_s=0)
    if cap.dynamic or cap.executors <= 0:
        return
    busy = side_of(spark).running_tasks()
    if busy is None:
        return  # Spark Connect shows no running tasks: the job itself will say, or wait
    total = cap.executors * cap.cores_per_executor
    if busy >= total:
        raise CapacityError(
            "a free task slot for the handoff's Spark job",
            f"running tasks (Ray nodes among them) hold all {total} of the application's task slots",
            "leave Spark a slot: fewer or smaller worker nodes (cpus_per_worker below spark.executor.cores), "
            "or an elastic cluster (min_workers < max_workers) whose idle nodes give theirs back",
        )


def _connect(cluster: Any) -> None:
    import ray

    from raydist.engine.connection import connected_address, process_ray, same_address

    if cluster is not None:
        current = connected_address()
        if current is not None and not same_address(current, cluster.address):
            process_ray().disconnect()  # the data goes to the cluster named
        cluster.connect()
    elif not ray.is_initialized():
        ray.init()  # RAY_ADDRESS (raydist.up exports it), or a ValueError saying there is no cluster


def _agents() -> dict[str, Any]:
    """One block agent per host of the cluster (by node address), created on first use."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_concurrency=64)(BlockAgent)
    agents = {}
    # One per host: a worker node's when the host has one (the head keeps its memory for itself).
    by_host: dict[str, Any] = {}
    for node in sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: n["Resources"].get("CPU", 0) > 0):
        by_host[node["NodeManagerAddress"]] = node
    for node in by_host.values():
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        agents[node["NodeManagerAddress"]] = remote.options(
            name=f"raydist-blocks-{node['NodeID'][:16]}", namespace=AGENT_NAMESPACE, lifetime="detached",
            get_if_exists=True, scheduling_strategy=strategy,
        ).remote()
    return agents


def _ports(agents: dict[str, Any]) -> dict[str, tuple[Any, int]]:
    import ray

    ports = ray.get([agent.open.remote(ip) for ip, agent in agents.items()])
    return {ip: (agent, port) for (ip, agent), port in zip(agents.items(), ports, strict=True)}


def _holders(refs: list[Any], agents: dict[str, Any]) -> list[str]:
    """For each block, the address of a node that holds it (an agent's)."""
    import ray

    locations = ray.experimental.get_object_locations(refs)
    node_ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    fallback = sorted(agents)[0]
    out = []
    for ref in refs:
        ips = [node_ip.get(node) for node in locations.get(ref, {}).get("node_ids", [])]
        out.append(next((ip for ip in ips if ip in agents), fallback))
    return out
