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


def checking() -> bool:
    """Whether value checks run: always in eager mode, never while ``torch.compile``
    traces.  A check that reads a tensor value is a host synchronisation and a graph
    break; compiled forwards trust the values of their inputs (eager calls check them)."""
    return not torch.compiler.is_compiling()


def check_weight(weight: Tensor, num_points: int, name: str = "weight") -> Tensor:
    """Validate quadrature weights: shape ``[N]``, finite and non-negative (the values
    only in eager mode, see :func:`checking`).

    Raises:
        ValueError: naming the problem and the first offending index.
    """
    if not isinstance(weight, Tensor):
        raise ValueError(f"{name} must be a tensor of quadrature weights, got {type(weight)}")
    if weight.dim() != 1 or weight.shape[0] != num_points:
        raise ValueError(f"{name} has shape {tuple(weight.shape)} but the source has "
                         f"{num_points} points (expected [{num_points}])")
    if checking():
        _check_values(weight, name)
    return weight


def _check_values(weight: Tensor, name: str) -> None:
    # One fused reduction on the hot path; the index is only looked up on failure.
    if not bool(torch.isfinite(weight).all() & (weight >= 0).all()):
        bad = ~(torch.isfinite(weight) & (weight >= 0))
        i = int(bad.flatten().nonzero()[0])
        raise ValueError(f"{name} must be finite and non-negative; entry {i} is "
                         f"{weight.flatten()[i].item()}")


def check_length(t: Tensor | None, n: int, name: str) -> None:
    """``t`` (if given) must have ``n`` rows."""
    if t is not None and t.shape[0] != n:
        raise ValueError(f"{name} has {t.shape[0]} rows, expected {n}")


def num_graphs(*batches: Tensor | None) -> int:
    """Number of samples implied by (possibly several) batch vectors."""
    sizes = [int(b.max()) + 1 for b in batches if b is not None and b.numel()]
    return max(sizes, default=1)


def safe_log(weight: Tensor) -> Tensor:
    """``log w`` with ``-inf`` at ``w = 0`` and a zero (not NaN) gradient there."""
    positive = weight > 0
    logw = torch.log(torch.where(positive, weight, torch.ones_like(weight)))
    return logw.masked_fill(~positive, float("-inf"))


def check_batch(batch: Tensor | None, name: str) -> None:
    """A PyG batch vector must be 1-D and sorted (samples contiguous; the order is
    checked in eager mode only, see :func:`checking`)."""
    if batch is None:
        return
    if batch.dim() != 1:
        raise ValueError(f"{name} must be a 1-D vector of sample indices, got shape "
                         f"{tuple(batch.shape)}")
    if checking() and batch.numel() > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError(f"{name} must be sorted (PyG batch vector)")


def split_heads(x: Tensor, heads: int) -> Tensor:
    """``[B, N, H*D]`` to ``[B, H, N, D]``."""
    B, N, C = x.shape
    return x.view(B, N, heads, C // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``[B, H, N, D]`` to ``[B, N, H*D]``."""
    B, H, N, D = x.shape
    return x.transpose(1, 2).reshape(B, N, H * D)
