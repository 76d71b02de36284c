"""Slice attention: learned soft partitions of the domain into a few tokens, attention
among the tokens, and back to the points; every token a quadrature integral."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from meshops.nn._utils import merge_heads, split_heads
from meshops.nn.base import Channels, GlobalAttentionBase, reset_linear
from meshops.utils.checks import checking

__all__ = ["SliceAttention"]


class SliceAttention(GlobalAttentionBase):
    r"""Multi-head slice attention with quadrature weights.

    Transolver (Wu et al., "Transolver: A Fast Transformer Solver for PDEs on General
    Geometries", ICML 2024, §3.1) attends among ``M`` learned *slices* of the domain
    rather than among its ``N`` points: each point belongs softly to every slice, a
    slice's token is the mean of the features of its points, the tokens attend to each
    other, and each point reads back the tokens of its slices. Written as integrals over
    the domain with the mesh's quadrature rule :math:`\{(x_i, w_i)\}`, per head, with
    :math:`f_i = W_F u(x_i)` and the head dimension :math:`d`:

    .. math::
        s_{ij} = \mathrm{softmax}_j\big(W_S W_X u(x_i) / \tau\big), \qquad
        z_j = \frac{\sum_i w_i\, s_{ij}\, f_i}{\sum_i w_i\, s_{ij}}
            \approx \frac{\int s_j(x) f(x)\,dx}{\int s_j(x)\,dx},

    .. math::
        z' = \mathrm{softmax}\big(Q K^\top / \sqrt{d}\big) V
             \quad (Q, K, V = W_{Q,K,V}\, z), \qquad
        A(u)(y_i) = W_O \big[\textstyle\sum_j s_{ij}(y_i)\, z'_j\big]_{\text{heads}} .

    The slice weights :math:`s_{ij}` are a partition of unity at every point (softmax
    over the slices) with a learned temperature :math:`\tau > 0` per head; with
    ``adaptive_temperature`` (Transolver++, Luo et al., ICML 2025, §3.2) each point has
    its own, :math:`\tau_i = \tau \exp(w_\tau^\top W_X u(x_i) + b_\tau)` per head
    (:math:`w_\tau, b_\tau` start at zero: the layer starts as the plain one), so that
    slices can be sharp where the field changes fast and smooth elsewhere. A pointwise
    temperature keeps every token a quadrature integral.

    With ``min_measure`` :math:`= \mu > 0`, a token weighs in the attention among the
    tokens by how much more than :math:`\mu` its slice covers, with
    :math:`m_j = \sum_i w_i s_{ij} / \sum_i w_i` the fraction of the domain in slice
    :math:`j`:

    .. math::
        z'_j = \frac{\sum_k g_k \exp(q_j^\top k_k / \sqrt{d})\, v_k}
                     {\sum_k g_k \exp(q_j^\top k_k / \sqrt{d})}, \qquad
        g_k = \frac{m_k}{m_k + \mu}

    (a bias :math:`\log g_k` on the logits): slices much larger than :math:`\mu` attend as
    in the plain layer (:math:`g_k \approx 1`), slices much smaller weigh their measure
    (:math:`g_k \approx m_k / \mu`). A slice that covers less than the mesh resolves (its
    token a few points' values rather than an integral) otherwise enters every other
    token's attention as fully as a slice of half the domain, and when the mesh is
    refined its token changes and moves all the others (measured on a graded re-mesh of
    the obstacle stand-in: docs/accuracy.md). :math:`\mu` is a fraction of the domain,
    not of a cell: the same operator on every mesh.

    Transolver
    averages each slice over the *points* (:math:`w_i = 1`), so a region meshed more
    finely weighs more in its token; with quadrature weights the tokens are integrals
    over the domain, independent of how it is meshed, and the layer is a
    discretisation-consistent operator like the others of :mod:`meshops.nn` (tested
    under refinement). Cost: ``O(N M d)`` per head, linear in ``N``.

    Cross form: queries ``y`` with features of their own read the tokens of the
    source through their own slice weights :math:`s_{ij}(y_i)` (the same projections),
    so the output can be evaluated at other points than the inputs.

    Args:
        in_channels (int or tuple): input channels, or ``(src, dst)`` channels.
        out_channels (int, optional): output channels and the width of the per-head
            projections (divisible by ``heads``). Defaults to the destination's
            ``in_channels``.
        heads (int): heads. (default: ``4``)
        slices (int): slices ``M`` per head. (default: ``32``)
        temperature (float): initial :math:`\tau` (Transolver: 0.5). (default: ``0.5``)
        bias (bool): biases in the projections. (default: ``True``)
        adaptive_temperature (bool): a temperature per point and head (see above).
            (default: ``False``)
        min_measure (float): the fraction of the domain :math:`\mu` below which a slice's
            token is muted in the attention among the tokens (see above; ``0``: never).
            (default: ``0``)

    Shapes:
        - **input (flat):** ``x [N, C]`` or ``(x_src [Ns, Cs], x_dst [Nd, Cd])``,
          ``pos`` ignored (may be ``None``), ``weight [Ns]``, ``batch [N]`` (or a pair)
        - **output (flat):** ``[Nd, out_channels]``
        - **input/output (dense, :meth:`dense`):** a leading batch dimension, ``weight
          [B, Ns]``, ``mask [B, N]``; output ``[B, Nd, out_channels]`` (zeros on
          padding)

    Raises:
        ValueError: invalid sizes; weights that are negative, non-finite or of the
            wrong length; a sample with destination points but no source weight.
    """

    #: the smallest mass a slice is divided by, relative to the sample's measure
    EPS = 1e-6
    #: the smallest temperature (Transolver clamps it to [0.5, 5]; lower lets slices sharpen)
    MIN_TEMPERATURE = 0.05

    def __init__(self, in_channels: Channels, out_channels: Optional[int] = None,
                 heads: int = 4, slices: int = 32, temperature: float = 0.5,
                 bias: bool = True, adaptive_temperature: bool = False,
                 min_measure: float = 0.0) -> None:
        super().__init__()
        self._init_channels(in_channels, out_channels, heads)
        if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
            raise ValueError(f"slices must be a positive integer, got {slices!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.slices, self.init_temperature = slices, float(temperature)
        if not (isinstance(min_measure, (int, float)) and 0 <= min_measure < 1):
            raise ValueError(f"min_measure must be a fraction of the domain in [0, 1), got "
                             f"{min_measure!r}")
        self.min_measure = float(min_measure)
        self.head_channels = self.out_channels // heads
        d = self.head_channels
        # per head: the features read into the tokens (W_F) and those that choose the
        # slices (W_X, then W_S), from the source; the destination's choose its slices
        self.lin_f = torch.nn.Linear(self.in_src, self.out_channels, bias=bias)
        self.lin_x = torch.nn.Linear(self.in_src, self.out_channels, bias=bias)
        self.lin_x_dst = (torch.nn.Linear(self.in_dst, self.out_channels, bias=bias)
                          if self.in_dst != self.in_src else None)
        self.lin_slice = torch.nn.Linear(d, slices, bias=bias)
        self.lin_qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.lin_out = torch.nn.Linear(self.out_channels, self.out_channels, bias=bias)
        self.log_temperature = torch.nn.Parameter(torch.empty(heads))
        # per head, the log-temperature offset of each point
        self.lin_temperature = torch.nn.Linear(d, 1) if adaptive_temperature else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_linear(*(m for m in (self.lin_f, self.lin_x, self.lin_x_dst, self.lin_qkv,
                                   self.lin_out) if m is not None))
        # orthogonal slice projections (Transolver's choice): distinct initial slices
        torch.nn.init.orthogonal_(self.lin_slice.weight)
        if self.lin_slice.bias is not None:
            torch.nn.init.zeros_(self.lin_slice.bias)
        with torch.no_grad():
            self.log_temperature.fill_(math.log(self.init_temperature))
        if self.lin_temperature is not None:
            torch.nn.init.zeros_(self.lin_temperature.weight)
            torch.nn.init.zeros_(self.lin_temperature.bias)

    def slice_weights(self, x: Tensor, lin_x: torch.nn.Linear) -> Tensor:
        """``s [B, H, N, M]``: each point's soft membership of the ``M`` slices of every
        head (sums to 1 over the slices), from its features ``x [B, N, C]``."""
        h = split_heads(lin_x(x), self.heads)                         # [B, H, N, d]
        log_tau = self.log_temperature.to(h.dtype)[None, :, None, None]
        if self.lin_temperature is not None:
            log_tau = log_tau + self.lin_temperature(h)                # [B, H, N, 1]
        tau = log_tau.exp().clamp(min=self.MIN_TEMPERATURE)
        return torch.softmax(self.lin_slice(h) / tau, dim=-1)        # [B, H, N, M]

    def fractions(self, weight: Tensor, dtype: torch.dtype, dst_points: int,
                  m_dst: Optional[Tensor] = None) -> Tensor:
        """``weight [B, Ns]`` as fractions of each sample's measure (the tokens are
        ratios of integrals, unchanged by the scale; :attr:`EPS` is then relative to the
        measure), in ``dtype``. A sample with destination points (``dst_points`` of
        them, or those of ``m_dst [B, Nd]``) must have a source point of positive weight
        (checked when :func:`~meshops.utils.checks.checking`)."""
        weight = weight.to(dtype)
        total = weight.sum(-1, keepdim=True)
        if checking():
            has_dst = (torch.full_like(total[:, 0], dst_points > 0, dtype=torch.bool)
                       if m_dst is None else m_dst.any(-1))
            bad = (has_dst & ~(total[:, 0] > 0)).nonzero()
            if bad.numel():
                raise ValueError(f"sample {int(bad[0])} has destination points but no source "
                                 f"point with positive weight; slice attention integrates "
                                 f"over the source and is undefined")
        return weight / torch.where(total > 0, total, torch.ones_like(total))

    def integrals(self, x: Tensor, weight: Tensor,
                  slices: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """``(mass [B, H, M], moments [B, H, M, d])``: the quadrature sums
        :math:`\\sum_i w_i s_{ij}` and :math:`\\sum_i w_i s_{ij} f_i` of the source points
        ``x [B, N, C]`` with weights ``weight [B, N]`` (fractions, :meth:`fractions`),
        their slice weights ``slices [B, H, N, M]`` computed here unless given. Sums over
        the points: those of parts of the points add up to those of all of them."""
        s = self.slice_weights(x, self.lin_x) if slices is None else slices
        f = split_heads(self.lin_f(x), self.heads)                     # [B, H, N, d]
        # the weights go on the d features, not on the M > d slice weights: fewer
        # products over the points, forward and backward
        mass = torch.einsum("bhnm,bn->bhm", s, weight)
        return mass, torch.einsum("bhnm,bhnd->bhmd", s, weight[:, None, :, None] * f)

    def tokens(self, mass: Tensor, moments: Tensor) -> Tensor:
        """``z' [B, H, M, d]``: the slice tokens (moments over mass) after the attention
        among them, a slice of measure below ``min_measure`` muted (a
        :math:`\\log(m_k / (m_k + \\mu))` bias on the logits); from :meth:`integrals`."""
        z = moments / (mass + self.EPS)[..., None]
        q, k, v = self.lin_qkv(z).chunk(3, dim=-1)
        bias = None
        if self.min_measure > 0:
            tiny = torch.finfo(mass.dtype).tiny
            share = mass / (mass + self.min_measure)
            bias = share.clamp_min(tiny).log()[:, :, None, :].to(q.dtype)  # [B, H, 1, M]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    def read(self, x_dst: Tensor, tokens: Tensor, slices: Optional[Tensor] = None) -> Tensor:
        """``[B, Nd, out_channels]``: the tokens (:meth:`tokens`) read back at the
        destination points ``x_dst [B, Nd, Cd]`` through their slice weights
        ``slices [B, H, Nd, M]`` (computed here unless given); pointwise."""
        if slices is None:
            slices = self.slice_weights(x_dst, self.lin_x_dst or self.lin_x)
        return self.lin_out(merge_heads(torch.einsum("bhnm,bhmd->bhnd", slices, tokens)))

    def _attend(self, x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst):
        weight = self.fractions(weight, x_src.dtype, x_dst.shape[1], m_dst)
        s_src = self.slice_weights(x_src, self.lin_x)                   # [B, H, N, M]
        z = self.tokens(*self.integrals(x_src, weight, s_src))          # [B, H, M, d]
        # self-attention reads back through the slice weights it integrated with
        return self.read(x_dst, z, s_src if x_dst is x_src else None)   # [B, Nd, C]

    def _repr_extra(self) -> str:
        ada = ", adaptive_temperature=True" if self.lin_temperature is not None else ""
        ada += f", min_measure={self.min_measure:g}" if self.min_measure else ""
        return f", slices={self.slices}{ada}"
