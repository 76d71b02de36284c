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

    An output normaliser may also **scale by a global input** (``scale_by``, an input
    channel constant over each mesh, such as a load): it is fitted on the targets
    divided by that input, and the model's outputs are multiplied by it in physical
    units (:func:`decode_outputs` with :func:`output_scale`). Where the answer is
    proportional to the load (linear elasticity, a linear heat source), the network
    then learns the answer per unit load, which no longer depends on it.

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
        # the input channel the outputs are proportional to, -1 for none: a buffer to
        # travel with checkpoints, and a Python int that tracing reads as a constant
        self.register_buffer("scale_by", torch.tensor(-1))
        self.scale_channel = -1

    def set_scale_by(self, channel: int) -> "UnitGaussianNormalizer":
        """Scale the outputs by input channel ``channel`` (-1: by none)."""
        self.scale_by.fill_(int(channel))
        self.scale_channel = int(channel)
        return self

    @staticmethod
    def complete_state(state_dict: dict, prefix: str) -> None:
        """Give a normaliser's entries saved before ``scale_by`` existed (under
        ``prefix``) the ``scale_by`` of one that scales by nothing."""
        if prefix + "mean" in state_dict:
            state_dict.setdefault(prefix + "scale_by", torch.tensor(-1))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.complete_state(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.scale_channel = int(state_dict[prefix + "scale_by"])

    @torch.no_grad()
    def fit(self, samples, key: str) -> "UnitGaussianNormalizer":
        """Fit on an iterable of ``MeshData`` (the training split), using ``sample[key]``
        (divided by the sample's input channel ``scale_by`` when that is set).

        Two passes in float64 (mean, then variance) so that large offsets do not
        cancel catastrophically.
        """
        samples = [self._per_unit(s, key) for s in samples]
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

    def _per_unit(self, sample, key: str):
        k = self.scale_channel
        if k < 0:
            return sample
        c = sample.x[:, k].to(torch.float64)  # constant over the mesh
        if not bool((c != 0).all()):
            raise ValueError(f"sample {getattr(sample, 'source', '') or '?'}: the outputs "
                             f"scale by input channel {k}, which is 0 there")
        out = sample.clone()
        out[key] = sample[key].to(torch.float64) / c.mean()
        return out

    def forward(self, x: Tensor) -> Tensor:
        return self.encode(x)

    def encode(self, x: Tensor) -> Tensor:
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def decode(self, x: Tensor) -> Tensor:
        return x * self.std.to(x.dtype) + self.mean.to(x.dtype)

    def extra_repr(self) -> str:
        scale = f", scale_by={self.scale_channel}" if self.scale_channel >= 0 else ""
        return f"{self.channels}, fitted={bool(self.fitted)}{scale}"


def encode_inputs(model: nn.Module, x: Tensor) -> Tensor:
    """``x [N, C_in]`` in the units ``model`` computes in: its ``input_normalizer``
    applied, or ``x`` itself when it has none or there are no input channels."""
    norm = getattr(model, "input_normalizer", None)
    return norm.encode(x) if norm is not None and x.shape[-1] else x


def output_scale(model: nn.Module, x: Tensor, rows: int, batch: Tensor | None = None,
                 out_batch: Tensor | None = None) -> Tensor | None:
    """What ``model``'s outputs are multiplied by in physical units, at each of its
    ``rows`` output rows: the raw input channel its output normaliser scales by
    (``scale_by``), ``None`` when it scales by none.

    The channel is constant over each mesh: outputs at other points than the inputs'
    (query points) take their sample's value (``batch``: the sample of each input row,
    ``out_batch``: of each output row); without them, outputs at the input's points take
    it point by point, and other outputs are those of one sample.

    Shapes:
        x ``[N, C_in]`` (raw, before :func:`encode_inputs`) -> ``[rows, 1]`` or ``None``
    """
    norm = getattr(model, "output_normalizer", None)
    k = -1 if norm is None else norm.scale_channel
    if k < 0:
        return None
    c = x[:, k]
    if batch is not None and out_batch is not None:
        from torch_geometric.utils import scatter

        return scatter(c, batch, dim=0, reduce="mean")[out_batch][:, None]
    if rows == c.shape[0]:
        return c[:, None]
    return c[:1].expand(rows)[:, None]


def decode_outputs(model: nn.Module, y: Tensor, scale: Tensor | None = None) -> Tensor:
    """``model``'s outputs ``[M, C_out]`` in physical units: its ``output_normalizer``
    inverted (``y`` itself when it has none), times ``scale`` (:func:`output_scale`)."""
    norm = getattr(model, "output_normalizer", None)
    y = norm.decode(y) if norm is not None else y
    return y if scale is None else y * scale.to(y.dtype)
