"""Per-channel normalisation of fields, fitted on the training split only.

Here rather than in :mod:`meshops.training`: models carry their normalisers (they are
saved in checkpoints), so :mod:`meshops.models` needs this class without the trainer.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class UnitGaussianNormalizer(nn.Module):
    """``(x - mean) / std`` per channel, with quadrature-weighted statistics.

    The mean and variance are integrals over the domain (``sum_i w_i x_i / sum_i w_i``),
    so they do not depend on how densely a region happens to be sampled. The
    statistics are buffers: they travel with ``state_dict`` and so with checkpoints.

    Args:
        channels: Number of channels ``C``.
        eps: Floor on the standard deviation, so a constant channel maps to 0.

    Shapes:
        x ``[N, C]`` -> ``[N, C]``
    """

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.channels, self.eps = channels, eps
        self.register_buffer("mean", torch.zeros(channels))
        self.register_buffer("std", torch.ones(channels))
        self.register_buffer("fitted", torch.tensor(False))

    @torch.no_grad()
    def fit(self, samples, key: str) -> "UnitGaussianNormalizer":
        """Fit on an iterable of ``MeshData`` (the training split), using ``sample[key]``.

        Two passes in float64 (mean, then variance) so that large offsets do not
        cancel catastrophically.
        """
        total = torch.zeros((), dtype=torch.float64)
        s1 = torch.zeros(self.channels, dtype=torch.float64)
        for data in samples:
            x, w = data[key].to(torch.float64), data.weight.to(torch.float64)
            s1 += (w[:, None] * x).sum(0)
            total += w.sum()
        if total <= 0:
            raise ValueError(f"cannot fit a normaliser on {key!r}: no samples or zero weights")
        mean = s1 / total
        s2 = torch.zeros(self.channels, dtype=torch.float64)
        for data in samples:
            x, w = data[key].to(torch.float64), data.weight.to(torch.float64)
            s2 += (w[:, None] * (x - mean) ** 2).sum(0)
        self.mean.copy_(mean)
        self.std.copy_((s2 / total).sqrt().clamp_min(self.eps))
        self.fitted.fill_(True)
        return self

    def forward(self, x: Tensor) -> Tensor:
        return self.encode(x)

    def encode(self, x: Tensor) -> Tensor:
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def decode(self, x: Tensor) -> Tensor:
        return x * self.std.to(x.dtype) + self.mean.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.channels}, fitted={bool(self.fitted)}"
