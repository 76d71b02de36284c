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

    The normaliser is scale-free: the floor on the standard deviation is relative,
    ``std >= eps * rms`` with ``rms = sqrt(mean^2 + std^2)`` the channel's root mean
    square, so a field of order 1e-20 is normalised exactly like the same field of
    order 1 (an absolute floor of 1e-6 would flatten it to nearly 0, and a target of
    order 1e-8 would be predicted 100 times too large). A channel that is 0
    everywhere gets ``std = 1``.

    Args:
        channels: Number of channels ``C``.
        eps: Relative floor on the standard deviation (a fraction of the channel's
            root mean square), so that a constant channel maps to 0 rather than
            dividing by 0, and variations below float32's resolution of the values
            (about 1e-7 of them) are not blown up to order 1.

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
        std = (s2 / total).sqrt()
        floor = self.eps * (mean ** 2 + std ** 2).sqrt()
        std = torch.where(floor > 0, torch.maximum(std, floor), torch.ones_like(std))
        self.mean.copy_(mean)
        self.std.copy_(std)
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


def encode_inputs(model: nn.Module, x: Tensor) -> Tensor:
    """``x [N, C_in]`` in the units ``model`` computes in: its ``input_normalizer``
    applied, or ``x`` itself when it has none or there are no input channels."""
    norm = getattr(model, "input_normalizer", None)
    return norm.encode(x) if norm is not None and x.shape[-1] else x


def decode_outputs(model: nn.Module, y: Tensor) -> Tensor:
    """``model``'s outputs ``[M, C_out]`` in physical units: its ``output_normalizer``
    inverted, or ``y`` itself when it has none."""
    norm = getattr(model, "output_normalizer", None)
    return norm.decode(y) if norm is not None else y
