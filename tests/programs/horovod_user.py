"""A Horovod user's PyTorch program, written as Horovod's examples write it,
with only the runner's import changed; run as a script by
tests/test_horovod.py. Inside the training functions ``import horovod.torch
as hvd`` is unchanged: the runners resolve it to raydist.compat.horovod. It
prints one JSON line of what a user would check."""

import json

import torch
import torch.nn.functional as F  # noqa: N812 - as Horovod's examples import it
from pyspark.sql import SparkSession

import raydist.compat.horovod.spark as horovod_spark  # was: import horovod.spark as horovod_spark
from raydist.compat import HorovodRunner  # was: from sparkdl import HorovodRunner

spark = SparkSession.builder.master("local-cluster[2,1,2048]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")

BATCH, STEPS, LR = 32, 3, 0.05


def make_net(sync_bn):
    """MNIST's shape: a conv net over 1x28x28 images, ten classes."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, 5, stride=3)
            self.bn = sync_bn(4)
            self.fc = torch.nn.Linear(4 * 8 * 8, 10)

        def forward(self, x):
            x = F.relu(self.bn(self.conv(x)))
            return F.log_softmax(self.fc(x.flatten(1)), dim=1)

    return Net()


def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def checksum(model):
    """Each parameter's sum and sum of squares (a softmax layer's sum alone never moves)."""
    return [round(v, 5) for p in model.parameters() for v in (p.detach().double().sum().item(),
                                                                 p.detach().double().pow(2).sum().item())]


def train_mnist(backward_passes_per_step=1):
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(hvd.rank())  # every rank starts from different weights...
    # Batch norm over the global batch; none where each rank's batch goes in two passes.
    model = make_net(hvd.SyncBatchNorm if backward_passes_per_step == 1 else torch.nn.Identity)
    before = checksum(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=backward_passes_per_step)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # ...and rank 0's win
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    x, y = data()
    shard = slice(hvd.rank(), None, hvd.size())
    x, y = x[shard], y[shard]
    for _ in range(STEPS):
        optimizer.zero_grad()
        if backward_passes_per_step == 1:
            F.nll_loss(model(x), y).backward()
        else:
            half = len(x) // 2
            for part in (slice(0, half), slice(half, None)):
                F.nll_loss(model(x[part]), y[part], reduction="sum").backward()
        optimizer.step()
    return {"rank": hvd.rank(), "size": hvd.size(), "before": before, "after": checksum(model)}


def reference(sum_loss=False):
    """The same training in one process on the whole batch."""
    torch.manual_seed(0)
    model = make_net(torch.nn.Identity if sum_loss else torch.nn.BatchNorm2d)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    x, y = data()
    for _ in range(STEPS):
        optimizer.zero_grad()
        # Horovod's backward_passes_per_step sums each rank's passes, then averages over ranks.
        loss = F.nll_loss(model(x), y, reduction="sum") / 2 if sum_loss else F.nll_loss(model(x), y)
        loss.backward()
        optimizer.step()
    return checksum(model)


def collectives():
    import horovod.torch as hvd

    hvd.init()
    me = hvd.rank()
    out = {
        "allgather": hvd.allgather(torch.arange(me + 1.0)).tolist(),  # unequal first dimensions
        "allreduce_sum": hvd.allreduce(torch.tensor([me + 1.0]), op=hvd.Sum).item(),
        "allreduce_avg": hvd.allreduce(torch.tensor([me + 1.0])).item(),
        "broadcast": hvd.broadcast(torch.tensor([me * 7.0]), root_rank=1).item(),
        "objects": hvd.allgather_object({"rank": me}),
    }
    # Outputs big enough to be recycled: one still held, or a view of one,
    # keeps its values through later allreduces.
    big = torch.full((1 << 19,), me + 1.0)
    first = hvd.allreduce(big)
    view = hvd.allreduce(big * 3)[:4]
    for _ in range(3):
        hvd.allreduce(big * 5)
    out["held"] = [first[:2].tolist(), view.tolist()]
    try:
        hvd.allreduce(torch.ones(1), op=hvd.Adasum)
    except NotImplementedError as e:
        out["adasum"] = str(e)
    try:
        import horovod.mxnet  # noqa: F401
    except ImportError as e:
        out["mxnet_import"] = str(e)
    hvd.shutdown()
    return out


def fails():
    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 could not read its shard")
    hvd.barrier()
    return "unreachable"


def caught(run):
    try:
        run()
    except Exception as e:  # noqa: BLE001 - what the caller sees
        return f"{type(e).__name__}: {e}"
    return None


out = {
    "reference": reference(),
    "reference_doubled": reference(sum_loss=True),
    "local": HorovodRunner(np=-2).run(train_mnist),
    "cluster": HorovodRunner(np=2).run(train_mnist),
    "every_rank": horovod_spark.run(train_mnist, num_proc=2),
    "passes": HorovodRunner(np=-2).run(train_mnist, backward_passes_per_step=2),
    "collectives": horovod_spark.run(collectives, num_proc=2),
    "error_local": caught(lambda: HorovodRunner(np=-2).run(fails)),
    "error_cluster": caught(lambda: HorovodRunner(np=2).run(fails)),
}
spark.stop()
print("RESULT " + json.dumps(out), flush=True)
