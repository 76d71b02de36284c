"""The base of the regressions that keep their training points (:class:`KernelRegression`)."""

from __future__ import annotations

import torch
from torch import nn


class KernelRegression(nn.Module):
    """A regression from ``D`` inputs to ``R`` outputs that is a weighted sum of a kernel
    centred at its ``S`` training points, which it stores (``inputs [S, D]``, float64).

    Args:
        num_points: Training points ``S`` (sizes the buffers, so a saved model loads).
        in_channels: ``D``.
        out_channels: ``R``.

    Shapes:
        forward: ``[T, D] -> [T, R]``
    """

    def __init__(self, num_points: int, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.out_channels = out_channels
        self.register_buffer("inputs", torch.zeros(num_points, in_channels, dtype=torch.float64))

    def extra_repr(self) -> str:
        s, d = self.inputs.shape
        return f"points={s}, in_channels={d}, out_channels={self.out_channels}"
