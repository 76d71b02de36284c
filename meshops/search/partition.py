"""Spatial partitions of point clouds into parts (patches), batch-aware.

Implemented once, in numpy on the CPU (``"kd"``, ``"voxel"``) or with the search
backends (``"kmeans"``); the ids come back on the device of ``pos``.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from meshops.errors import MeshError
from meshops.utils.checks import check_batch, check_int, check_pos, num_samples, sample_ptr

METHODS = ("kd", "voxel", "kmeans")


def kd_parts(p: np.ndarray, num_parts: int) -> np.ndarray:
    """Balanced recursive coordinate bisection of one sample.

    Each node with ``P`` parts is split along the axis of its widest extent into
    ``P // 2`` and ``P - P // 2`` parts, at the rank that gives every final part
    ``floor(n / P)`` or ``ceil(n / P)`` points. Part ids follow the tree left to right,
    so consecutive ids are spatial neighbours.

    Args:
        p: Points ``[n, d]`` with ``n >= num_parts``.
        num_parts: ``P >= 1`` (any integer, not only powers of two).

    Returns:
        Local part ids ``[n]`` in ``0 .. P - 1``.
    """
    n = len(p)
    # [d, n] rows: reductions and gathers along contiguous rows are ~30x faster than
    # along axis 0 of an [n, d] array.
    rows = np.ascontiguousarray(p.T)
    ids = np.empty(n, dtype=np.int64)
    stack = [(np.arange(n), num_parts, 0)]
    while stack:
        idx, parts, first = stack.pop()
        if parts == 1:
            ids[idx] = first
            continue
        sub = np.take(rows, idx, axis=1)
        axis = int(np.argmax(sub.max(axis=1) - sub.min(axis=1)))
        p_left = parts // 2
        q, rem = divmod(len(idx), parts)
        # The `rem` parts of size q + 1 are shared in proportion to the part counts;
        # rem_left <= p_left and rem - rem_left <= parts - p_left always hold.
        n_left = q * p_left + rem * p_left // parts
        order = np.argpartition(sub[axis], n_left - 1)
        stack.append((idx[order[n_left:]], parts - p_left, first + p_left))
        stack.append((idx[order[:n_left]], p_left, first))
    return ids


def voxel_grid_shape(extent: np.ndarray, num_parts: int) -> np.ndarray:
    """Cells per axis of the ``"voxel"`` grid for a bounding box of size ``extent``.

    The grid has at most ``num_parts`` cells and, among such grids, about as many as
    possible with cells as close to cubes as the integer counts allow: start from
    ``extent / s`` cells per axis with ``s = (volume / num_parts) ** (1 / d)``, then
    refine the axis with the longest cells while the total stays ``<= num_parts``.
    Axes of zero extent get one cell.

    Args:
        extent: ``[d]`` non-negative box side lengths.
        num_parts: Target (maximum) number of cells.

    Returns:
        ``[d]`` int64 cell counts, product ``<= num_parts``.
    """
    extent = np.asarray(extent, dtype=np.float64)
    shape = np.ones(len(extent), dtype=np.int64)
    active = extent > 1e-12 * max(float(extent.max(initial=0.0)), 1e-300)
    if num_parts == 1 or not active.any():
        return shape
    ext = extent[active]
    s = (math.prod(ext.tolist()) / num_parts) ** (1.0 / len(ext))
    cells = np.maximum(1, np.floor(ext / s)).astype(np.int64)
    # floor() can still overshoot when thin axes were raised to one cell.
    while math.prod(cells.tolist()) > num_parts:
        finest = np.where(cells > 1, ext / cells, np.inf)
        cells[int(np.argmin(finest))] -= 1
    while True:
        total = math.prod(cells.tolist())
        size = ext / cells
        grow = [i for i in np.argsort(-size, kind="stable")
                if total // cells[i] * (cells[i] + 1) <= num_parts]
        if not grow:
            break
        cells[grow[0]] += 1
    shape[active] = cells
    return shape


def voxel_parts(p: np.ndarray, num_parts: int) -> np.ndarray:
    """Regular grid over the bounding box of one sample (see :func:`voxel_grid_shape`).

    A point's cell is ``floor((p - lo) / cell_size)`` per axis (the upper faces of the
    box belong to the last cell). Non-empty cells are numbered consecutively in
    increasing row-major (C order, first axis slowest) cell index.

    Returns:
        Local part ids ``[n]`` in ``0 .. (number of non-empty cells) - 1``.
    """
    rows = np.ascontiguousarray(p.T)  # fast row-wise reductions (see kd_parts)
    lo = rows.min(axis=1)
    extent = rows.max(axis=1) - lo
    shape = voxel_grid_shape(extent, num_parts)
    size = np.where(shape > 1, extent / shape, 1.0)
    cell = np.clip(np.floor((p - lo) / size).astype(np.int64), 0, shape - 1)
    flat = np.ravel_multi_index(tuple(cell.T), tuple(shape))
    return np.unique(flat, return_inverse=True)[1].reshape(-1)


@torch.no_grad()
def kmeans_parts(pos: Tensor, num_parts: int, iters: int) -> Tensor:
    """Lloyd's k-means of one sample, seeded with the FPS points (deterministic).

    Returns:
        Local cluster ids ``[n]`` in ``0 .. P - 1``; a cluster can end up empty.
    """
    from meshops.search.fps import fps
    from meshops.search.knn import knn

    p = pos.double() if pos.device.type == "cpu" else pos
    centers = p[fps(p, num=num_parts)]
    assign = knn(centers, p, 1)[1]
    for _ in range(iters):
        sums = torch.zeros_like(centers).index_add_(0, assign, p)
        cnt = torch.bincount(assign, minlength=num_parts).to(p.dtype)[:, None]
        # An empty cluster keeps its previous center instead of collapsing to 0/0.
        new = torch.where(cnt > 0, sums / cnt.clamp(min=1), centers)
        new_assign = knn(new, p, 1)[1]
        centers = new
        if torch.equal(new_assign, assign):
            break
        assign = new_assign
    return assign


def partition(pos: Tensor, num_parts: int, method: str = "kd",
              batch: Optional[Tensor] = None, *, kmeans_iters: int = 10) -> Tensor:
    """Split every sample of a point cloud into ``num_parts`` spatial parts.

    Methods:

    * ``"kd"``: balanced recursive coordinate bisection (longest axis, split at the
      rank that keeps sizes balanced): every part has ``floor(n/P)`` or
      ``ceil(n/P)`` points, for any ``P >= 1``. Part sizes follow point *density*.
    * ``"voxel"``: a regular grid over the sample's bounding box with at most
      ``num_parts`` cells shaped after the box's aspect ratio
      (:func:`voxel_grid_shape`); empty cells are dropped and the non-empty ones
      renumbered ``0, 1, ...`` in row-major cell order, so a sample can have fewer
      than ``num_parts`` parts. Part shapes follow *geometry*, not density.
    * ``"kmeans"``: ``kmeans_iters`` Lloyd iterations seeded with the FPS points
      (deterministic); clusters can be empty.

    Ids are **global**: sample ``b`` uses ``b * num_parts + local``, so they can be
    fed straight to ``scatter``/``index_add`` with ``B * num_parts`` slots and never mix
    samples.

    Args:
        pos: Points.
        num_parts: Parts per sample, ``1 <= num_parts <=`` the points of every sample.
        method: ``"kd"``, ``"voxel"`` or ``"kmeans"``.
        batch: Sorted sample index (PyG batch vector), or None for one sample.
        kmeans_iters: Lloyd iterations for ``"kmeans"`` (stops early at a fixed point).

    Returns:
        LongTensor ``[N]`` of part ids on ``pos.device``.

    Raises:
        MeshError: Bad ``pos`` or ``batch``; unknown ``method``; ``num_parts < 1`` or
            larger than the points of a sample (the message names the sample).

    Shapes:
        - pos: ``[N, d]``
        - batch: ``[N]``
        - output: ``[N]``, values in ``[0, B * num_parts)``
    """
    fn = "partition"
    check_pos(pos, "pos", fn, finite=True)
    num_parts = check_int(num_parts, "num_parts", fn, minimum=1)
    if method not in METHODS:
        raise MeshError(f"{fn}: method must be one of {METHODS}, got {method!r}")
    kmeans_iters = check_int(kmeans_iters, "kmeans_iters", fn, minimum=0)
    batch = check_batch(batch, pos.shape[0], "batch", fn, pos.device)
    b = num_samples(batch)
    ptr = sample_ptr(batch, pos.shape[0], b)
    for i in range(b):
        n = ptr[i + 1] - ptr[i]
        if num_parts > n:
            raise MeshError(f"{fn}: num_parts={num_parts} exceeds the number of points "
                            f"in sample {i} ({n})")

    parts = _sample_parts(pos, ptr, num_parts, method, kmeans_iters)
    out = torch.empty(pos.shape[0], dtype=torch.long)
    for i, ids in enumerate(parts):
        out[ptr[i]:ptr[i + 1]] = ids + i * num_parts
    return out.to(pos.device)


def _sample_parts(pos: Tensor, ptr: list, num_parts: int, method: str,
                  kmeans_iters: int) -> list[Tensor]:
    """Each sample's part ids (``[n_b]``, on the CPU), by ``method``."""
    b = len(ptr) - 1
    if method == "kmeans":
        return [kmeans_parts(pos[ptr[i]:ptr[i + 1]], num_parts, kmeans_iters).cpu()
                for i in range(b)]
    pn = pos.detach().cpu().numpy().astype(np.float64, copy=False)
    local = kd_parts if method == "kd" else voxel_parts
    return [torch.from_numpy(local(pn[ptr[i]:ptr[i + 1]], num_parts)) for i in range(b)]
