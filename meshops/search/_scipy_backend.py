"""``scipy`` backend: one :class:`scipy.spatial.cKDTree` per sample (CPU).

Queries run with ``workers=-1`` (all cores) and in Morton order (see
:func:`~meshops.search._layout.locality_order`); the tree is built with
``balanced_tree=False`` (sliding midpoint), which builds about twice as fast as the
median split and queries as fast on point clouds. Distances are computed in float64
whatever the input dtype.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.spatial import cKDTree
from torch import Tensor

from meshops.search._layout import cat_edges, chunks, locality_order, neighbours_to_edges

#: Below this many queries the Morton sort costs more than it saves.
_LOCALITY_MIN = 1 << 15


def _numpy(t: Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float64, copy=False)


def _query_order(tree: cKDTree, q: np.ndarray, q_is_data: bool) -> np.ndarray | None:
    if len(q) < _LOCALITY_MIN:
        return None
    # When the queries are the tree's own points, the tree order is already the best
    # locality order and comes for free.
    return tree.indices if q_is_data else locality_order(q)


def _query(tree: cKDTree, q: np.ndarray, q_is_data: bool, k: int, idx: np.ndarray,
           dist: np.ndarray | None = None, upper: float = np.inf) -> None:
    """k nearest (within ``upper``) of every row of ``q``, written into ``idx``/``dist``."""
    m = len(q)
    order = _query_order(tree, q, q_is_data)
    for sl in chunks(m, k):
        rows = sl if order is None else order[sl]
        d, i = tree.query(q[rows], k=k, distance_upper_bound=upper, workers=-1)
        idx[rows] = i.reshape(-1, k)
        if dist is not None:
            dist[rows] = d.reshape(-1, k)


def _same(x: Tensor, y: Tensor) -> bool:
    return x is y or (x.shape == y.shape and x.stride() == y.stride()
                      and x.data_ptr() == y.data_ptr() and x.dtype == y.dtype)


def knn(x: Tensor, y: Tensor, k: int, ptr_x: list[int], ptr_y: list[int]) -> Tensor:
    same = _same(x, y)
    xn = _numpy(x)
    yn = xn if same else _numpy(y)
    m = y.shape[0]
    # Every query has exactly k neighbours (checked by the caller), so the PyG layout
    # is known in advance: fill it in place instead of concatenating copies.
    out = torch.empty(2, m * k, dtype=torch.long)
    out[0].view(m, k).copy_(torch.arange(m)[:, None].expand(m, k))
    for b in range(len(ptr_y) - 1):
        (x0, x1), (y0, y1) = ptr_x[b:b + 2], ptr_y[b:b + 2]
        if y1 == y0:
            continue
        tree = cKDTree(xn[x0:x1], balanced_tree=False)
        q_is_data = same and (x0, x1) == (y0, y1)
        idx = out[1, y0 * k:y1 * k].view(y1 - y0, k).numpy()  # shares memory with out
        _query(tree, yn[y0:y1], q_is_data, k, idx)
        idx += x0
    return out.to(y.device)


def radius(x: Tensor, y: Tensor, r: float, max_num_neighbors: int, ptr_x: list[int],
           ptr_y: list[int]) -> Tensor:
    same = _same(x, y)
    xn = _numpy(x)
    yn = xn if same else _numpy(y)
    # cKDTree's bound is strict (d < bound, compared on squared distances); widen it a
    # little and apply the inclusive test d <= r ourselves. The floor keeps r = 0 from
    # underflowing to a bound of 0 that would exclude coincident points.
    upper = max(r * (1.0 + 1e-9), 1e-150)
    out = []
    for b in range(len(ptr_y) - 1):
        (x0, x1), (y0, y1) = ptr_x[b:b + 2], ptr_y[b:b + 2]
        if y1 == y0 or x1 == x0:
            continue
        tree = cKDTree(xn[x0:x1], balanced_tree=False)
        k = min(max_num_neighbors, x1 - x0)
        q_is_data = same and (x0, x1) == (y0, y1)
        dist = np.empty((y1 - y0, k), dtype=np.float64)
        idx = np.empty((y1 - y0, k), dtype=np.int64)
        _query(tree, yn[y0:y1], q_is_data, k, idx, dist, upper)
        # Missing neighbours come back as (inf, n): the test below drops them too.
        idx[~(dist <= r)] = -1
        out.append(neighbours_to_edges(torch.from_numpy(idx), y0, x0))
    return cat_edges(out, torch.device("cpu")).to(y.device)
