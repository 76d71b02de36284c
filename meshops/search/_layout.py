"""Helpers shared by the backends: PyG edge layout, chunking and locality order."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch import Tensor

#: Largest number of distance entries (or neighbour slots) held at once by one chunk:
#: 2**24 float64 entries are 128 MiB, which bounds memory independently of N and M.
CHUNK_ENTRIES = 2 ** 24


def chunks(m: int, width: int) -> Iterator[slice]:
    """Row slices of ``[0, m)`` with at most :data:`CHUNK_ENTRIES` ``// width`` rows."""
    step = max(1, CHUNK_ENTRIES // max(width, 1))
    for start in range(0, m, step):
        yield slice(start, min(m, start + step))


def neighbours_to_edges(nbr: Tensor, off_y: int, off_x: int) -> Tensor:
    """``[m, K]`` local x indices (``-1`` = no neighbour) -> ``[2, E]`` global edges.

    Row 0 is the y index, row 1 the x index; rows stay in y order and, within one y,
    in the column order of ``nbr`` (increasing distance).
    """
    m, k = nbr.shape
    rows = torch.arange(off_y, off_y + m, device=nbr.device)
    if k == 0 or m == 0:
        return torch.empty(2, 0, dtype=torch.long, device=nbr.device)
    valid = nbr >= 0
    if bool(valid.all()):
        return torch.stack([rows.repeat_interleave(k), nbr.reshape(-1) + off_x])
    return torch.stack([rows[:, None].expand(m, k)[valid], nbr[valid] + off_x])


def cat_edges(parts: list[Tensor], device: torch.device) -> Tensor:
    """Concatenate per-sample ``[2, E_b]`` edge tensors (``[2, 0]`` when none)."""
    if not parts:
        return torch.empty(2, 0, dtype=torch.long, device=device)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _spread_bits(v: np.ndarray, dims: int) -> np.ndarray:
    """Interleave the low bits of ``v`` with ``dims - 1`` zero bits (Morton codes)."""
    v = v.astype(np.uint64)
    if dims == 2:  # 32 bits per coordinate
        masks = [(16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF), (4, 0x0F0F0F0F0F0F0F0F),
                 (2, 0x3333333333333333), (1, 0x5555555555555555)]
        v &= np.uint64(0xFFFFFFFF)
    else:  # dims == 3: 21 bits per coordinate
        masks = [(32, 0x1F00000000FFFF), (16, 0x1F0000FF0000FF), (8, 0x100F00F00F00F00F),
                 (4, 0x10C30C30C30C30C3), (2, 0x1249249249249249)]
        v &= np.uint64(0x1FFFFF)
    for shift, mask in masks:
        v = (v | (v << np.uint64(shift))) & np.uint64(mask)
    return v


def locality_order(p: np.ndarray) -> np.ndarray:
    """Permutation that sorts points ``[m, d]`` along a Morton (Z-order) curve.

    Queries issued in this order hit the same tree nodes consecutively, which makes
    cKDTree queries on large random clouds faster (cache locality); results do not
    depend on it. For ``d > 3`` the three widest coordinates are used.
    """
    m, d = p.shape
    lo = p.min(axis=0)
    ext = p.max(axis=0) - lo
    if d == 1:
        return np.argsort(p[:, 0], kind="stable")
    axes = np.argsort(-ext, kind="stable")[: min(d, 3)]
    dims = len(axes)
    bits = 32 if dims == 2 else 21
    scale = np.where(ext[axes] > 0, (2.0 ** bits - 1) / np.where(ext[axes] > 0, ext[axes], 1), 0)
    code = np.zeros(m, dtype=np.uint64)
    for j, a in enumerate(axes):
        q = ((p[:, a] - lo[a]) * scale[j]).astype(np.uint64)
        code |= _spread_bits(q, dims) << np.uint64(j)
    return np.argsort(code)
