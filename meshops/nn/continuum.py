"""Continuum (quadrature-weighted softmax) attention.

Implements the continuum self-/cross-attention of the continuum-attention paper
(§2, Definitions 5 and 11): the softmax over sequence indices becomes a
probability density over the domain, and its normalising integral is replaced
by the quadrature rule of the source mesh.
"""

from __future__ import annotations

from typing import Optional

import torch

from meshops.nn._utils import merge_heads, safe_log, split_heads
from meshops.nn.base import Channels, GlobalAttentionBase, reset_linear
from meshops.nn.functional import IMPLS, weighted_attention
from meshops.utils.checks import checking

__all__ = ["ContinuumAttention"]


class ContinuumAttention(GlobalAttentionBase):
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

    * ``"fused"``: meshops' fused CPU kernel, bias ``log w`` per key (``-inf`` on
      padding and zero weights), gradients to ``w`` included; no ``N_dst x N_src``
      matrix, forward or backward; made for the small head dimensions of neural
      operators (timings: ``python -m benchmarks --only layers``).  CPU,
      float32/float64, head dimension up to 64, no attention dropout; compiled on
      first use.
    * ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` with a
      broadcast ``[B, 1, 1, N_src]`` additive bias ``log w``, which takes PyTorch's
      fused, memory-efficient kernel (CPU and GPU).  PyTorch only takes that kernel
      when the bias does not require grad, so when ``weight`` requires grad the
      layer folds ``log w`` into an extra key column instead (``impl="fold"``:
      ``q' = [q, 1]``, ``k' = [k, sqrt(d) log w]``, ``v' = [v, 0]``, so
      ``q'.k'/sqrt(d) = q.k/sqrt(d) + log w``), which keeps the fused kernel and
      differentiates through ``w``.  Attention dropout > 0 in training mode makes
      PyTorch fall back to its quadratic-memory path on CPU.
    * ``"flex"``: PyTorch's FlexAttention with ``log w`` as its ``score_mod`` (no bias
      tensor, so the GPU keeps a fused kernel); CUDA forward and backward, CPU forward
      only; no attention dropout (docs/gpu.md).
    * ``"auto"`` (default): ``"fused"`` where it applies (see above, and the kernel
      could be built), else ``"sdpa"``; never ``"flex"``, whose gradients have not yet
      run on a GPU (opt-in).
    * ``"naive"``: the explicit softmax reference (quadratic memory).

    The choice is made by :func:`meshops.nn.functional.weighted_attention`.

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
        impl (str): ``"auto"`` (default), ``"fused"``, ``"sdpa"``, ``"fold"``,
            ``"flex"`` or ``"naive"``, see above.

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

    IMPLS = IMPLS

    def __init__(self, in_channels: Channels, out_channels: Optional[int] = None,
                 heads: int = 4, dropout: float = 0.0, bias: bool = True,
                 impl: str = "auto") -> None:
        super().__init__()
        self._init_channels(in_channels, out_channels, heads)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if impl not in self.IMPLS:
            raise ValueError(f"impl must be one of {self.IMPLS}, got {impl!r}")
        self.head_channels = self.out_channels // heads
        self.dropout = dropout
        self.impl = impl
        self._init_projections(bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_linear(self.lin_q, self.lin_k, self.lin_v, self.lin_out)

    def _attend(self, x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst):
        H = self.heads
        weight = weight.to(x_src.dtype)
        q = split_heads(self.lin_q(x_dst), H)
        k = split_heads(self.lin_k(x_src), H)
        v = split_heads(self.lin_v(x_src), H)

        # A sample whose source carries no weight has a 0/0 softmax.  Reject it if it
        # has destination points (when checking(): the test reads the values);
        # otherwise (an all-padding slot) give it dummy weights so no NaN
        # is formed anywhere (NaN in a discarded row would still poison the backward pass
        # through the attention matrix).
        has_src = (weight > 0).any(-1)
        if checking() and not bool(has_src.all()):
            has_dst = (torch.full_like(has_src, q.shape[-2] > 0) if m_dst is None
                       else m_dst.any(-1))
            bad = (has_dst & ~has_src).nonzero()
            if bad.numel():
                raise ValueError(f"sample {int(bad[0])} has destination points but no source "
                                 f"point with positive weight; continuum attention "
                                 f"normalises by the source integral and is undefined")
        if k.shape[-2] and q.shape[-2]:
            weight = torch.where(has_src.unsqueeze(-1), weight, torch.ones_like(weight))
            # The softmax is invariant to scaling w per sample; dividing by the largest
            # weight keeps log w near 0 (fine meshes have w ~ 1/N), which reduces
            # float32 rounding in QK^T/sqrt(d) + log w.
            weight = weight / weight.amax(-1, keepdim=True)
        out = weighted_attention(q, k, v, safe_log(weight),
                                 dropout_p=self.dropout if self.training else 0.0,
                                 impl=self.impl)
        return self.lin_out(merge_heads(out))
