"""A Connect client on a host that nobody can dial (a laptop behind NAT, a
notebook sandbox), run by tests/test_connect.py in a network namespace of its
own: ``raydist.up`` on the remote session, Ray work through Ray Client
(``ray://``, the way any off-cluster Ray client connects), ``down()``, then
TorchDistributor runs on the session cluster and the user's own Spark work.
While it runs, a watcher records every TCP socket of this host that listens
on, or was accepted at, an address other than loopback: a cluster that dials
its client would need one. Prints one RESULT line."""

import json
import sys
import threading
import time

import psutil
import ray
from _ray_client import init_through_ray_client
from pyspark.sql import SparkSession

import raydist


def _outward(addr: object) -> bool:
    return bool(addr) and not str(addr.ip).startswith("127.")  # type: ignore[attr-defined]


seen: dict[str, list[str]] = {"listening": [], "accepted": []}
done = threading.Event()


def watch() -> None:
    """This namespace's TCP sockets (``/proc/net`` is per namespace), every 0.2 s."""
    while not done.wait(0.2):
        conns = psutil.net_connections(kind="tcp")
        listening = {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
        for c in conns:
            if c.status == psutil.CONN_LISTEN and (_outward(c.laddr) or str(c.laddr.ip) in ("0.0.0.0", "::")):
                seen["listening"].append(f"{c.laddr.ip}:{c.laddr.port} pid {c.pid}")
            elif c.raddr and _outward(c.raddr) and c.laddr.port in listening:
                seen["accepted"].append(f"{c.raddr.ip} -> {c.laddr.port} pid {c.pid}")


watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
t0 = time.monotonic()
cluster = raydist.up(spark, workers=1, cpus_per_worker=1)
ready_s = time.monotonic() - t0
status = cluster.status()

init_through_ray_client(cluster.client_address)  # the token comes from the environment raydist.up set


@ray.remote(num_cpus=1)
def where(x: int) -> tuple[int, str]:
    import socket

    return x * x, socket.gethostbyname(socket.gethostname())


answers = ray.get([where.remote(i) for i in range(4)])
ray.shutdown()
cluster.down()


def train(lr, ddp=True):
    import torch
    import torch.distributed as dist

    if ddp:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    loss = torch.nn.functional.mse_loss(model(x), y).item()
    if ddp:
        dist.destroy_process_group()
    return loss


# Spark's own distributor contract, on the session cluster, from this host
# (the session connects through Ray Client: no node runs here).
from raydist.compat import TorchDistributor  # noqa: E402

distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
losses = [distributor.run(train, lr) for lr in (0.05, 0.1)]
alone = [train(lr, ddp=False) for lr in (0.05, 0.1)]  # averaged gradients of equal halves: the full batch's
total = spark.range(100, numPartitions=2).selectExpr("sum(id) as s").collect()[0]["s"]
spark.stop()
done.set()
watcher.join()
print("RESULT " + json.dumps({
    "ready_s": round(ready_s, 1), "state": status.state.value, "address": cluster.address,
    "workers_up": sum(n.up for n in status.nodes if n.key != "head"),
    "squares": [a[0] for a in answers], "events": [e for _, e in cluster.events()],
    "spark_sum": total, "losses": losses, "alone": alone,
    "listening": sorted(set(seen["listening"])), "accepted": sorted(set(seen["accepted"])),
}))
