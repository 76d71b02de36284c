r"""The attention primitive of the meshops layers, and the one place that chooses how
it is computed.

:func:`weighted_attention` computes, per batch entry and head,

.. math::
    \mathrm{softmax}_j\big(s\, q_i \cdot k_j + \log w_j\big)\, v_j ,

i.e. softmax attention whose normalising sum is a quadrature with weights
:math:`w_j` (``log_w = -inf`` excludes a key).  Implementations (``impl``):

* ``"fused"``: meshops' fused CPU kernel (:mod:`meshops.kernels.attention`): no
  ``N_q x N_k`` matrix, forward or backward, gradients to ``log_w`` included;
  CPU, float32/float64, small head widths, no attention dropout.
* ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` with a
  broadcast ``[B, 1, 1, N_k]`` additive mask ``log w`` (PyTorch's fused,
  memory-efficient kernel, CPU and GPU).  It becomes ``"fold"`` where the mask
  would keep PyTorch off its fused kernel: ``log_w`` requires grad, keys or values
  are shared by the heads, or the value width differs from the query width.
* ``"fold"``: SDPA with ``log w`` folded into an extra key column:
  ``q' = [q, 1]``, ``k' = [k, log w / s]``, ``v' = [v, 0]`` (zero-padded to one
  width), so that ``s q'.k' = s q.k + log w`` without any bias tensor.
* ``"flex"``: PyTorch's FlexAttention (:mod:`meshops.nn._flex`): ``log w`` enters as
  a ``score_mod``, so no bias tensor keeps the GPU off a fused kernel.  CUDA forward and
  backward; CPU forward only (torch 2.13), float32/bfloat16/float16; no dropout.
* ``"naive"``: the explicit ``[B, H, N_q, N_k]`` softmax (reference; also used
  for empty inputs, where it keeps the autograd graph).
* ``"auto"`` (default): ``"fused"`` where it applies (CPU), else ``"sdpa"`` (also
  under :func:`torch.compile`: the fused kernel is a registered operator the compiler
  traces). Never ``"flex"``: its gradients have not yet run on a GPU (the CPU has no
  FlexAttention backward to test them against), and an untested path is not a
  default; ask for it with ``impl="flex"``.

Layers do not import :mod:`meshops.kernels`; this module does.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from meshops.kernels.attention import fused_attention, fused_attention_supported
from meshops.nn._flex import flex_weighted_attention

__all__ = ["IMPLS", "KERNEL_LIMIT", "materialise_kernel", "weighted_attention"]

IMPLS = ("auto", "fused", "sdpa", "fold", "flex", "naive")

#: Layers that can also materialise their attention kernel (position attention, PiT's
#: shared kernel) do so when it has at most this many entries.
KERNEL_LIMIT = 1 << 22


def materialise_kernel(entries: int) -> bool:
    """Whether a kernel of ``entries`` values is small enough to materialise
    (``entries <= KERNEL_LIMIT``)."""
    return entries <= KERNEL_LIMIT


def choose_impl(q: Tensor, k: Tensor, v: Tensor, log_w: Tensor, impl: str = "auto",
                dropout_p: float = 0.0) -> str:
    """The implementation :func:`weighted_attention` runs for these inputs."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if 0 in (q.shape[-2], k.shape[-2]):
        return "naive"
    if impl == "auto":
        # the fused kernel is a registered operator (torch.ops.meshops), which
        # torch.compile traces through like any other
        fused = dropout_p == 0 and fused_attention_supported(q, k, v, log_w)
        impl = "fused" if fused else "sdpa"
    if impl == "sdpa" and ((log_w.requires_grad and torch.is_grad_enabled())
                           or k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]
                           or v.shape[-1] != q.shape[-1]):
        impl = "fold"
    return impl


def weighted_attention(q: Tensor, k: Tensor, v: Tensor, log_w: Tensor,
                       scale: Optional[float] = None, dropout_p: float = 0.0,
                       impl: str = "auto") -> Tensor:
    r"""``softmax(scale * q k^T + log_w) v`` with a per-key log-weight (see the module).

    Args:
        q: queries ``[B, H, Nq, E]``.
        k: keys ``[B, H or 1, Nk, E]`` (one set may serve all heads).
        v: values ``[B, H or 1, Nk, C]``.
        log_w: ``[B, Nk]`` log quadrature weight of every key (``-inf``: excluded).
            Every query needs a key with a finite ``log_w``.
        scale: score scale; ``1 / sqrt(E)`` by default.
        dropout_p: dropout on the attention weights (pass 0 outside training).
        impl: ``"auto"``, ``"fused"``, ``"sdpa"``, ``"fold"``, ``"flex"`` or ``"naive"``.

    Returns:
        Tensor ``[B, H, Nq, C]``.

    Raises:
        ValueError: an unknown ``impl``, ``impl="fused"`` with dropout, or
            ``impl="flex"`` on inputs FlexAttention cannot take (the reason is named).
    """
    impl = choose_impl(q, k, v, log_w, impl, dropout_p)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if impl == "fused":
        if dropout_p > 0:
            raise ValueError("impl='fused' has no attention dropout; use impl='sdpa' "
                             "or dropout=0")
        return fused_attention(q, k, v, log_w, scale=s)
    if impl == "flex":
        if dropout_p > 0:
            raise ValueError("impl='flex' has no attention dropout; use impl='sdpa' "
                             "or dropout=0")
        return flex_weighted_attention(q, k, v, log_w, scale=s)
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=log_w[:, None, None, :],
                                              dropout_p=dropout_p, scale=s)
    if impl == "fold":
        return _folded(q, k, v, log_w, s, dropout_p)
    return _naive(q, k, v, log_w, s, dropout_p)


def _folded(q: Tensor, k: Tensor, v: Tensor, log_w: Tensor, scale: float,
            dropout_p: float) -> Tensor:
    """SDPA with ``log w`` as an extra key column (no bias tensor, fused kernel kept).

    q, k and v are zero-padded to one width because PyTorch's fused CPU kernel needs
    it (otherwise SDPA falls back to a path that forms the ``Nq x Nk`` matrix).
    """
    B, H, Nq, E = q.shape
    Nk, C = k.shape[2], v.shape[-1]
    # log 0 -> a huge finite negative (not -inf: -inf in k gives 0 * -inf = NaN in
    # the backward pass); its exponential is exactly 0.
    col = (log_w.to(k.dtype) / scale).clamp_min(torch.finfo(k.dtype).min / 4)
    width = max(E + 1, C)
    q2 = F.pad(torch.cat([q, q.new_ones(B, H, Nq, 1)], -1), (0, width - E - 1))
    k2 = torch.cat([k, col[:, None, :, None].expand(B, k.shape[1], Nk, 1)], -1)
    k2 = F.pad(k2, (0, width - E - 1)).expand(B, H, Nk, width)
    v2 = F.pad(v, (0, width - C)).expand(B, H, Nk, width)
    out = F.scaled_dot_product_attention(q2, k2, v2, dropout_p=dropout_p, scale=scale)
    return out[..., :C]


def _naive(q: Tensor, k: Tensor, v: Tensor, log_w: Tensor, scale: float,
           dropout_p: float) -> Tensor:
    """The explicit ``[B, H, Nq, Nk]`` weighted softmax."""
    logits = (q @ k.transpose(-1, -2)) * scale + log_w[:, None, None, :].to(q.dtype)
    attn = torch.softmax(logits, dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, dropout_p)
    return attn @ v
