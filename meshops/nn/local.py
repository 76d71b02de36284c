r"""Attention restricted to the k nearest source points of each destination point.

Both layers evaluate a quadrature-weighted softmax over the edges of a kNN graph
(:func:`meshops.search.knn`), with :func:`torch_geometric.utils.softmax` grouping
the edges by destination point:

* :class:`LocalPositionAttention` - PiT's local position attention (§2.2, eq. (10)):
  the input-independent kernel ``softmax(-lambda_h |x_i - y_j|^2 + log w_j)`` on the
  ball holding the k nearest source points, with k given directly or from PiT's
  per-row distance quantile ``q``: ``k = floor(q (N_src - 1)) + 1``.
* :class:`LocalAttention` - content-based continuum attention
  ``softmax(q_i . k_j / sqrt(d) + log w_j) v_j`` on the same neighbourhoods.

Edge convention, PyG's (``MessagePassing`` with ``flow="source_to_target"``, and
:func:`meshops.knn_graph`): ``edge_index[0]`` indexes the source points (the
neighbours whose values are aggregated), ``edge_index[1]`` the destination points
(that receive). Layers built with ``flow="target_to_source"`` take the rows swapped.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import scatter, softmax

from meshops.nn._edge_sum import edge_sum
from meshops.nn._utils import (as_pair, check_batch, check_channels, check_length,
                               check_weight, num_graphs, safe_log)
from meshops.nn.position import (PositionParameters, head_values, project_after,
                                 project_heads)

__all__ = ["LocalPositionAttention", "LocalAttention", "local_graph", "quantile_k"]

_FLOWS = ("source_to_target", "target_to_source")

Channels = Union[int, Tuple[int, int]]
PairOrTensor = Union[Tensor, Tuple[Optional[Tensor], Optional[Tensor]]]


# --------------------------------------------------------------------------- graph
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
        :class:`LocalPositionAttention` and :class:`LocalAttention` take);
        ``"target_to_source"`` swaps the rows.

    Raises:
        ValueError (:class:`meshops.errors.MeshError`): k larger than a sample's
            number of source points, a sample with destination points but no
            source points, or an unknown ``flow``.
    """
    _check_flow(flow)
    edge = _dst_src_graph(pos_src, pos_dst, k, quantile, batch_src, batch_dst, radius)
    return edge.flip(0) if flow == "source_to_target" else edge


def knn_graph(*args, **kwargs):
    """Removed: renamed :func:`local_graph` (PyG's orientation); raises ``TypeError``.

    This function had PyG's name but neither its signature nor its orientation
    (destination in row 0); it fails loudly rather than give a graph that a layer
    would silently read the other way round.
    """
    raise TypeError("meshops.nn.knn_graph(pos_src, pos_dst, k, quantile, ...) was renamed "
                    "meshops.nn.local_graph, which returns PyG's orientation (row 0 source, "
                    "row 1 destination; the old function put the destination in row 0); "
                    "for PyG's knn_graph(x, k, batch, loop, flow) use meshops.knn_graph")


def _check_flow(flow: str) -> None:
    if flow not in _FLOWS:
        raise ValueError(f"flow must be 'source_to_target' or 'target_to_source', got {flow!r}")


def _dst_src_graph(pos_src: Tensor, pos_dst: Tensor, k: Optional[int],
                   quantile: Optional[float], batch_src: Optional[Tensor],
                   batch_dst: Optional[Tensor], radius: Optional[float]) -> Tensor:
    """:func:`local_graph` in the search's layout: row 0 destination, row 1 source."""
    from meshops.search import knn, radius as radius_graph

    if sum(v is not None for v in (k, quantile, radius)) != 1:
        raise ValueError("give exactly one of k, quantile and radius")
    if radius is not None:
        # No cap on the neighbour count: a truncated ball is no longer a quadrature.
        counts = (torch.bincount(batch_src) if batch_src is not None
                  else torch.tensor([pos_src.shape[0]]))
        return radius_graph(pos_src, pos_dst, radius, batch_src, batch_dst,
                            max_num_neighbors=max(int(counts.max()), 1))
    if k is not None:
        return knn(pos_src, pos_dst, k, batch_src, batch_dst)
    if batch_src is None:
        return knn(pos_src, pos_dst, quantile_k(quantile, pos_src.shape[0]), None, None)
    size = num_graphs(batch_src, batch_dst)
    counts = torch.bincount(batch_src, minlength=size)
    ks = quantile_k(quantile, counts)
    values = torch.unique(ks)
    if values.numel() == 1:
        return knn(pos_src, pos_dst, max(int(values[0]), 1), batch_src, batch_dst)
    edges: List[Tensor] = []
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
        edges.append(torch.stack([dst_idx[e[0]], src_idx[e[1]]]))
    return torch.cat(edges, 1) if edges else pos_src.new_empty(2, 0, dtype=torch.long)


# ------------------------------------------------------------------------ helpers
def _check_x(x: Optional[Tensor], channels: int, name: str) -> None:
    if not isinstance(x, Tensor) or x.dim() != 2:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a [N, C] tensor, got {got}")
    if x.shape[-1] != channels:
        raise ValueError(f"{name} has {x.shape[-1]} channels, expected {channels}")


def _check_k(k: Optional[int], quantile: Optional[float], radius: Optional[float] = None
             ) -> None:
    if radius is not None and not (isinstance(radius, (int, float)) and not isinstance(radius, bool)
                                   and math.isfinite(radius) and radius > 0):
        raise ValueError(f"radius must be a positive finite number, got {radius!r}")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if quantile is not None and not (isinstance(quantile, (int, float))
                                     and 0.0 < quantile <= 1.0):
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")


def _src_dst(edge_index: Tensor, flow: str, n_src: int, n_dst: int) -> Tuple[Tensor, Tensor]:
    """Checked ``(source, destination)`` rows of an ``edge_index`` given with ``flow``."""
    rows = ("source", "destination") if flow == "source_to_target" else ("destination", "source")
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 \
            or edge_index.shape[0] != 2 or edge_index.dtype != torch.long:
        got = (f"{tuple(edge_index.shape)} {edge_index.dtype}" if isinstance(edge_index, Tensor)
               else type(edge_index).__name__)
        raise ValueError(f"edge_index must be a LongTensor [2, E] (row 0 {rows[0]}, row 1 "
                         f"{rows[1]}; flow={flow!r}), got {got}")
    sizes = {"source": n_src, "destination": n_dst}
    if edge_index.numel():
        for row, name in enumerate(rows):
            n = sizes[name]
            if int(edge_index[row].min()) < 0 or int(edge_index[row].max()) >= n:
                raise ValueError(f"edge_index[{row}] ({name}, flow={flow!r}) out of range "
                                 f"[0, {n})")
    if flow == "source_to_target":
        return edge_index[0], edge_index[1]
    return edge_index[1], edge_index[0]


class _LocalBase(torch.nn.Module):
    """Input validation, graph construction and the dense form shared by the layers."""

    heads: int
    out_channels: int
    k: Optional[int]
    quantile: Optional[float]
    radius: Optional[float] = None

    def _inputs(self, x: PairOrTensor, pos: PairOrTensor, weight: Tensor,
                batch: PairOrTensor, need_dst: bool):
        cross = isinstance(x, (tuple, list))
        x_src, x_dst = as_pair(x)
        pos_src, pos_dst = as_pair(pos)
        b_src, b_dst = as_pair(batch)
        _check_x(x_src, self.in_src, "x_src" if cross else "x")
        if need_dst:
            _check_x(x_dst, self.in_dst, "x_dst" if cross else "x")
        for name, p in (("pos_src", pos_src), ("pos_dst", pos_dst)):
            if not isinstance(p, Tensor) or p.dim() != 2 or not p.is_floating_point():
                got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
                raise ValueError(f"{name} must be a floating [N, d] tensor, got {got}")
        if pos_src.shape[1] != pos_dst.shape[1]:
            raise ValueError(f"pos_src and pos_dst have different dimensions "
                             f"({pos_src.shape[1]} and {pos_dst.shape[1]})")
        n_src, n_dst = x_src.shape[0], pos_dst.shape[0]
        check_length(pos_src, n_src, "pos_src")
        if need_dst:
            check_length(x_dst, n_dst, "x_dst")
        if (b_src is None) != (b_dst is None):
            raise ValueError("batch_src and batch_dst must both be given or both be None")
        check_length(b_src, n_src, "batch_src")
        check_length(b_dst, n_dst, "batch_dst")
        check_batch(b_src, "batch_src")
        check_batch(b_dst, "batch_dst")
        check_weight(weight, n_src)
        return x_src, x_dst, pos_src, pos_dst, b_src, b_dst, weight

    flow: str = "source_to_target"

    def graph(self, pos: PairOrTensor, batch: PairOrTensor = None) -> Tensor:
        """The layer's neighbourhood graph ``[2, E]`` in the layer's ``flow`` (PyG's
        default: row 0 source, row 1 destination), to reuse across layers with the
        same neighbourhoods (``forward(..., edge_index=...)``); :func:`local_graph`."""
        pos_src, pos_dst = as_pair(pos)
        b_src, b_dst = as_pair(batch)
        return local_graph(pos_src, pos_dst, self.k, self.quantile, b_src, b_dst, self.radius,
                           flow=self.flow)

    def _edges(self, edge_index: Optional[Tensor], pos_src: Tensor, pos_dst: Tensor,
               b_src: Optional[Tensor], b_dst: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """``(source, destination)`` index of every edge: the given ``edge_index``
        (checked, read with the layer's ``flow``) or the layer's own search."""
        if edge_index is None:
            # the search's own layout, no flip
            dst, src = _dst_src_graph(pos_src, pos_dst, self.k, self.quantile, b_src, b_dst,
                                      self.radius)
            return src, dst
        return _src_dst(edge_index, self.flow, pos_src.shape[0], pos_dst.shape[0])

    def _softmax(self, logits: Tensor, src: Tensor, dst: Tensor, weight: Tensor, n_dst: int
                 ) -> Tensor:
        """Sparse softmax over the edges of each destination, ``log w`` included."""
        if not bool((weight > 0).all()):
            mass = scatter(weight[src], dst, dim=0, dim_size=n_dst, reduce="sum")
            has_edge = torch.zeros(n_dst, dtype=torch.bool, device=dst.device)
            has_edge[dst] = True
            bad = (has_edge & (mass <= 0)).nonzero()
            if bad.numel():
                raise ValueError(f"destination point {int(bad[0])} has no neighbour with "
                                 f"positive weight; its normalising integral is zero")
        logits = logits + safe_log(weight.to(logits.dtype))[src].unsqueeze(-1)
        return softmax(logits, dst, num_nodes=n_dst, dim=0)

    def dense(self, x: PairOrTensor, pos: PairOrTensor, weight: Tensor,
              mask: PairOrTensor = None) -> Tensor:
        """Dense form: ``x [B, N, C]`` (or ``(x_src, x_dst)``; ``x_dst`` may be None for
        position attention), ``pos [N, d]`` (shared) or ``[B, N, d]`` (or a pair),
        ``weight [Ns]`` or ``[B, Ns]``, ``mask [B, N]`` or ``(mask_src, mask_dst)``.
        Padded points are removed (they are neither neighbours nor queries); returns
        ``[B, Nd, out_channels]`` with zeros on padded rows."""
        cross = isinstance(x, (tuple, list))
        x_src, x_dst = as_pair(x)
        pos_src, pos_dst = as_pair(pos)
        m_src, m_dst = as_pair(mask)
        if not isinstance(x_src, Tensor) or x_src.dim() != 3:
            raise ValueError("x must be a [B, N, C] tensor")
        B, Ns = x_src.shape[:2]
        if x_dst is not None and (x_dst.dim() != 3 or x_dst.shape[0] != B):
            raise ValueError(f"x_dst must be [{B}, N_dst, C]")
        Nd = pos_dst.shape[-2]

        def full(m: Optional[Tensor], n: int, name: str) -> Tensor:
            if m is None:
                return torch.ones(B, n, dtype=torch.bool, device=x_src.device)
            if m.shape != (B, n):
                raise ValueError(f"{name} has shape {tuple(m.shape)}, expected {(B, n)}")
            return m.to(torch.bool)

        m_src = full(m_src, Ns, "mask_src" if cross else "mask")
        m_dst = full(m_dst, Nd, "mask_dst" if cross else "mask")
        for name, p, n in (("pos_src", pos_src, Ns), ("pos_dst", pos_dst, Nd)):
            if not isinstance(p, Tensor) or p.dim() not in (2, 3) or p.shape[-2] != n \
                    or (p.dim() == 3 and p.shape[0] != B):
                raise ValueError(f"{name} must be [{n}, d] or [{B}, {n}, d]")
        if not isinstance(weight, Tensor) or weight.shape not in ((Ns,), (B, Ns)):
            raise ValueError(f"weight must be [{Ns}] or [{B}, {Ns}], got "
                             f"{tuple(weight.shape) if isinstance(weight, Tensor) else weight}")
        ar = torch.arange(B, device=x_src.device)
        b_src = ar[:, None].expand(B, Ns)[m_src]
        b_dst = ar[:, None].expand(B, Nd)[m_dst]
        ps = pos_src.expand(B, Ns, pos_src.shape[-1])[m_src]
        pd = pos_dst.expand(B, Nd, pos_dst.shape[-1])[m_dst]
        w = weight.expand(B, Ns)[m_src]
        xs = x_src[m_src]
        xd = None if x_dst is None else x_dst[m_dst]
        out = self((xs, xd), (ps, pd), w, (b_src, b_dst))
        dense = out.new_zeros(B, Nd, out.shape[-1])
        dense[m_dst] = out
        return dense

    def _repr_k(self) -> str:
        if self.radius is not None:
            return f"radius={self.radius}"
        return f"quantile={self.quantile}" if self.quantile is not None else f"k={self.k}"


# --------------------------------------------------------------------------- layers
class LocalPositionAttention(PositionParameters, _LocalBase):
    r"""PiT's local position attention on the kNN graph, with quadrature weights.

    PiT eq. (10) with the source weights :math:`w_j` in the softmax:

    .. math::
        \mathrm{LocPosAtt}(U)^{(h)}_i = \sum_{j \in \mathcal{N}_k(i)}
            \frac{w_j \exp(-\lambda_h \|x_i - y_j\|^2)}
                 {\sum_{l \in \mathcal{N}_k(i)} w_l \exp(-\lambda_h \|x_i - y_l\|^2)}
            (U W_V)^{(h)}_j ,

    where :math:`\mathcal{N}_k(i)` are the k source points nearest to the
    destination point :math:`x_i` (PiT's ball :math:`D_{ij} \le r_i^2`).  With
    ``quantile=q``, :math:`r_i^2` is PiT's q-quantile of row i of the distance
    matrix, i.e. ``k = floor(q (N_src - 1)) + 1`` per sample (:func:`quantile_k`;
    PiT uses q = 0.5%-8% in its encoders/decoders).  With distance ties (e.g. on
    structured grids) PiT's ball also holds every point tied with the k-th one,
    while the kNN graph keeps exactly k (ties broken by the search backend).  Self
    (one mesh, each point
    its own neighbour) and cross (source mesh -> destination mesh).  Each head has
    its own :math:`\lambda_h = \mathrm{softplus}(\rho_h) > 0` and its slice of the
    ``out_channels`` of :math:`U W_V`; heads are concatenated.

    The softmax over each destination's edges runs through
    :func:`torch_geometric.utils.softmax` and the weighted values are summed as a
    sparse-matrix product (CSR, :mod:`meshops.nn._edge_sum`), so no per-edge message
    tensor is formed: memory is ``O(N_dst k heads)`` for the kernel.
    Pass ``edge_index`` (e.g. from :meth:`graph`) to reuse a graph across layers.

    Note that a kNN ball shrinks as the mesh is refined (fixed k) - a fixed
    ``quantile`` keeps the ball's share of the domain fixed, as in PiT.

    Args:
        in_channels (int): source feature channels.
        out_channels (int, optional): output channels, divisible by ``heads``.
            Defaults to ``in_channels``.
        heads (int): number of heads. (default: ``1``)
        k (int, optional): neighbours per destination point (``>= 1``).
        quantile (float, optional): PiT's locality quantile in ``(0, 1]``; give
            exactly one of ``k`` and ``quantile``.
        lam_init (float or sequence): initial :math:`\lambda` (one or one per
            head). (default: ``1.0``)
        bias (bool): bias in :math:`W_V`. (default: ``True``)
        flow (str): how ``edge_index`` is read, as in PyG's ``MessagePassing``:
            ``"source_to_target"`` (row 0 source, row 1 destination) or
            ``"target_to_source"`` (rows swapped). (default: ``"source_to_target"``)

    Shapes:
        - **input:** ``x [Ns, C]`` or ``(x_src [Ns, C], x_dst or None)``,
          ``pos [N, d]`` or ``(pos_src [Ns, d], pos_dst [Nd, d])``, ``weight [Ns]``,
          ``batch [N]`` or ``(batch_src, batch_dst)`` (sorted), optional,
          ``edge_index [2, E]`` (PyG's orientation: row 0 source, row 1
          destination; swapped with ``flow="target_to_source"``), optional
        - **output:** ``[Nd, out_channels]``
        - **dense (:meth:`dense`):** ``x [B, Ns, C]``, ``pos [N, d]`` or
          ``[B, N, d]``, ``weight [Ns]`` or ``[B, Ns]``, ``mask`` -> ``[B, Nd, out]``

    Raises:
        ValueError: invalid channels/heads, ``k < 1``, ``quantile`` outside
            ``(0, 1]``, both or neither of them; at call time mismatched lengths,
            invalid weights, k larger than a sample's source points
            (:class:`meshops.errors.MeshError`), or a destination point whose
            neighbours all have zero weight.
    """

    def __init__(self, in_channels: int, out_channels: Optional[int] = None, heads: int = 1,
                 k: Optional[int] = None, quantile: Optional[float] = None,
                 lam_init: Union[float, Sequence[float]] = 1.0,
                 bias: bool = True, radius: Optional[float] = None,
                 flow: str = "source_to_target") -> None:
        super().__init__()
        _check_flow(flow)
        self.flow = flow
        if not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f"in_channels must be a positive int, got {in_channels!r}")
        out_channels = in_channels if out_channels is None else out_channels
        check_channels(out_channels, heads, "out_channels")
        _check_k(k, quantile, radius)
        if sum(v is not None for v in (k, quantile, radius)) != 1:
            raise ValueError("give exactly one of k, quantile and radius")
        self.in_channels = self.in_src = self.in_dst = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.k = k
        self.quantile = None if quantile is None else float(quantile)
        self.radius = None if radius is None else float(radius)
        self._init_position_parameters(in_channels, out_channels, heads, lam_init, bias)
        self.reset_parameters()

    def forward(self, x: PairOrTensor, pos: PairOrTensor, weight: Tensor,
                batch: PairOrTensor = None, edge_index: Optional[Tensor] = None) -> Tensor:
        """Flat (PyG) form; see the class docstring.  ``edge_index`` (row 0 source, row 1
        destination as in PyG, e.g. from :meth:`graph` or :func:`meshops.knn_graph`)
        replaces the kNN search."""
        x_src, _, pos_src, pos_dst, b_src, b_dst, weight = self._inputs(
            x, pos, weight, batch, need_dst=False)
        n_dst = pos_dst.shape[0]
        src, dst = self._edges(edge_index, pos_src, pos_dst, b_src, b_dst)
        v = head_values(self, x_src)                                       # [Ns, H, c]
        diff = (pos_dst[dst] - pos_src[src]).to(v.dtype)
        dist = (diff * diff).sum(-1, keepdim=True)                         # [E, 1]
        alpha = self._softmax(-dist * self.lam.to(v.dtype), src, dst, weight, n_dst)
        out = edge_sum(alpha, v, dst, src, n_dst)
        return project_heads(self, out)

    @property
    def project_after(self) -> bool:
        """Apply :math:`W_V` after the kernel (``heads * in_channels < out_channels``;
        exact since the kernel's rows sum to 1), so that the messages carry the
        narrower input channels."""
        return project_after(self)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads}, {self._repr_k()})")


class LocalAttention(_LocalBase):
    r"""Content-based continuum attention restricted to the k nearest source points.

    .. math::
        A(x)^{(h)}_i = \sum_{j \in \mathcal{N}_k(i)}
            \mathrm{softmax}_{j \in \mathcal{N}_k(i)}
            \big(q^{(h)}_i \cdot k^{(h)}_j / \sqrt{d} + \log w_j\big)\, v^{(h)}_j ,
        \qquad \mathrm{out}_i = W_O [A^{(1)}_i, \dots, A^{(H)}_i],

    with :math:`q_i = W_Q x^{dst}_i`, :math:`k_j = W_K x^{src}_j`,
    :math:`v_j = W_V x^{src}_j`, :math:`d` the head dimension and
    :math:`\mathcal{N}_k(i)` the k source points nearest to destination point i
    (:func:`meshops.search.knn`).  This is continuum attention
    (:class:`~meshops.nn.continuum.ContinuumAttention`) with the integral restricted
    to a neighbourhood; the quadrature weights make the neighbourhood sum an integral
    over the ball.  Sparse softmax via :func:`torch_geometric.utils.softmax`.  Self
    and cross (queries from ``x_dst``, keys/values from ``x_src``); pass
    ``edge_index`` to reuse a graph.

    Args:
        in_channels (int or tuple): input channels, or ``(src, dst)`` channels.
        out_channels (int, optional): width of the projections and the output,
            divisible by ``heads``. Defaults to the destination's ``in_channels``.
        heads (int): number of heads. (default: ``4``)
        k (int): neighbours per destination point. (default: ``16``)
        bias (bool): biases in the projections. (default: ``True``)
        flow (str): how ``edge_index`` is read, as in PyG's ``MessagePassing``:
            ``"source_to_target"`` (row 0 source, row 1 destination) or
            ``"target_to_source"`` (rows swapped). (default: ``"source_to_target"``)

    Shapes:
        - **input:** ``x [N, C]`` or ``(x_src [Ns, Cs], x_dst [Nd, Cd])``,
          ``pos [N, d]`` or ``(pos_src, pos_dst)``, ``weight [Ns]``, ``batch``
          optional, ``edge_index [2, E]`` (PyG's orientation: row 0 source, row 1
          destination; swapped with ``flow="target_to_source"``) optional
        - **output:** ``[Nd, out_channels]``
        - **dense (:meth:`dense`):** as :class:`LocalPositionAttention`, with ``x_dst``

    Raises:
        ValueError: invalid channels/heads, ``k < 1``; at call time as
            :class:`LocalPositionAttention`, or a missing ``x_dst``.
    """

    quantile = None

    def __init__(self, in_channels: Channels, out_channels: Optional[int] = None,
                 heads: int = 4, k: Optional[int] = 16, bias: bool = True,
                 radius: Optional[float] = None, flow: str = "source_to_target") -> None:
        super().__init__()
        _check_flow(flow)
        self.flow = flow
        src, dst = as_pair(in_channels)
        for ch in (src, dst):
            if not isinstance(ch, int) or ch < 1:
                raise ValueError(f"in_channels must be a positive int or a (src, dst) pair of "
                                 f"them, got {in_channels!r}")
        out_channels = dst if out_channels is None else out_channels
        check_channels(out_channels, heads, "out_channels")
        if radius is not None:  # a ball replaces the default k
            k = None
        elif k is None:
            raise ValueError("give k or radius")
        _check_k(k, None, radius)
        self.radius = None if radius is None else float(radius)
        self.in_channels = in_channels
        self.in_src, self.in_dst = src, dst
        self.out_channels = out_channels
        self.heads = heads
        self.k = k
        self.lin_q = torch.nn.Linear(dst, out_channels, bias=bias)
        self.lin_k = torch.nn.Linear(src, out_channels, bias=bias)
        self.lin_v = torch.nn.Linear(src, out_channels, bias=bias)
        self.lin_out = torch.nn.Linear(out_channels, out_channels, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_q, self.lin_k, self.lin_v, self.lin_out):
            torch.nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                torch.nn.init.zeros_(lin.bias)

    def forward(self, x: PairOrTensor, pos: PairOrTensor, weight: Tensor,
                batch: PairOrTensor = None, edge_index: Optional[Tensor] = None) -> Tensor:
        """Flat (PyG) form; see the class docstring.  ``edge_index`` (row 0 source, row 1
        destination as in PyG, e.g. from :meth:`graph` or :func:`meshops.knn_graph`)
        replaces the kNN search."""
        x_src, x_dst, pos_src, pos_dst, b_src, b_dst, weight = self._inputs(
            x, pos, weight, batch, need_dst=True)
        n_dst = x_dst.shape[0]
        src, dst = self._edges(edge_index, pos_src, pos_dst, b_src, b_dst)
        H, c = self.heads, self.out_channels // self.heads
        q = self.lin_q(x_dst).view(-1, H, c)
        k = self.lin_k(x_src).view(-1, H, c)
        v = self.lin_v(x_src).view(-1, H, c)
        logits = (q[dst] * k[src]).sum(-1) / math.sqrt(c)                   # [E, H]
        alpha = self._softmax(logits, src, dst, weight, n_dst)
        out = edge_sum(alpha, v, dst, src, n_dst)
        return self.lin_out(out.view(n_dst, H * c))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads}, {self._repr_k()})")
