"""Graphs in PyG's layout: :func:`knn_graph` / :func:`radius_graph` drop-ins, the
graph and faces of mesh cells (:func:`cells_to_edge_index`, :func:`cells_to_face`), and
the graphs the models build from positions and quadrature weights alone: balls holding a
fraction of the domain's measure (:func:`measure_ball_graph`) and inverse-distance
interpolation weights (:func:`knn_interpolation_weights`).

``torch_geometric.nn.knn_graph`` / ``radius_graph`` need pyg-lib or torch-cluster
and raise ``ImportError`` without them. These functions take the same arguments and
return the same ``edge_index``, computed with meshops' own search backends
(:func:`meshops.knn` / :func:`meshops.radius`, so ``scipy`` on CPU, ``torch_cluster``
on CUDA when installed, exact ``torch`` brute force otherwise).

Orientation, as in PyG: with ``flow="source_to_target"`` (the default) row 0 holds
the neighbour (message source) and row 1 the centre point (message target), so a
``MessagePassing`` layer aggregates every point's neighbours into it;
``flow="target_to_source"`` swaps the rows. Edges are ordered by centre point, then
by increasing distance.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.utils import to_undirected

from meshops.errors import MeshError
from meshops.search.knn import knn, radius
from meshops.search.neighbourhoods import check_flow
from meshops.utils.checks import (
    check_batch,
    check_int,
    check_pos,
    check_real,
    num_samples,
    sample_ptr,
)

__all__ = ["cells_to_edge_index", "cells_to_face", "knn_graph", "knn_interpolation_weights",
           "interpolation_k", "measure_ball_graph", "radius_graph"]

def _check_common(x: Tensor, batch: Optional[Tensor], flow: str, fn: str) -> list[int]:
    check_pos(x, "x", fn, finite=True)
    check_flow(flow, fn)
    b = check_batch(batch, x.shape[0], "batch", fn, x.device)
    return sample_ptr(b, x.shape[0], num_samples(b))


def _keep_first(center: Tensor, n: int, limit: int) -> Tensor:
    """Mask keeping the first ``limit`` edges of every centre (edges sorted by centre)."""
    counts = torch.bincount(center, minlength=n)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(center.numel(), device=center.device) - first[center]
    return rank < limit


def _orient(edge: Tensor, flow: str) -> Tensor:
    # meshops.knn / radius give (centre, neighbour) rows = PyG's target_to_source.
    return edge.flip(0) if flow == "source_to_target" else edge


def knn_graph(x: Tensor, k: int, batch: Optional[Tensor] = None, loop: bool = False,
              flow: str = "source_to_target", cosine: bool = False, num_workers: int = 1,
              batch_size: Optional[int] = None, *, backend: Optional[str] = None) -> Tensor:
    """Edges from every point to its ``k`` nearest points; PyG's ``knn_graph``.

    Same arguments and output as :func:`torch_geometric.nn.knn_graph`. Every point
    gets exactly ``k`` neighbours in its own sample; with ``loop=False`` the point
    itself is not one of them (also when other points coincide with it: one of
    those is then a neighbour at distance 0).

    Args:
        x: Points (or node features) ``[N, d]``.
        k: Number of neighbours per point.
        batch: Sorted PyG batch vector ``[N]``, or None for one sample.
        loop: Whether every point is its own neighbour (counted in ``k``).
        flow: ``"source_to_target"`` (row 0 neighbour, row 1 centre) or
            ``"target_to_source"`` (row 0 centre, row 1 neighbour).
        cosine: Rank neighbours by cosine distance ``1 - cos(x_i, x_j)`` instead of
            Euclidean distance.
        num_workers: Accepted for PyG compatibility; the backend picks its threads.
        batch_size: Accepted for PyG compatibility (the count follows from ``batch``).
        backend: Search backend (see :func:`meshops.knn`); None for the default.

    Returns:
        LongTensor ``[2, N * k]`` on ``x.device``.

    Raises:
        MeshError: The input errors of :func:`meshops.knn`, an unknown ``flow``, or a
            sample with fewer than ``k`` other points (``k`` points with ``loop=True``);
            PyG would silently return fewer neighbours there.

    Shapes:
        - x: ``[N, d]``, batch: ``[N]``
        - output: ``[2, N * k]``

    Example:
        >>> edge_index = meshops.knn_graph(pos, k=8, batch=batch)
        >>> out = GCNConv(c, c)(h, edge_index)     # each point averages its 8 neighbours
    """
    fn = "knn_graph"
    ptr = _check_common(x, batch, flow, fn)
    k = check_int(k, "k", fn, minimum=1)
    need = k if loop else k + 1
    for s in range(len(ptr) - 1):
        n = ptr[s + 1] - ptr[s]
        if 0 < n < need:
            raise MeshError(f"{fn}: k={k} needs {need} points per sample "
                            f"({'loop=True' if loop else 'k others plus the point itself'}), "
                            f"but sample {s} has {n}")
    if cosine:
        # Euclidean order of unit vectors is cosine order: |a - b|^2 = 2 - 2 cos(a, b).
        x = torch.nn.functional.normalize(x, dim=1)
    edge = knn(x, x, need, batch, batch, backend=backend)
    if not loop and edge.numel():
        edge = _without_self(edge, need)
    return _orient(edge, flow)


def _without_self(edge: Tensor, need: int) -> Tensor:
    """Each point's ``need`` nearest (``[2, N * need]``) less the point itself; where
    coincident points pushed it out of its own ``need`` nearest, less the farthest, so
    that every point keeps exactly ``need - 1``."""
    center, nbr = edge.view(2, -1, need)
    drop = nbr == center
    drop[:, -1] |= ~drop.any(dim=1)
    keep = ~drop
    return torch.stack([center[keep], nbr[keep]])


def radius_graph(x: Tensor, r: float, batch: Optional[Tensor] = None, loop: bool = False,
                 max_num_neighbors: int = 32, flow: str = "source_to_target",
                 num_workers: int = 1, batch_size: Optional[int] = None, *,
                 backend: Optional[str] = None) -> Tensor:
    """Edges between points at most ``r`` apart; PyG's ``radius_graph``.

    Same arguments and output as :func:`torch_geometric.nn.radius_graph`. A point
    keeps at most ``max_num_neighbors`` neighbours (not counting itself when
    ``loop=False``): the **nearest** ones, where PyG's CPU kernel keeps an arbitrary
    subset. A point at distance exactly ``r`` is a neighbour.

    Args:
        x: Points ``[N, d]``.
        r: Radius, finite and ``>= 0``.
        batch: Sorted PyG batch vector ``[N]``, or None for one sample.
        loop: Whether every point is its own neighbour.
        max_num_neighbors: Most neighbours per point (``>= 1``).
        flow: ``"source_to_target"`` (row 0 neighbour, row 1 centre) or
            ``"target_to_source"``.
        num_workers: Accepted for PyG compatibility; the backend picks its threads.
        batch_size: Accepted for PyG compatibility (the count follows from ``batch``).
        backend: Search backend (see :func:`meshops.radius`); None for the default.

    Returns:
        LongTensor ``[2, E]`` on ``x.device``.

    Raises:
        MeshError: The input errors of :func:`meshops.radius` or an unknown ``flow``.

    Shapes:
        - x: ``[N, d]``, batch: ``[N]``
        - output: ``[2, E]``, ``E <= N * max_num_neighbors``
    """
    fn = "radius_graph"
    _check_common(x, batch, flow, fn)
    r = check_real(r, "r", fn)
    if r < 0:
        raise MeshError(f"{fn}: r must be >= 0, got {r}")
    max_num_neighbors = check_int(max_num_neighbors, "max_num_neighbors", fn, minimum=1)
    # One more than asked for, so that the point itself does not use up a place.
    edge = radius(x, x, r, batch, batch, max_num_neighbors + (0 if loop else 1),
                  backend=backend)
    if not loop:
        edge = edge[:, edge[0] != edge[1]]
        # Coincident points can push a point out of its own list: cap again.
        edge = edge[:, _keep_first(edge[0], x.shape[0], max_num_neighbors)]
    return _orient(edge, flow)


def interpolation_k(k: int, num_src: int, batch_src: Optional[Tensor],
                    batch_dst: Optional[Tensor]) -> int:
    """The neighbours :func:`knn_interpolation_weights` takes: ``k``, capped by the
    points of the smallest sample that has destination points (at least 1)."""
    n_min = num_src
    if batch_src is not None:
        counts = torch.bincount(batch_src)
        used = torch.unique(batch_dst) if batch_dst is not None else counts.nonzero()[:, 0]
        n_min = int(counts[used].min())
    return max(1, min(k, n_min))


def knn_interpolation_weights(pos_src: Tensor, pos_dst: Tensor, batch_src: Optional[Tensor],
                              batch_dst: Optional[Tensor], k: int = 4, power: float = 2.0
                              ) -> tuple[Tensor, Tensor]:
    r"""The ``k`` nearest source points of every destination point and their
    inverse-distance weights, as :func:`meshops.nn.knn_interpolate` uses them.

    .. math:: w_{ij} = \frac{d_{ij}^{-p}}{\sum_{l \in \mathrm{kNN}(i)} d_{il}^{-p}},
              \qquad d_{ij} = |y_i - x_j|,

    over the ``k`` nearest source points of the same sample (:func:`meshops.knn`, nearest
    first); distances below ~1e-6 of the farthest neighbour count as 0, so a destination
    point on a source point takes that point's value. ``k`` is capped by the smallest
    sample that has destination points. Depends on the positions only: compute it once
    per mesh and pass it to :func:`~meshops.nn.knn_interpolate` as ``weights``.

    Returns:
        ``(src, w)``: LongTensor ``[M, k]`` of source indices and ``[M, k]`` weights
        (rows sum to 1) in the dtype of ``pos_dst``.

    Shapes:
        pos_src ``[N, d]``, pos_dst ``[M, d]``, batches ``[N]``/``[M]`` or None ->
        ``([M, k], [M, k])``
    """
    if pos_dst.shape[0] == 0:
        k = max(1, min(k, pos_src.shape[0]))
        return (torch.empty(0, k, dtype=torch.long, device=pos_dst.device),
                pos_dst.new_empty(0, k))
    k = interpolation_k(k, pos_src.shape[0], batch_src, batch_dst)
    with torch.no_grad():
        edge = knn(pos_src.detach(), pos_dst.detach(), k, batch_src, batch_dst)
        dst, src = edge[0], edge[1]
        d2 = (pos_dst[dst] - pos_src[src]).pow(2).sum(-1).view(-1, k)
        # scale-aware floor: distances below ~1e-6 of the farthest neighbour count as 0
        floor = (d2.amax(-1, keepdim=True) * 1e-12).clamp_min(torch.finfo(d2.dtype).tiny)
        w = d2.clamp_min(floor).pow(-power / 2)
        w = w / w.sum(-1, keepdim=True)
    return src.view(-1, k), w


def measure_ball_graph(pos_src: Tensor, weight_src: Tensor, batch_src: Optional[Tensor],
                       pos_dst: Tensor, batch_dst: Optional[Tensor], quantile: float,
                       k_min: int = 1) -> Tensor:
    r"""Neighbourhoods holding a fixed fraction of the domain's *measure*.

    For each destination point :math:`x_i` the ball :math:`B(x_i, r_i)` is the smallest
    closed ball around :math:`x_i` whose source points carry a fraction ``quantile`` of
    the sample's total weight: the nearest source points :math:`y_{(1)}, y_{(2)},
    \dots` are taken until

    .. math:: \sum_{m \le k_i} w_{(m)} \ge q \sum_j w_j \qquad (k_i \ge k_{min}),

    plus every point at the same distance as :math:`y_{(k_i)}` (so ties, common on
    structured grids, are never broken arbitrarily).

    This is PiT's per-row distance quantile (a fraction of the *points*) with every point
    counted by its quadrature weight, i.e. a quantile of the measure
    :math:`\mu_\Omega`: the radius converges to the geometric radius holding a fraction
    ``q`` of :math:`|\Omega|` as the mesh is refined, on graded and uniform meshes
    alike, whereas a count quantile shrinks the ball where the mesh is dense. With
    equal weights both coincide (up to the rank rounding of
    :func:`~meshops.search.neighbourhoods.quantile_k`). Sums are exact (float64), so a ball never
    depends on the other samples of a batch.

    The search starts with about ``2 q N`` neighbours and doubles ``k`` until every ball
    is complete.

    Returns:
        LongTensor ``[2, E]`` in PyG's orientation: row 0 source index, row 1 destination
        index (grouped by destination, nearest first).
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    m = pos_dst.shape[0]
    if m == 0:
        return torch.empty(2, 0, dtype=torch.long, device=pos_dst.device)
    dst, src = _measure_ball(pos_src, weight_src, batch_src, pos_dst, batch_dst, quantile,
                             k_min)
    return torch.stack([src, dst])


def _measure_ball(pos_src: Tensor, weight_src: Tensor, batch_src: Optional[Tensor],
                  pos_dst: Tensor, batch_dst: Optional[Tensor], quantile: float,
                  k_min: int) -> tuple[Tensor, Tensor]:
    """The search's ``(destination, source)`` rows of :func:`measure_ball_graph`."""
    m = pos_dst.shape[0]
    w = weight_src.detach().double()
    ps, pd = pos_src.detach(), pos_dst.detach()
    if batch_src is None:
        counts = torch.tensor([ps.shape[0]], device=ps.device)
        total = w.sum().reshape(1)
        bd = torch.zeros(m, dtype=torch.long, device=pd.device)
    else:
        size = int(max(int(batch_src.max()), int(batch_dst.max()))) + 1
        counts = torch.bincount(batch_src, minlength=size)
        total = torch.zeros(size, dtype=w.dtype, device=w.device).index_add(0, batch_src, w)
        bd = batch_dst
        counts = counts[torch.unique(bd)]
    n_cap = int(counts.min())
    target = (quantile * total)[bd] * (1 - 1e-9)                      # [M]
    k = max(k_min, 2 * (math.floor(quantile * (int(counts.max()) - 1)) + 1))
    while True:
        k = min(k, n_cap)
        edge = knn(ps, pd, k, batch_src, batch_dst)
        ws = w[edge[1]].view(m, k)
        d2 = (pd.double()[edge[0]] - ps.double()[edge[1]]).pow(2).sum(-1).view(m, k)
        cum = torch.cumsum(ws, dim=1)
        reached = cum >= target[:, None]
        # the neighbour that completes the ball (the last one when none does)
        cut = torch.where(reached.any(1), reached.int().argmax(1), torch.full_like(bd, k - 1))
        cut = torch.maximum(cut, torch.full_like(cut, min(k_min, k) - 1))
        d_cut = d2.gather(1, cut[:, None])
        complete = reached.any(1) & (d2[:, -1:] > d_cut).squeeze(1)
        if bool(complete.all()) or k == n_cap:
            break
        k *= 2
    keep = d2 <= d_cut
    edge = edge[:, keep.view(-1)]
    if batch_src is None or bool(complete.all()):
        return edge[0], edge[1]
    # k was capped by a smaller sample: redo the samples with incomplete balls alone
    redo = torch.unique(bd[~complete])
    parts = [edge[:, ~torch.isin(bd[edge[0]], redo)]]
    for b in redo.tolist():
        src = (batch_src == b).nonzero().view(-1)
        dst = (batch_dst == b).nonzero().view(-1)
        if int(src.numel()) <= k:     # the whole sample is already in every ball
            parts.append(edge[:, torch.isin(edge[0], dst)])
            continue
        e_dst, e_src = _measure_ball(pos_src[src], weight_src[src], None, pos_dst[dst], None,
                                     quantile, k_min)
        parts.append(torch.stack([dst[e_dst], src[e_src]]))
    edge = torch.cat(parts, 1)
    return edge[0], edge[1]


# Local node pairs of the edges of each linear cell type, in VTK / meshio node order.
_CELL_EDGES = {
    "vertex": (),
    "line": ((0, 1),),
    "triangle": ((0, 1), (1, 2), (2, 0)),
    "quad": ((0, 1), (1, 2), (2, 3), (3, 0)),
    "tetra": ((0, 1), (1, 2), (2, 0), (0, 3), (1, 3), (2, 3)),
    "hexahedron": ((0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4),
                   (0, 4), (1, 5), (2, 6), (3, 7)),
    "wedge": ((0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3), (0, 3), (1, 4), (2, 5)),
    "pyramid": ((0, 1), (1, 2), (2, 3), (3, 0), (0, 4), (1, 4), (2, 4), (3, 4)),
}
_CELL_NODES = {"vertex": 1, "line": 2, "triangle": 3, "quad": 4, "tetra": 4,
               "hexahedron": 8, "wedge": 6, "pyramid": 5}


def _blocks(cells, fn: str):
    """``(type, LongTensor [M, k])`` pairs of a meshio-style cell list, checked."""
    for i, block in enumerate(cells):
        ctype, conn = block
        ctype = str(ctype)
        if ctype not in _CELL_NODES:
            raise MeshError(f"{fn}: cell block {i} has type {ctype!r}; supported types: "
                            f"{', '.join(_CELL_NODES)}")
        conn = torch.as_tensor(conn)
        if conn.dim() != 2 or conn.shape[1] != _CELL_NODES[ctype]:
            raise MeshError(f"{fn}: cell block {i} ({ctype}) must be [M, {_CELL_NODES[ctype]}], "
                            f"got shape {tuple(conn.shape)}")
        yield ctype, conn.long()


def cells_to_edge_index(cells, num_nodes: Optional[int] = None) -> Tensor:
    """The graph of a mesh's cell edges as a PyG ``edge_index``.

    Two points are joined when they are the two ends of an edge of a cell (the
    sides of triangles and quads, the 6 edges of a tetrahedron, the 12 of a
    hexahedron, ...; quads get no diagonals). Every edge appears once in each
    direction and the result is sorted by row, as :func:`torch_geometric.utils.to_undirected`
    returns it, so either flow reads it the same way. A batched
    :attr:`MeshData.cells <meshops.MeshData.cells>` gives the batch's graph.

    Args:
        cells: ``list[(cell type, LongTensor [M, k])]`` in meshio's names and node
            order, e.g. ``mesh.cells``. Types: vertex, line, triangle, quad, tetra,
            hexahedron, wedge, pyramid.
        num_nodes: Number of points (default: largest index + 1).

    Returns:
        LongTensor ``[2, E]``, ``E`` = twice the number of distinct cell edges.

    Raises:
        MeshError: An unsupported cell type or a block of the wrong width (the
            message names the block).

    Shapes:
        - cells: blocks ``[M, k]``
        - output: ``[2, E]``
    """
    fn = "cells_to_edge_index"
    pairs = []
    device = None
    for ctype, conn in _blocks(cells, fn):
        device = conn.device
        local = _CELL_EDGES[ctype]
        if local and conn.shape[0]:
            a, b = zip(*local)
            pairs.append(torch.stack([conn[:, list(a)].reshape(-1),
                                      conn[:, list(b)].reshape(-1)]))
    if not pairs:
        return torch.empty((2, 0), dtype=torch.long, device=device)
    return to_undirected(torch.cat(pairs, dim=1), num_nodes=num_nodes)


def cells_to_face(cells) -> Optional[Tensor]:
    """Triangles of a mesh's 2-D cells in PyG's ``face`` layout ``[3, F]``.

    Triangles as they are, then every quad split along its 0-2 diagonal into
    ``(0, 1, 2)`` and ``(0, 2, 3)``. Other cell types are left out.

    Returns:
        LongTensor ``[3, F]``, or None when there are no triangles or quads.
    """
    tris = []
    for ctype, conn in _blocks(cells, "cells_to_face"):
        if ctype == "triangle":
            tris.append(conn)
        elif ctype == "quad":
            tris += [conn[:, [0, 1, 2]], conn[:, [0, 2, 3]]]
    if not tris:
        return None
    return torch.cat(tris, dim=0).t().contiguous()
