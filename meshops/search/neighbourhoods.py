"""The neighbourhoods of the local layers: :func:`local_graph` (the ``k`` nearest source
points of every destination point, PiT's distance ``quantile`` or a ``radius`` ball)
and :func:`quantile_k`, the neighbour count of PiT's quantile.

Graphs come in PyG's orientation (``flow="source_to_target"``, as ``MessagePassing``
reads them): ``edge_index[0]`` the source points (the neighbours whose values are
aggregated), ``edge_index[1]`` the destination points; :func:`meshops.knn` and
:func:`meshops.radius` give ``(query, candidate)`` rows as ``torch_cluster`` does, and
this module turns them around once, where the graph is made.
"""

from __future__ import annotations

import math
from typing import List, Optional, Union

import torch
from torch import Tensor

from meshops.errors import MeshError
from meshops.search.knn import knn
from meshops.search.knn import radius as radius_search
from meshops.utils.checks import num_samples

__all__ = ["FLOWS", "check_flow", "local_graph", "quantile_k"]

FLOWS = ("source_to_target", "target_to_source")


def check_flow(flow: str, where: str = "") -> None:
    """``flow`` is PyG's ``"source_to_target"`` or ``"target_to_source"``."""
    if flow not in FLOWS:
        raise MeshError(f"{where + ': ' if where else ''}flow must be 'source_to_target' or "
                        f"'target_to_source', got {flow!r}")


def quantile_k(quantile: float, num_src: Union[int, Tensor]) -> Union[int, Tensor]:
    r"""Neighbours selected by PiT's distance quantile: ``floor(q (N - 1)) + 1``.

    PiT (reference code) keeps the entries ``D_ij <= r_i^2`` of each row, with
    ``r_i^2 = torch.quantile(D_i, q)`` (linear interpolation: rank ``q (N - 1)``
    between the sorted values).  Without distance ties that is exactly the
    ``floor(q (N - 1)) + 1`` nearest points.  The rank is nudged up by a relative
    1e-12 so that a decimal ``q`` gives the exact count (``0.29 * 100`` is
    ``28.999999999999996`` in float64; 0.29 of 101 points is 30 points), as
    PiT's float32 reference gets it (the float32 rank rounds to 29.0); float64
    ``torch.quantile`` is data-dependent in that corner case (its interpolation
    weight ``1 - 4e-15`` may or may not round to the upper value).
    """
    if isinstance(num_src, Tensor):
        rank = quantile * (num_src.to(torch.float64) - 1)
        return torch.floor(rank * (1 + 1e-12)).long() + 1
    return math.floor(quantile * (num_src - 1) * (1 + 1e-12)) + 1


def local_graph(pos_src: Tensor, pos_dst: Tensor, k: Optional[int] = None,
                quantile: Optional[float] = None, batch_src: Optional[Tensor] = None,
                batch_dst: Optional[Tensor] = None, radius: Optional[float] = None,
                flow: str = "source_to_target") -> Tensor:
    """The neighbourhoods of the local layers: edges from the k nearest source points
    of each destination point, or from all source points within ``radius``.

    ``k`` is fixed, or per sample from ``quantile`` (:func:`quantile_k` of the
    sample's number of source points; samples with equal k share one search).
    A fixed ``k`` or ``quantile`` counts points, so the neighbourhood shrinks as the
    mesh is refined and follows the local point density; ``radius`` is a ball of
    fixed size, the only one of the three whose layer converges to one integral
    operator on every mesh (graded ones included).
    Self graphs (``pos_src is pos_dst``) contain the self loops (distance 0).
    Unlike :func:`meshops.knn_graph` (PyG's ``knn_graph``: one point set, no self
    loops by default) this joins two point sets and takes PiT's ``quantile``.

    Returns:
        LongTensor ``[2, E]`` in PyG's orientation: with ``flow="source_to_target"``
        row 0 source index, row 1 destination index (the ``edge_index`` that
        :class:`~meshops.nn.LocalPositionAttention` and
        :class:`~meshops.nn.LocalAttention` take); ``"target_to_source"`` swaps the
        rows. Edges are grouped by destination point, nearest first.

    Raises:
        ValueError (:class:`meshops.errors.MeshError`): k larger than a sample's
            number of source points, a sample with destination points but no
            source points, or an unknown ``flow``.
    """
    check_flow(flow)
    if sum(v is not None for v in (k, quantile, radius)) != 1:
        raise ValueError("give exactly one of k, quantile and radius")
    dst, src = _search(pos_src, pos_dst, k, quantile, batch_src, batch_dst, radius)
    return torch.stack([src, dst] if flow == "source_to_target" else [dst, src])


def _search(pos_src: Tensor, pos_dst: Tensor, k: Optional[int], quantile: Optional[float],
            batch_src: Optional[Tensor], batch_dst: Optional[Tensor],
            radius: Optional[float]) -> tuple[Tensor, Tensor]:
    """The search's ``(destination, source)`` rows of :func:`local_graph`."""
    if radius is not None:
        # No cap on the neighbour count: a truncated ball is no longer a quadrature.
        counts = (torch.bincount(batch_src) if batch_src is not None
                  else torch.tensor([pos_src.shape[0]]))
        e = radius_search(pos_src, pos_dst, radius, batch_src, batch_dst,
                          max_num_neighbors=max(int(counts.max()), 1))
        return e[0], e[1]
    if k is not None:
        e = knn(pos_src, pos_dst, k, batch_src, batch_dst)
        return e[0], e[1]
    if batch_src is None:
        e = knn(pos_src, pos_dst, quantile_k(quantile, pos_src.shape[0]), None, None)
        return e[0], e[1]
    size = num_samples(batch_src, batch_dst)
    counts = torch.bincount(batch_src, minlength=size)
    ks = quantile_k(quantile, counts)
    values = torch.unique(ks)
    if values.numel() == 1:
        e = knn(pos_src, pos_dst, max(int(values[0]), 1), batch_src, batch_dst)
        return e[0], e[1]
    dst: List[Tensor] = []
    src: List[Tensor] = []
    for kk in values.tolist():
        samples = (ks == kk).nonzero().view(-1)
        src_idx = torch.isin(batch_src, samples).nonzero().view(-1)
        dst_idx = torch.isin(batch_dst, samples).nonzero().view(-1)
        if dst_idx.numel() == 0:
            continue
        # consecutive sample ids inside the group
        e = knn(pos_src[src_idx], pos_dst[dst_idx], max(kk, 1),
                torch.searchsorted(samples, batch_src[src_idx]),
                torch.searchsorted(samples, batch_dst[dst_idx]))
        dst.append(dst_idx[e[0]])
        src.append(src_idx[e[1]])
    if not dst:
        empty = pos_src.new_empty(0, dtype=torch.long)
        return empty, empty
    return torch.cat(dst), torch.cat(src)
