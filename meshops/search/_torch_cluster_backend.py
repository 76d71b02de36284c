"""``torch_cluster`` backend: adapter over PyG's compiled kernels (optional).

torch_cluster's own contracts differ from ours in three places, fixed here:

* knn does not promise distance order within a query: edges are re-sorted by
  (query, distance).
* radius returns an *arbitrary* subset when more than ``max_num_neighbors`` points
  lie within ``r``; we take the nearest ``max_num_neighbors`` (knn) and apply the radius
  test, like the other backends.
* fps only samples by ratio from the first point of each sample: the wanted start is
  swapped to the front, and ``num`` is passed as the ratio ``(num - 0.5) / n``, whose
  ``ceil(ratio * n)`` is ``num`` with half a point of margin for float32 rounding.
"""

from __future__ import annotations

import torch
import torch_cluster
from torch import Tensor

from meshops.search._layout import cat_edges


def _sorted_by_distance(edge: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """Order edges by query (row 0), then by increasing distance."""
    if edge.shape[1] == 0:
        return edge
    d = (y[edge[0]] - x[edge[1]]).pow(2).sum(1)
    order = torch.argsort(d, stable=True)
    order = order[torch.argsort(edge[0, order], stable=True)]
    return edge[:, order]


def _knn_sample(x: Tensor, y: Tensor, k: int) -> Tensor:
    edge = torch_cluster.knn(x, y, k)
    return _sorted_by_distance(edge, x, y)


@torch.no_grad()
def knn(x: Tensor, y: Tensor, k: int, ptr_x: list[int], ptr_y: list[int]) -> Tensor:
    b = len(ptr_y) - 1
    bx = torch.repeat_interleave(torch.arange(b, device=x.device),
                                 torch.tensor(ptr_x, device=x.device).diff())
    by = torch.repeat_interleave(torch.arange(b, device=y.device),
                                 torch.tensor(ptr_y, device=y.device).diff())
    edge = torch_cluster.knn(x, y, k, bx, by)
    return _sorted_by_distance(edge, x, y)


@torch.no_grad()
def radius(x: Tensor, y: Tensor, r: float, max_num_neighbors: int, ptr_x: list[int],
           ptr_y: list[int]) -> Tensor:
    out = []
    for b in range(len(ptr_y) - 1):
        (x0, x1), (y0, y1) = ptr_x[b:b + 2], ptr_y[b:b + 2]
        if y1 == y0 or x1 == x0:
            continue
        xb, yb = x[x0:x1], y[y0:y1]
        edge = _knn_sample(xb, yb, min(max_num_neighbors, x1 - x0))
        # Same inclusive test on Euclidean distances as the other backends.
        keep = (yb[edge[0]] - xb[edge[1]]).norm(dim=1) <= r
        edge = edge[:, keep]
        out.append(edge + torch.tensor([[y0], [x0]], device=edge.device))
    return cat_edges(out, y.device)


@torch.no_grad()
def fps(pos: Tensor, ptr: list[int], counts: list[int], starts: list[int]) -> Tensor:
    out = []
    for b, count in enumerate(counts):
        if not count:
            continue
        n = ptr[b + 1] - ptr[b]
        perm = torch.arange(n, device=pos.device)
        perm[0], perm[starts[b]] = starts[b], 0
        p = pos[ptr[b]:ptr[b + 1]][perm]
        if count == n:
            ratio = 1.0
        else:
            ratio = (count - 0.5) / n
        idx = torch_cluster.fps(p, None, ratio, random_start=False)
        if idx.numel() != count:  # ratio rounding went wrong: exact torch loop instead
            from meshops.search._torch_backend import greedy_fps
            idx = greedy_fps(p, count, 0)
        out.append(perm[idx] + ptr[b])
    if not out:
        return torch.empty(0, dtype=torch.long, device=pos.device)
    return torch.cat(out)
