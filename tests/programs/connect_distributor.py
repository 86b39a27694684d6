"""A Spark user's TorchDistributor program on a Spark Connect session, with one
import changed (``--original``: pyspark's own class), run as a script by
tests/test_connect.py: two runs, then the user's own Spark work (raydist's:
then 75 s of waiting and a third run). Prints one RESULT line."""

import json
import sys
import time

from pyspark.sql import SparkSession

ORIGINAL = "--original" in sys.argv
if ORIGINAL:
    from pyspark.ml.torch.distributor import TorchDistributor
else:
    from raydist.compat import TorchDistributor

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()


def train(lr):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = x.sum(1, keepdim=True)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    loss = torch.nn.functional.mse_loss(model(x), y).item()
    dist.destroy_process_group()
    return round(loss, 6)


times, losses = [], []
d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
for lr in (0.05, 0.1):
    t = time.monotonic()
    losses.append(d.run(train, lr))
    times.append(round(time.monotonic() - t, 1))
total = spark.range(10).count()
if not ORIGINAL:
    # A minute and more of the user's own time: the session cluster retires
    # (15 s idle on Connect), past Ray's 60 s GCS timeout, which ends a
    # process still connected to a cluster that went; then another run.
    time.sleep(75)
    losses.append(d.run(train, 0.05))
spark.stop()
print("RESULT " + json.dumps({"losses": losses, "times": times, "count": total, "alive": True}))
