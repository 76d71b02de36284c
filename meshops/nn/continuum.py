"""Continuum (quadrature-weighted softmax) attention.

Implements the continuum self-/cross-attention of the continuum-attention paper
(§2, Definitions 5 and 11): the softmax over sequence indices becomes a
probability density over the domain, and its normalising integral is replaced
by the quadrature rule of the source mesh.  The module also holds the flat/dense
plumbing shared by the other quadrature-weighted attention layers
(:class:`~meshops.nn.galerkin.GalerkinAttention`,
:class:`~meshops.nn.galerkin.FourierAttention`).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from meshops.kernels.attention import fused_attention, fused_attention_supported
from meshops.nn._utils import (as_pair, check_batch, check_channels, check_dense_weight,
                               check_length, check_weight, log_weight_bias, merge_heads,
                               num_graphs, safe_log, split_heads, to_dense)

__all__ = ["ContinuumAttention"]

Channels = Union[int, Tuple[int, int]]


def _is_pair(value: Any) -> bool:
    return isinstance(value, (tuple, list))


def _check_mask(mask: Optional[Tensor], x: Tensor, name: str) -> Optional[Tensor]:
    if mask is None:
        return None
    if mask.shape != x.shape[:2]:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(x.shape[:2])}")
    return mask.to(torch.bool)


def _check_pos(pos: Optional[Tensor], x: Tensor, name: str, dense: bool) -> None:
    if pos is None:
        return
    if dense:
        if pos.dim() != 3 or pos.shape[:2] != x.shape[:2]:
            raise ValueError(f"{name} has shape {tuple(pos.shape)}, expected "
                             f"[{x.shape[0]}, {x.shape[1]}, d]")
    else:
        if pos.dim() != 2:
            raise ValueError(f"{name} must be [N, d], got shape {tuple(pos.shape)}")
        check_length(pos, x.shape[0], name)


class _QuadratureAttention(torch.nn.Module):
    """Flat <-> dense plumbing shared by the quadrature-weighted attention layers.

    Subclasses set ``in_src``/``in_dst`` (input channels of source and
    destination) and implement :meth:`_attend` on dense, already validated
    tensors: ``x_src [B, Ns, Cs]``, ``x_dst [B, Nd, Cd]``, ``pos_*`` or ``None``,
    ``weight [B, Ns]`` with zeros on padding, ``mask_src``/``mask_dst`` or ``None``.
    Padded destination rows of the result are set to zero afterwards.
    """

    in_src: int
    in_dst: int

    @staticmethod
    def _split_channels(in_channels: Channels) -> Tuple[int, int]:
        src, dst = as_pair(in_channels)
        for c in (src, dst):
            if not isinstance(c, int) or c < 1:
                raise ValueError(f"in_channels must be a positive int or a (src, dst) pair of "
                                 f"them, got {in_channels!r}")
        return src, dst

    def _check_x(self, x: Tensor, channels: int, name: str, dim: int) -> None:
        if not isinstance(x, Tensor) or x.dim() != dim:
            shape = "[N, C]" if dim == 2 else "[B, N, C]"
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a {shape} tensor, got {got}")
        if x.shape[-1] != channels:
            raise ValueError(f"{name} has {x.shape[-1]} channels, expected {channels}")

    # ------------------------------------------------------------------ flat
    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]],
                pos: Union[Tensor, Tuple[Optional[Tensor], Optional[Tensor]], None],
                weight: Tensor,
                batch: Union[Tensor, Tuple[Optional[Tensor], Optional[Tensor]], None] = None,
                ) -> Tensor:
        cross = _is_pair(x)
        s, d = ("_src", "_dst") if cross else ("", "")
        x_src, x_dst = as_pair(x)
        pos_src, pos_dst = as_pair(pos)
        b_src, b_dst = as_pair(batch)
        self._check_x(x_src, self.in_src, "x" + s, 2)
        self._check_x(x_dst, self.in_dst, "x" + d, 2)
        n_src, n_dst = x_src.shape[0], x_dst.shape[0]
        _check_pos(pos_src, x_src, "pos" + s, dense=False)
        _check_pos(pos_dst, x_dst, "pos" + d, dense=False)
        if (b_src is None) != (b_dst is None):
            raise ValueError("batch_src and batch_dst must both be given or both be None")
        check_length(b_src, n_src, "batch" + s)
        check_length(b_dst, n_dst, "batch" + d)
        check_batch(b_src, "batch" + s)
        if b_dst is not b_src:
            check_batch(b_dst, "batch" + d)
        check_weight(weight, n_src)

        size = num_graphs(b_src, b_dst)
        xs, ms = to_dense(x_src, b_src, size)
        ws = to_dense(weight.unsqueeze(-1), b_src, size)[0].squeeze(-1)
        ps = None if pos_src is None else to_dense(pos_src, b_src, size)[0]
        if x_dst is x_src and b_dst is b_src:
            xd, md = xs, ms
        else:
            xd, md = to_dense(x_dst, b_dst, size)
        if pos_dst is None:
            pd = None
        elif pos_dst is pos_src and b_dst is b_src:
            pd = ps
        else:
            pd = to_dense(pos_dst, b_dst, size)[0]
        out = self._dense(xs, xd, ps, pd, ws, ms, md)
        return out[md]

    # ----------------------------------------------------------------- dense
    def dense(self, x: Union[Tensor, Tuple[Tensor, Tensor]],
              pos: Union[Tensor, Tuple[Optional[Tensor], Optional[Tensor]], None],
              weight: Tensor,
              mask: Union[Tensor, Tuple[Optional[Tensor], Optional[Tensor]], None] = None,
              ) -> Tensor:
        """Dense form: ``x [B, N, C]`` (or a ``(src, dst)`` pair), ``weight [B, N_src]``,
        ``mask [B, N]`` (or a ``(mask_src, mask_dst)`` pair; True = real point).

        Returns ``[B, N_dst, out_channels]`` with zeros on padded destination rows.
        """
        cross = _is_pair(x)
        s, d = ("_src", "_dst") if cross else ("", "")
        x_src, x_dst = as_pair(x)
        pos_src, pos_dst = as_pair(pos)
        m_src, m_dst = as_pair(mask)
        self._check_x(x_src, self.in_src, "x" + s, 3)
        self._check_x(x_dst, self.in_dst, "x" + d, 3)
        if x_src.shape[0] != x_dst.shape[0]:
            raise ValueError(f"x_src and x_dst have different batch sizes "
                             f"({x_src.shape[0]} and {x_dst.shape[0]})")
        _check_pos(pos_src, x_src, "pos" + s, dense=True)
        _check_pos(pos_dst, x_dst, "pos" + d, dense=True)
        m_src = _check_mask(m_src, x_src, "mask" + s)
        m_dst = _check_mask(m_dst, x_dst, "mask" + d)
        check_dense_weight(weight, x_src)
        return self._dense(x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst)

    def _dense(self, x_src: Tensor, x_dst: Tensor, pos_src: Optional[Tensor],
               pos_dst: Optional[Tensor], weight: Tensor, m_src: Optional[Tensor],
               m_dst: Optional[Tensor]) -> Tensor:
        weight = weight.to(x_src.dtype)
        if m_src is not None:
            # Padding carries no quadrature weight; zero its features too so that
            # garbage (even NaN) in padded slots cannot reach real outputs.
            weight = weight.masked_fill(~m_src, 0)
            x_src = x_src.masked_fill(~m_src.unsqueeze(-1), 0)
            if pos_src is not None:
                pos_src = pos_src.masked_fill(~m_src.unsqueeze(-1), 0)
        out = self._attend(x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst)
        if m_dst is not None:
            out = out.masked_fill(~m_dst.unsqueeze(-1), 0)
        return out

    def _attend(self, x_src: Tensor, x_dst: Tensor, pos_src: Optional[Tensor],
                pos_dst: Optional[Tensor], weight: Tensor, m_src: Optional[Tensor],
                m_dst: Optional[Tensor]) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _repr_extra(self) -> str:
        return ""

    def __repr__(self) -> str:
        in_ch = self.in_channels
        return (f"{self.__class__.__name__}({in_ch}, {self.out_channels}, "
                f"heads={self.heads}{self._repr_extra()})")


class ContinuumAttention(_QuadratureAttention):
    r"""Multi-head continuum attention with quadrature weights.

    The continuum-attention paper (§2, Definitions 5 and 11) writes attention as
    an expectation under the density :math:`p(y) \propto \exp\langle Q u(x),
    K v(y)\rangle`; replacing its normalising integral by the source mesh's
    quadrature rule :math:`\{(y_j, w_j)\}` gives, per head,

    .. math::
        A(x)_i = \frac{\sum_j w_j \exp(q_i \cdot k_j / \sqrt{d})\, v_j}
                      {\sum_j w_j \exp(q_i \cdot k_j / \sqrt{d})}
               = \mathrm{softmax}\big(Q K^\top / \sqrt{d} + \log w\big) V ,

    with :math:`q_i = W_Q x^{dst}_i`, :math:`k_j = W_K x^{src}_j`,
    :math:`v_j = W_V x^{src}_j`, :math:`d` the head dimension, followed by an output
    projection :math:`W_O` over the concatenated heads.  Uniform weights give the
    standard (Monte Carlo, Theorem 6) transformer attention; weights that are a
    quadrature rule of the domain make the output (nearly) independent of the mesh.
    Self-attention uses one point set; cross-attention takes queries from the
    destination and keys/values from the source.

    Computation paths (``impl``):

    * ``"fused"``: meshops' fused CPU kernel (:mod:`meshops.kernels.attention`), bias
      ``log w`` per key (``-inf`` on padding and zero weights), gradients to ``w``
      included; no ``N_dst x N_src`` matrix, forward or backward.  Made for the small
      head dimensions of neural operators: at 8,192 points and 4 heads of 16 channels
      PyTorch's fused kernel takes 1.20x as long forward and 1.14x forward+backward on
      a 2-core AVX2 CPU (``python -m benchmarks.fused_attention``).
      CPU, float32/float64, head dimension up to 64, no attention dropout; compiled
      on first use (:mod:`meshops.kernels`).
    * ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` with a
      broadcast ``[B, 1, 1, N_src]`` additive bias ``log w``, which takes PyTorch's
      fused, memory-efficient kernel (CPU and GPU).  PyTorch only takes that kernel
      when the bias does not require grad, so when ``weight`` requires grad the
      layer folds ``log w`` into an extra key column instead (``impl="fold"``:
      ``q' = [q, 1]``, ``k' = [k, sqrt(d) log w]``, ``v' = [v, 0]``, so
      ``q'.k'/sqrt(d) = q.k/sqrt(d) + log w``), which keeps the fused kernel and
      differentiates through ``w``.  Attention dropout > 0 in training mode makes
      PyTorch fall back to its quadratic-memory path on CPU.
    * ``"auto"`` (default): ``"fused"`` where it applies (see above, and the kernel
      could be built), else ``"sdpa"``.
    * ``"naive"``: the explicit softmax reference (quadratic memory).

    Args:
        in_channels (int or tuple): input channels, or ``(src, dst)`` channels for
            cross-attention between features of different widths.
        out_channels (int, optional): output channels, also the total width of
            the query/key/value projections; must be divisible by ``heads``.
            Defaults to the destination's ``in_channels``.
        heads (int): number of attention heads. (default: ``4``)
        dropout (float): dropout probability on the attention weights in
            training mode. (default: ``0.0``)
        bias (bool): add biases to the projections. (default: ``True``)
        impl (str): ``"auto"`` (default), ``"fused"``, ``"sdpa"``, ``"fold"`` or
            ``"naive"``, see above.

    Shapes:
        - **input (flat):** ``x [N, C]`` or ``(x_src [Ns, Cs], x_dst [Nd, Cd])``,
          ``pos`` ignored (may be ``None``), ``weight [Ns]`` (non-negative, finite),
          ``batch [N]`` or ``(batch_src [Ns], batch_dst [Nd])`` (sorted), optional
        - **output (flat):** ``[Nd, out_channels]``
        - **input (dense, :meth:`dense`):** ``x [B, N, C]`` or a pair,
          ``weight [B, Ns]``, ``mask [B, N]`` or ``(mask_src, mask_dst)``, optional
        - **output (dense):** ``[B, Nd, out_channels]`` (zeros on padded rows)
        - empty inputs (``N = 0``, or ``Nd = 0`` in cross-attention) give an empty
          output of these shapes (``[0, out_channels]`` flat).

    Raises:
        ValueError: on invalid sizes, on weights that are negative, non-finite or
            of the wrong length, and when a sample with destination points has no
            source point of positive weight (the normalising integral is zero; an
            empty source is such a sample).
    """

    IMPLS = ("auto", "fused", "sdpa", "fold", "naive")

    def __init__(self, in_channels: Channels, out_channels: Optional[int] = None,
                 heads: int = 4, dropout: float = 0.0, bias: bool = True,
                 impl: str = "auto") -> None:
        super().__init__()
        self.in_src, self.in_dst = self._split_channels(in_channels)
        out_channels = self.in_dst if out_channels is None else out_channels
        check_channels(out_channels, heads, "out_channels")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if impl not in self.IMPLS:
            raise ValueError(f"impl must be one of {self.IMPLS}, got {impl!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.head_channels = out_channels // heads
        self.dropout = dropout
        self.impl = impl
        self.lin_q = torch.nn.Linear(self.in_dst, out_channels, bias=bias)
        self.lin_k = torch.nn.Linear(self.in_src, out_channels, bias=bias)
        self.lin_v = torch.nn.Linear(self.in_src, out_channels, bias=bias)
        self.lin_out = torch.nn.Linear(out_channels, out_channels, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_q, self.lin_k, self.lin_v, self.lin_out):
            torch.nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                torch.nn.init.zeros_(lin.bias)

    def _attend(self, x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst):
        H = self.heads
        q = split_heads(self.lin_q(x_dst), H)
        k = split_heads(self.lin_k(x_src), H)
        v = split_heads(self.lin_v(x_src), H)

        # A sample whose source carries no weight has a 0/0 softmax.  Reject it
        # if it has destination points; otherwise (an all-padding slot) give it
        # dummy weights so no NaN is formed anywhere (NaN in a discarded row
        # would still poison the backward pass through the attention matrix).
        has_src = (weight > 0).any(-1)
        empty = q.shape[-2] == 0 or k.shape[-2] == 0
        if not bool(has_src.all()):
            has_dst = (torch.full_like(has_src, q.shape[-2] > 0) if m_dst is None
                       else m_dst.any(-1))
            bad = (has_dst & ~has_src).nonzero()
            if bad.numel():
                raise ValueError(f"sample {int(bad[0])} has destination points but no source "
                                 f"point with positive weight; continuum attention "
                                 f"normalises by the source integral and is undefined")
            weight = torch.where(has_src.unsqueeze(-1), weight, torch.ones_like(weight))
        # The softmax is invariant to scaling w per sample; dividing by the largest
        # weight keeps log w near 0 (fine meshes have w ~ 1/N), which reduces
        # float32 rounding in QK^T/sqrt(d) + log w.
        if not empty:
            weight = weight / weight.amax(-1, keepdim=True)

        p = self.dropout if self.training else 0.0
        impl = self.impl
        if empty:
            # No destination or no source points (only padded rows are left): the
            # explicit path forms the empty products (an empty softmax row attends to
            # nothing and gives 0) and keeps the graph, so backward works too.
            impl = "naive"
        elif impl == "auto":
            impl = "fused" if p == 0 and fused_attention_supported(q, k, v) else "sdpa"
        if impl == "sdpa" and weight.requires_grad and torch.is_grad_enabled():
            impl = "fold"
        if impl == "fused":
            if p > 0:
                raise ValueError("impl='fused' has no attention dropout; use impl='sdpa' "
                                 "or dropout=0")
            out = fused_attention(q, k, v, safe_log(weight))
        elif impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=log_weight_bias(weight),
                                                 dropout_p=p)
        elif impl == "fold":
            out = _sdpa_folded(q, k, v, weight, p)
        else:
            out = _naive_attention(q, k, v, weight, p)
        return self.lin_out(merge_heads(out))


def _sdpa_folded(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, dropout_p: float) -> Tensor:
    """``softmax(QK^T/sqrt(d) + log w) V`` through SDPA with ``log w`` folded into K.

    With ``q' = [q, 1]``, ``k' = [k, sqrt(d) log w]`` and scale ``1/sqrt(d)``:
    ``q'.k' / sqrt(d) = q.k / sqrt(d) + log w``.  ``v`` gets a zero column because
    the fused CPU kernel needs equal head dimensions for q, k and v.
    """
    B, H, Ns, D = k.shape
    scale = 1.0 / math.sqrt(D)
    col = (safe_log(weight) * math.sqrt(D))[:, None, :, None].expand(B, H, Ns, 1)
    q2 = torch.cat([q, q.new_ones(q.shape[:-1] + (1,))], dim=-1)
    k2 = torch.cat([k, col.to(k.dtype)], dim=-1)
    v2 = torch.cat([v, v.new_zeros(v.shape[:-1] + (1,))], dim=-1)
    out = F.scaled_dot_product_attention(q2, k2, v2, dropout_p=dropout_p, scale=scale)
    return out[..., :D]


def _naive_attention(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, dropout_p: float) -> Tensor:
    """Reference path: the explicit ``[B, H, Nd, Ns]`` weighted softmax."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = (q @ k.transpose(-1, -2)) * scale + safe_log(weight)[:, None, None, :]
    attn = torch.softmax(logits, dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, dropout_p)
    return attn @ v
