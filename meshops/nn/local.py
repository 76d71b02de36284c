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
from typing import Optional, Sequence, Union

import torch
from torch import Tensor
from torch_geometric.utils import scatter, softmax

from meshops.nn._edge_sum import edge_sum
from meshops.nn._utils import safe_log
from meshops.nn.base import Channels, LocalAttentionBase, reset_linear
from meshops.nn.position import PositionParameters, head_values, project_heads

# the graph building is the search's (meshops.search.neighbourhoods); its names are
# part of this module's public face, as before
from meshops.search.neighbourhoods import check_flow, local_graph, quantile_k
from meshops.utils.checks import checking

__all__ = ["LocalPositionAttention", "LocalAttention", "local_graph", "quantile_k"]


# ------------------------------------------------------------------------ helpers
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


def _softmax(logits: Tensor, src: Tensor, dst: Tensor, weight: Tensor, n_dst: int) -> Tensor:
    """Sparse softmax over the edges of each destination, ``log w`` included.  A
    destination whose neighbours all have zero weight is an error (checked when
    :func:`meshops.utils.checks.checking`)."""
    if checking() and not bool((weight > 0).all()):
        mass = scatter(weight[src], dst, dim=0, dim_size=n_dst, reduce="sum")
        has_edge = torch.zeros(n_dst, dtype=torch.bool, device=dst.device)
        has_edge[dst] = True
        bad = (has_edge & (mass <= 0)).nonzero()
        if bad.numel():
            raise ValueError(f"destination point {int(bad[0])} has no neighbour with "
                             f"positive weight; its normalising integral is zero")
    logits = logits + safe_log(weight.to(logits.dtype))[src].unsqueeze(-1)
    return softmax(logits, dst, num_nodes=n_dst, dim=0)


# --------------------------------------------------------------------------- layers
class LocalPositionAttention(PositionParameters, LocalAttentionBase):
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
        heads (int): number of heads. (default: ``4``)
        k (int, optional): neighbours per destination point (``>= 1``).
        quantile (float, optional): PiT's locality quantile in ``(0, 1]``; give
            exactly one of ``k`` and ``quantile``.
        lam_init (float or sequence): initial :math:`\lambda` (one or one per
            head). (default: ``1.0``)
        bias (bool): bias in :math:`W_V`. (default: ``True``)
        flow (str): how ``edge_index`` is read, as in PyG's ``MessagePassing``:
            ``"source_to_target"`` (row 0 source, row 1 destination) or
            ``"target_to_source"`` (rows swapped). (default: ``"source_to_target"``)
        lam_param (str): ``"softplus"`` (default) or ``"exp"``, as in
            :class:`~meshops.nn.position.PositionAttention`.

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

    needs_x_dst = False

    def __init__(self, in_channels: int, out_channels: Optional[int] = None, heads: int = 4,
                 k: Optional[int] = None, quantile: Optional[float] = None,
                 lam_init: Union[float, Sequence[float]] = 1.0,
                 bias: bool = True, radius: Optional[float] = None,
                 flow: str = "source_to_target", lam_param: str = "softplus") -> None:
        super().__init__()
        check_flow(flow)
        self.flow = flow
        _check_k(k, quantile, radius)
        if sum(v is not None for v in (k, quantile, radius)) != 1:
            raise ValueError("give exactly one of k, quantile and radius")
        self._init_position_parameters(in_channels, out_channels, heads, lam_init, bias,
                                       lam_param)
        self.k = k
        self.quantile = None if quantile is None else float(quantile)
        self.radius = None if radius is None else float(radius)
        self.reset_parameters()

    def _edges_attend(self, x_src, x_dst, pos_src, pos_dst, src, dst, weight, n_dst):
        v = head_values(self, x_src)                                       # [Ns, H, c]
        diff = (pos_dst[dst] - pos_src[src]).to(v.dtype)
        dist = (diff * diff).sum(-1, keepdim=True)                         # [E, 1]
        alpha = _softmax(-dist * self.lam.to(v.dtype), src, dst, weight, n_dst)
        return project_heads(self, edge_sum(alpha, v, dst, src, n_dst))

    def _repr_extra(self) -> str:
        return LocalAttentionBase._repr_extra(self) + PositionParameters._repr_extra(self)


class LocalAttention(LocalAttentionBase):
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

    def __init__(self, in_channels: Channels, out_channels: Optional[int] = None,
                 heads: int = 4, k: Optional[int] = 16, bias: bool = True,
                 radius: Optional[float] = None, flow: str = "source_to_target") -> None:
        super().__init__()
        check_flow(flow)
        self.flow = flow
        self._init_channels(in_channels, out_channels, heads)
        if radius is not None:  # a ball replaces the default k
            k = None
        elif k is None:
            raise ValueError("give k or radius")
        _check_k(k, None, radius)
        self.radius = None if radius is None else float(radius)
        self.k = k
        self._init_projections(bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_linear(self.lin_q, self.lin_k, self.lin_v, self.lin_out)

    def _edges_attend(self, x_src, x_dst, pos_src, pos_dst, src, dst, weight, n_dst):
        H, c = self.heads, self.out_channels // self.heads
        q = self.lin_q(x_dst).view(-1, H, c)
        k = self.lin_k(x_src).view(-1, H, c)
        v = self.lin_v(x_src).view(-1, H, c)
        logits = (q[dst] * k[src]).sum(-1) / math.sqrt(c)                   # [E, H]
        alpha = _softmax(logits, src, dst, weight, n_dst)
        out = edge_sum(alpha, v, dst, src, n_dst)
        return self.lin_out(out.view(n_dst, H * c))
