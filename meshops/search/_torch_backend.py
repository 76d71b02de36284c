"""``torch`` backend: exact brute force that runs on any device.

Neighbour search computes distances chunk by chunk of query rows with
``torch.cdist(..., compute_mode="donot_use_mm_for_euclid_dist")``: the
``|x|^2 + |y|^2 - 2 x.y`` expansion used by the matrix-multiply mode loses digits to
cancellation and would reorder near neighbours relative to the tree backends. A chunk
holds at most :data:`~meshops.search._layout.CHUNK_ENTRIES` distances, so the full
``N x M`` matrix never exists. FPS is the plain greedy loop, exact by construction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from meshops.search._layout import cat_edges, chunks, neighbours_to_edges


def _work_dtype(t: Tensor) -> Tensor:
    # cdist has no half-precision kernels on CPU, and half would tie too many distances.
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _nearest(x: Tensor, y: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Distances and local indices ``[m, k]`` of the k nearest x of every y, sorted."""
    m = y.shape[0]
    dist = torch.empty(m, k, dtype=x.dtype, device=x.device)
    idx = torch.empty(m, k, dtype=torch.long, device=x.device)
    for sl in chunks(m, x.shape[0]):
        d = torch.cdist(y[sl], x, compute_mode="donot_use_mm_for_euclid_dist")
        dist[sl], idx[sl] = torch.topk(d, k, dim=1, largest=False, sorted=True)
    return dist, idx


@torch.no_grad()
def knn(x: Tensor, y: Tensor, k: int, ptr_x: list[int], ptr_y: list[int]) -> Tensor:
    x, y = _work_dtype(x), _work_dtype(y)
    out = []
    for b in range(len(ptr_y) - 1):
        (x0, x1), (y0, y1) = ptr_x[b:b + 2], ptr_y[b:b + 2]
        if y1 == y0:
            continue
        _, idx = _nearest(x[x0:x1], y[y0:y1], k)
        out.append(neighbours_to_edges(idx, y0, x0))
    return cat_edges(out, y.device)


@torch.no_grad()
def radius(x: Tensor, y: Tensor, r: float, max_num_neighbors: int, ptr_x: list[int],
           ptr_y: list[int]) -> Tensor:
    x, y = _work_dtype(x), _work_dtype(y)
    out = []
    for b in range(len(ptr_y) - 1):
        (x0, x1), (y0, y1) = ptr_x[b:b + 2], ptr_y[b:b + 2]
        if y1 == y0 or x1 == x0:
            continue
        # The nearest max_num_neighbors candidates, then the radius test: this keeps
        # the nearest ones when more lie within r, as the other backends do.
        dist, idx = _nearest(x[x0:x1], y[y0:y1], min(max_num_neighbors, x1 - x0))
        idx[dist > r] = -1
        out.append(neighbours_to_edges(idx, y0, x0))
    return cat_edges(out, y.device)


@torch.no_grad()
def greedy_fps(p: Tensor, count: int, start: int) -> Tensor:
    """Exact greedy FPS of one sample ``p [n, d]``: local indices ``[count]``.

    Ties go to the lowest index (``argmax``). Selected points are marked with distance
    -1, so that when only duplicates of selected points remain (``count`` larger than
    the number of distinct points) fresh indices are still returned.
    """
    n = p.shape[0]
    out = torch.empty(count, dtype=torch.long, device=p.device)
    if count == 0:
        return out
    mind = torch.full((n,), float("inf"), dtype=p.dtype, device=p.device)
    buf = torch.empty_like(p)
    d = torch.empty(n, dtype=p.dtype, device=p.device)
    # The current index stays a device tensor: no host synchronisation per step on GPU.
    cur = torch.tensor([start], dtype=torch.long, device=p.device)
    for i in range(count):
        out[i:i + 1] = cur
        torch.sub(p, p.index_select(0, cur), out=buf)
        buf.square_()
        torch.sum(buf, dim=1, out=d)
        torch.minimum(mind, d, out=mind)
        mind.index_fill_(0, cur, -1.0)
        cur = torch.argmax(mind).view(1)
    return out


def fps(pos: Tensor, ptr: list[int], counts: list[int], starts: list[int]) -> Tensor:
    pos = _work_dtype(pos)
    out = [greedy_fps(pos[ptr[b]:ptr[b + 1]], counts[b], starts[b]) + ptr[b]
           for b in range(len(counts)) if counts[b]]
    if not out:
        return torch.empty(0, dtype=torch.long, device=pos.device)
    return torch.cat(out)
