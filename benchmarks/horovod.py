"""Horovod's API on raydist against torch.distributed itself, on the same group.

On `local-cluster[2,1,2048]` (two executors, one core each), one
HorovodRunner(np=2) run on the session cluster (the default path) measures,
in both ranks at once:

* allreduce bandwidth, 1 MB to 64 MB: `hvd.allreduce(t)` (Horovod's default,
  an average into a new tensor) against raw `dist.all_reduce(t)` (a sum, in
  place) on the same gloo group, interleaved round by round, medians; and
  the floor of any out-of-place average on that group (one scaled copy into
  a buffer made beforehand, then the in-place sum), the same way;
* training: samples/s of a loop under `hvd.DistributedOptimizer` against the
  same model, data and seed under DDP, and whether both end at the same weights.

Last line:

  hvd_allreduce_ratio=<hvd/raw bandwidth, the median over sizes> hvd_train_ratio=<hvd/DDP samples/s>
  same_result=<true|false>

Targets: hvd_allreduce_ratio >= 0.95, hvd_train_ratio >= 0.9, same_result=true.

Run: .venv/bin/python benchmarks/horovod.py [--rounds 15] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES_MB = (1, 4, 16, 64)
BATCH, WIDTH = 256, 1024


def measure(rounds: int, steps: int) -> dict:
    import horovod.torch as hvd  # raydist.compat.horovod.torch, through the runner's alias
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

    hvd.init()
    torch.set_num_threads(1)
    out: dict = {"allreduce": {}}
    for mb in SIZES_MB:
        t = torch.ones(mb * 2**20 // 4)
        buf = torch.empty_like(t)
        times: dict[str, list[float]] = {"raw": [], "hvd": [], "floor": []}
        order = ["raw", "hvd", "floor"]
        for i in range(rounds + 2):
            # Both ranks start each op together; each round another goes first.
            for which in order[i % 3:] + order[:i % 3]:
                dist.barrier()
                start = time.perf_counter()
                if which == "raw":
                    dist.all_reduce(t)
                elif which == "hvd":
                    hvd.allreduce(t)
                else:  # the least an out-of-place average costs: one scaled copy, then the sum
                    torch.mul(t, 1.0 / hvd.size(), out=buf)
                    dist.all_reduce(buf)
                took = time.perf_counter() - start
                if i >= 2:  # the first rounds warm the group's buffers
                    times[which].append(took)
        out["allreduce"][mb] = tuple(statistics.median(times[k]) for k in order)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                                   torch.nn.ReLU(), torch.nn.Linear(WIDTH, 10))

    g = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, 10, (BATCH,), generator=g)

    def train(net: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[float, list[float]]:
        for i in range(steps + 2):
            if i == 2:
                dist.barrier()
                start = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        took = time.perf_counter() - start
        params = net.module.parameters() if isinstance(net, DDP) else net.parameters()
        return steps * BATCH * hvd.size() / took, [p.detach().double().sum().item() for p in params]

    ddp = DDP(model())
    ddp_rate, ddp_weights = train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01), named_parameters=net.named_parameters())
    hvd_rate, hvd_weights = train(net, opt)
    out["train"] = (ddp_rate, hvd_rate)
    out["same"] = all(abs(a - b) <= 1e-4 * max(1.0, abs(a)) for a, b in zip(ddp_weights, hvd_weights, strict=True))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--master", default="local-cluster[2,1,2048]")
    args = parser.parse_args()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from pyspark.sql import SparkSession

    from raydist.compat import HorovodRunner

    spark = SparkSession.builder.master(args.master).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        got = HorovodRunner(np=2).run(measure, rounds=args.rounds, steps=args.steps)
    finally:
        spark.stop()
    ratios, floors = [], []
    for mb, (raw, ours, floor) in sorted(got["allreduce"].items()):
        ratio = raw / ours  # bandwidth ratio: the same bytes over each time
        ratios.append(ratio)
        floors.append(raw / floor)
        print(f"allreduce {mb:>2} MB  raw {mb / raw:7.1f} MB/s  hvd {mb / ours:7.1f} MB/s  ratio {ratio:.3f}  "
              f"(out-of-place floor {mb / floor:7.1f} MB/s, {raw / floor:.3f} of raw)")
    print(f"out-of-place floor: {statistics.median(floors):.3f} of raw (hvd.allreduce returns a new tensor, "
          f"raw all_reduce sums in place); hvd/floor {statistics.median(ratios) / statistics.median(floors):.3f}")
    ddp_rate, hvd_rate = got["train"]
    print(f"training  DDP {ddp_rate:.0f} samples/s  hvd.DistributedOptimizer {hvd_rate:.0f} samples/s")
    print(f"hvd_allreduce_ratio={statistics.median(ratios):.3f} hvd_train_ratio={hvd_rate / ddp_rate:.3f} "
          f"same_result={'true' if got['same'] else 'false'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
