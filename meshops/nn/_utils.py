"""Conventions shared by every layer in :mod:`meshops.nn`.

Flat (PyG) form: ``x [N, C]``, ``pos [N, d]``, ``weight [N]``, ``batch [N]`` (sorted).
Cross forms take pairs ``(src, dst)`` for ``x``, ``pos`` and ``batch``; ``weight``
always belongs to the source (it is the quadrature rule of the integral).

Dense form: ``x [B, N, C]``, ``weight [B, N]``, ``mask [B, N]`` (True = real point).
Padding gets weight 0 and therefore ``log w = -inf``: a padded point contributes
nothing to any integral, which is also how samples of different sizes are kept
from attending to each other.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
from torch import Tensor

Pair = Tuple[Any, Any]


def as_pair(value: Any) -> Pair:
    """``(src, dst)`` from a pair or a single value used for both (self-attention)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"expected a (src, dst) pair, got {len(value)} items")
        return value[0], value[1]
    return value, value


def check_channels(channels: int, heads: int, name: str = "channels") -> None:
    """``channels`` must be positive and divisible by ``heads``."""
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    if channels < 1 or channels % heads:
        raise ValueError(f"{name}={channels} is not divisible by heads={heads}")


def safe_log(weight: Tensor) -> Tensor:
    """``log w`` with ``-inf`` at ``w = 0`` and a zero (not NaN) gradient there."""
    positive = weight > 0
    logw = torch.log(torch.where(positive, weight, torch.ones_like(weight)))
    return logw.masked_fill(~positive, float("-inf"))


def split_heads(x: Tensor, heads: int) -> Tensor:
    """``[B, N, H*D]`` to ``[B, H, N, D]``."""
    B, N, C = x.shape
    return x.view(B, N, heads, C // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``[B, H, N, D]`` to ``[B, N, H*D]``."""
    B, H, N, D = x.shape
    return x.transpose(1, 2).reshape(B, N, H * D)
