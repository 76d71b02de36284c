"""Latent meshes of encoder-processor-decoder models and their quadrature weights.

* :func:`latent_points`: the latent mesh of a batch, of one of the kinds below;
* :func:`fps_latent`: a farthest-point sample of every sample's points;
* :func:`site_latent`: the points nearest to a regular grid of sites over every
  sample's bounding box;
* :func:`grid_latent`: a strided sub-grid of structured samples;
* :func:`voronoi_weights`: the quadrature rule of a latent point set (each input point
  gives its weight to its nearest latent point).

All depend on the mesh only; :meth:`PiT.mesh_transform <meshops.models.PiT.mesh_transform>`
computes them once per sample.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from meshops.search import fps, knn

__all__ = ["box_sites", "fps_latent", "grid_latent", "latent_points", "site_latent",
           "voronoi_weights"]


def latent_points(kind: str, pos: Tensor, weight: Tensor, batch: Optional[Tensor],
                  num_latent: int, grid_shape: Optional[Sequence[int]] = None,
                  stride: Union[int, Sequence[int]] = 2
                  ) -> tuple[Optional[Tensor], Tensor, Tensor, Optional[Tensor]]:
    """The latent mesh of a batch: ``"input"`` (its own points), ``"fps"``
    (:func:`fps_latent` of ``num_latent`` points per sample), ``"sites"``
    (:func:`site_latent`, about ``num_latent`` points per sample) or ``"grid"``
    (:func:`grid_latent`), with :func:`voronoi_weights` (``"input"`` keeps the input
    weights).

    Returns:
        ``(index, pos, weight, batch)``: the latent points' indices into the inputs
        (None for ``"input"``), positions, quadrature weights and batch vector.
    """
    if kind == "input":
        return None, pos, weight, batch
    if kind == "fps":
        idx = fps_latent(pos, batch, num_latent)
    elif kind == "sites":
        idx = site_latent(pos, batch, num_latent)
    else:
        idx = grid_latent(grid_shape, stride, batch, pos.shape[0], device=pos.device)
    lat_pos = pos[idx]
    lat_batch = None if batch is None else batch[idx]
    return idx, lat_pos, voronoi_weights(pos, weight, batch, lat_pos, lat_batch), lat_batch


def fps_latent(pos: Tensor, batch: Optional[Tensor], num: int) -> Tensor:
    """Farthest-point sample of ``num`` points per sample (all points of a smaller sample).

    Deterministic (start point 0 of every sample) and the same on every device: the
    sample is drawn on the CPU, because the CPU and CUDA backends break exact distance
    ties (common on structured boundaries) differently, which would give a model another
    latent mesh, and other outputs, on a GPU. It is mesh-only work, done once per mesh
    when the structures are precomputed. Returns sorted global indices (on ``pos``'s
    device) so the latent batch vector stays sorted.
    """
    cpu_pos = pos.detach().cpu()
    if batch is None:
        idx = fps(cpu_pos, None, num=min(num, pos.shape[0]))
        return idx.sort().values.to(pos.device)
    counts = torch.bincount(batch).tolist()
    if any(c == 0 for c in counts):
        raise ValueError("a sample of the batch has no points")
    idx = fps(cpu_pos, batch.cpu(), num=[min(num, c) for c in counts])
    return idx.sort().values.to(pos.device)


def box_sites(lo: Tensor, hi: Tensor, num: int) -> Tensor:
    """The centres of about ``num`` cells of one spacing ``h`` tiling the box
    ``[lo, hi]``: ``round(extent / h)`` cells along each axis of non-zero extent (one
    along a flat axis), ``h = (volume / num)^(1/d)`` over the ``d`` such axes.

    Shapes:
        lo, hi ``[D]`` -> sites ``[S, D]``, C order, ``S`` about ``num``
    """
    ext = (hi - lo).clamp_min(0)
    live = ext > 1e-12 * float(ext.max())
    if not bool(live.any()):  # one point
        return lo[None].clone()
    h = float(torch.prod(ext[live])) ** (1.0 / int(live.sum())) / num ** (1.0 / int(live.sum()))
    counts = [max(1, round(float(e) / h)) if bool(a) else 1 for e, a in zip(ext, live)]
    axes = [lo[i] + (torch.arange(n, dtype=lo.dtype) + 0.5) * ext[i] / n
            for i, n in enumerate(counts)]
    return torch.cartesian_prod(*axes).reshape(-1, len(counts))


def site_latent(pos: Tensor, batch: Optional[Tensor], num: int) -> Tensor:
    """For every sample, its point nearest to each of about ``num`` sites
    (:func:`box_sites` of its bounding box), each point once.

    The sites depend on the domain alone, so the latent mesh of the same domain meshed
    again moves by at most the distance from a site to its nearest point, which shrinks
    with the local mesh size; a farthest-point sample (:func:`fps_latent`) of a finer or
    graded mesh takes other greedy steps and moves by up to its own spacing. Sites
    inside a hole or a body take its nearest boundary points, so fewer than ``num``
    points may come back. Drawn on the CPU in float64 (as :func:`fps_latent`); returns
    sorted global indices on ``pos``'s device.
    """
    cpu = pos.detach().cpu().double()
    if batch is None:
        bounds = [0, cpu.shape[0]]
    else:
        counts = torch.bincount(batch.cpu())
        if bool((counts == 0).any()):
            raise ValueError("a sample of the batch has no points")
        bounds = [0, *torch.cumsum(counts, 0).tolist()]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        p = cpu[a:b]
        sites = box_sites(p.min(0).values, p.max(0).values, num)
        nearest = knn(p, sites, 1)[1]  # row 1: the point nearest to each site
        out.append(torch.unique(nearest) + a)
    return torch.cat(out).to(pos.device)


def _grid_axis(n: int, stride: int) -> list[int]:
    idx = list(range(0, n, stride))
    if idx[-1] != n - 1:
        idx.append(n - 1)  # keep the boundary row
    return idx


def grid_latent(grid_shape: Sequence[int], stride: Union[int, Sequence[int]],
                batch: Optional[Tensor], num_points: int, device=None) -> Tensor:
    """Indices of a strided sub-grid of structured samples.

    Every sample must hold ``prod(grid_shape)`` points in C order of ``grid_shape``
    (e.g. the 221 x 51 NACA C-grid, ``X.ravel()``). Along each axis the indices
    ``0, s, 2s, ...`` are kept, plus the last one when the stride does not reach it, so
    the sub-grid always spans the whole grid: 221 x 51 with stride 2 gives 111 x 26.

    Returns:
        Sorted global indices ``[B * prod(sub_shape)]``.
    """
    shape = [int(s) for s in grid_shape]
    strides = [int(stride)] * len(shape) if isinstance(stride, int) else [int(s) for s in stride]
    if len(strides) != len(shape) or min(strides) < 1:
        raise ValueError(f"stride must be a positive int or one per grid axis, got {stride!r}")
    size = math.prod(shape)
    if batch is None:
        counts = [num_points]
    else:
        counts = torch.bincount(batch).tolist()
    if any(c != size for c in counts):
        raise ValueError(f"latent='grid' needs every sample to have prod(grid_shape)={size} "
                         f"points (grid_shape={shape}), got sample sizes {sorted(set(counts))}")
    axes = [torch.tensor(_grid_axis(n, s), dtype=torch.long) for n, s in zip(shape, strides)]
    mesh = torch.meshgrid(*axes, indexing="ij")
    flat = torch.zeros_like(mesh[0])
    for a, m in enumerate(mesh):
        flat = flat * shape[a] + m
    local = flat.reshape(-1).sort().values
    offs = torch.arange(len(counts), dtype=torch.long) * size
    return (offs[:, None] + local[None, :]).reshape(-1).to(device)


def voronoi_weights(pos: Tensor, weight: Tensor, batch: Optional[Tensor], latent_pos: Tensor,
                    latent_batch: Optional[Tensor]) -> Tensor:
    r"""Quadrature weights of a latent point set by Voronoi aggregation.

    Every input point gives its weight to its nearest latent point of the same sample
    (:func:`meshops.search.knn`); a point equidistant from several latent points (common
    on strided sub-grids, whose fine nodes sit midway between coarse ones) splits its
    weight equally among them, so the rule stays symmetric:

    .. math::  w^{lat}_a = \sum_{i:\ \mathrm{nn}(x_i) \ni a} w_i / |\mathrm{nn}(x_i)|
               \approx |V_a \cap \Omega|,

    the measure of latent point ``a``'s Voronoi cell. The latent weights sum exactly to
    the input measure :math:`\sum_i w_i = |\Omega|`, and as the input mesh is refined
    they converge to the Voronoi cell measures, which depend only on the latent points
    and the geometry - not on the input mesh.

    Shapes:
        pos ``[N, d]``, weight ``[N]``, batch ``[N]``, latent_pos ``[Nv, d]``,
        latent_batch ``[Nv]`` -> ``[Nv]``
    """
    n = pos.shape[0]
    if latent_batch is None:
        n_lat = latent_pos.shape[0]
    else:
        counts = torch.bincount(latent_batch)
        n_lat = int(counts[torch.unique(batch)].min()) if batch is not None else int(counts.min())
    k = max(1, min(2 ** pos.shape[1], n_lat))       # enough for the ties of a grid
    with torch.no_grad():
        edge = knn(latent_pos.detach(), pos.detach(), k, latent_batch, batch)
        near = edge[1].view(n, k)
        d2 = (pos.detach().double()[edge[0]] - latent_pos.detach().double()[edge[1]]
              ).pow(2).sum(-1).view(n, k)
        tied = d2 <= d2[:, :1] * (1 + 1e-9) + 1e-300
        share = tied.to(weight.dtype) / tied.sum(1, keepdim=True).to(weight.dtype)
    return weight.new_zeros(latent_pos.shape[0]).index_add(
        0, near.reshape(-1), (share * weight[:, None]).reshape(-1))
