"""Horovod's ``SyncBatchNorm``: batch statistics over every rank's batch.

``torch.nn.SyncBatchNorm`` runs on CUDA only; this one runs wherever the
process group does (gloo on CPU too). In training, each rank's per-channel
sum, sum of squares and count are allreduced (with their gradient), so the
normalisation and the running statistics are those of the whole global batch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SyncBatchNorm"]  # noqa: F822 - made on first use (it subclasses torch.nn)


def _make() -> Any:
    import torch
    import torch.distributed as dist

    class _SumOverRanks(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: Any) -> Any:
            out = t.clone()
            dist.all_reduce(out)
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            out = grad.clone()
            dist.all_reduce(out)
            return out

    class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
        """Batch normalisation over the global batch (any input of 2 or more dimensions)."""

        def _check_input_dim(self, input: Any) -> None:
            if input.dim() < 2:
                raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

        def forward(self, input: Any) -> Any:
            self._check_input_dim(input)
            if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
                return super().forward(input)
            dims = [0, *range(2, input.dim())]
            count = torch.tensor([input.numel() / input.shape[1]], dtype=input.dtype, device=input.device)
            stats = torch.cat([input.sum(dims), (input * input).sum(dims), count])
            stats = _SumOverRanks.apply(stats)
            channels = input.shape[1]
            total = stats[-1]
            mean = stats[:channels] / total
            var = stats[channels:2 * channels] / total - mean * mean
            if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
                with torch.no_grad():
                    self.num_batches_tracked += 1
                    momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                                else self.momentum)
                    unbiased = var * total / max(float(total) - 1.0, 1.0)
                    self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                    self.running_var.mul_(1 - momentum).add_(unbiased.detach() * momentum)
            shape = [1, channels] + [1] * (input.dim() - 2)
            out = (input - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
            if self.affine:
                out = out * self.weight.view(shape) + self.bias.view(shape)
            return out

    return SyncBatchNorm


_cls: Any = None


def __getattr__(name: str) -> Any:
    global _cls
    if name == "SyncBatchNorm":
        if _cls is None:
            _cls = _make()
        return _cls
    raise AttributeError(name)
