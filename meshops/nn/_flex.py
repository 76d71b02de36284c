r"""Weighted attention through PyTorch's FlexAttention (:mod:`torch.nn.attention.flex_attention`).

FlexAttention compiles a fused attention kernel (Triton on CUDA, C++ on the CPU) around
a ``score_mod(score, b, h, q_idx, kv_idx)`` that may read captured tensors.  The
quadrature weight of continuum and position attention enters as such a score_mod,

.. math::
    \text{continuum:}\quad s\, q_i\cdot k_j + \log w_j, \qquad
    \text{position:}\quad -\lambda_h \|x_i - y_j\|^2 + \log w_j ,

so neither needs a bias tensor (which keeps PyTorch's SDPA off its flash kernels) and
the position kernel's distances are computed exactly, coordinate by coordinate, in the
kernel's float32 arithmetic even for bf16 values (the dot-product expansion that the
SDPA path uses loses ``\lambda R^2 \cdot 2^{-8}`` to cancellation in bf16).

What torch 2.13 supports, and what this module therefore accepts:

* CUDA (Triton): forward and backward, gradients to ``q, k, v`` and to the captured
  ``log w``, ``\lambda`` and positions; float16, bfloat16, float32, float64.  Head
  widths below 16 are zero-padded to 16 (``tl.dot`` needs 16); widths above
  :data:`MAX_HEAD_DIM` are refused.
* CPU (C++ template): forward only (its backward raises ``NotImplementedError``),
  float32, bfloat16, float16; every new shape is a new compilation (dynamic shapes
  fail to build there).  Useful for tests and inference.

``impl="auto"`` never chooses FlexAttention: its gradients have not yet run on a GPU
(the CUDA tests of ``tests/nn/test_flex.py`` skip without one), and an untested path
is not a default. It is opt-in (``impl="flex"``) until a GPU run passes them.

Not supported: attention dropout.  The compiled function is built once per device
type; under an enclosing :func:`torch.compile` the operator is traced directly.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

__all__ = ["MAX_HEAD_DIM", "flex_available", "flex_unsupported", "flex_weighted_attention",
           "flex_distance_attention"]

#: The narrowest head FlexAttention's CUDA kernel takes (``tl.dot``); narrower heads
#: are zero-padded to it (zeros change no score and no output).
MIN_HEAD_DIM = 16

#: The widest query/key or value head accepted (the Triton kernel keeps a block of
#: rows this wide in registers/shared memory).
MAX_HEAD_DIM = 256

_LOW = (torch.float16, torch.bfloat16)
_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_COMPILED: dict = {}


def _has_flex() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:  # pragma: no cover - torch < 2.5
        return False
    return True


def flex_available(device: torch.device) -> bool:
    """Whether FlexAttention can be compiled for ``device`` here (CUDA needs Triton)."""
    if not _has_flex():
        return False
    device = torch.device(device)
    if device.type == "cuda":
        from torch.utils._triton import has_triton
        return torch.cuda.is_available() and has_triton()
    return device.type == "cpu"


def flex_unsupported(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                     compiled: bool = True) -> Optional[str]:
    """Why FlexAttention cannot run on these inputs, or None when it can.

    ``q [B, H, Nq, E]``, ``k [B, H or 1, Nk, E]``, ``v [B, H or 1, Nk, C]``;
    ``compiled=False``: FlexAttention's unfused reference path (any float dtype).
    """
    device = q.device
    if not flex_available(device):
        return (f"FlexAttention is not available on {device.type} here (torch "
                f"{torch.__version__}; CUDA needs Triton)")
    if dropout_p > 0:
        return "FlexAttention has no attention dropout"
    if not (q.dtype == k.dtype == v.dtype):
        return f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        return (f"head widths above {MAX_HEAD_DIM} are not taken (got {q.shape[-1]} and "
                f"{v.shape[-1]})")
    if device.type == "cpu":
        if compiled and q.dtype not in _CPU_DTYPES:
            return f"FlexAttention on the CPU takes float32/bfloat16/float16, not {q.dtype}"
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            return "FlexAttention on the CPU has no backward (torch raises NotImplementedError)"
    return None


def _flex_fn(device_type: str, compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention
    if not compiled or torch.compiler.is_compiling():
        # inside an enclosing torch.compile the operator is traced like any other;
        # compiled=False is the unfused reference path (tests of the score_mods)
        return flex_attention
    fn = _COMPILED.get(device_type)
    if fn is None:
        # CPU: static shapes (torch 2.13's C++ template fails to build with symbolic
        # sizes); CUDA: dynamo's default (one recompile, then dynamic sizes)
        fn = torch.compile(flex_attention, dynamic=False if device_type == "cpu" else None)
        _COMPILED[device_type] = fn
    return fn


def _call(q: Tensor, k: Tensor, v: Tensor, score_mod, scale: float, compiled: bool) -> Tensor:
    fn = _flex_fn(q.device.type, compiled)
    if compiled:
        return fn(q, k, v, score_mod=score_mod, scale=scale)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        return fn(q, k, v, score_mod=score_mod, scale=scale)


def _pad(t: Tensor, width: int) -> Tensor:
    return t if t.shape[-1] >= width else torch.nn.functional.pad(t, (0, width - t.shape[-1]))


def _log_w(log_w: Tensor, dtype: torch.dtype) -> Tensor:
    # the score is float32 inside the kernel; a bf16 log w would round weights by ~1 %.
    # Contiguous: the CPU template fails to lower a captured strided view.
    return log_w.to(torch.float32 if dtype in _LOW else dtype).contiguous()


def flex_weighted_attention(q: Tensor, k: Tensor, v: Tensor, log_w: Tensor, scale: float,
                            compiled: bool = True) -> Tensor:
    r"""``softmax(scale * q k^T + log_w) v`` with ``log_w`` as FlexAttention's score_mod.

    Args:
        q: queries ``[B, H, Nq, E]``.
        k: keys ``[B, H or 1, Nk, E]``.
        v: values ``[B, H or 1, Nk, C]``.
        log_w: ``[B, Nk]`` (``-inf``: key excluded).
        scale: score scale.
        compiled: False runs FlexAttention's unfused reference (for tests).

    Returns:
        ``[B, H, Nq, C]``.

    Raises:
        ValueError: inputs FlexAttention cannot take (the reason is named).
    """
    why = flex_unsupported(q, k, v, compiled=compiled)
    if why is not None:
        raise ValueError(f"impl='flex': {why}")
    H, C = q.shape[1], v.shape[-1]
    k, v = k.expand(-1, H, -1, -1), v.expand(-1, H, -1, -1)
    q, k, v = _pad(q, MIN_HEAD_DIM), _pad(k, MIN_HEAD_DIM), _pad(v, MIN_HEAD_DIM)
    lw = _log_w(log_w, q.dtype)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + lw[b, kv_idx]

    return _call(q, k, v, score_mod, scale, compiled)[..., :C]


def _distance_score(pos_dst: Tensor, pos_src: Tensor, lam_h: Tensor, log_w: Tensor,
                    dtype: torch.dtype):
    """FlexAttention's ``score_mod`` of the position kernel:
    ``score + log w_j - lambda_h |x_i - y_j|^2``."""
    # float32 (or float64) arithmetic in the score_mod whatever the value dtype; one
    # tensor per coordinate, each indexed once (FlexAttention differentiates captured
    # tensors indexed once per score_mod); contiguous: the CPU template fails to lower
    # a captured strided view
    cdt = torch.float32 if dtype in _LOW else dtype
    xs = [pos_dst[..., i].to(cdt).contiguous() for i in range(pos_dst.shape[-1])]
    ys = [pos_src[..., i].to(cdt).contiguous() for i in range(pos_src.shape[-1])]
    lam_h = lam_h.to(cdt).contiguous()
    lw = log_w.to(cdt).contiguous()

    def score_mod(score, b, h, q_idx, kv_idx):
        d2 = None
        for x, y in zip(xs, ys):
            diff = x[b, q_idx] - y[b, kv_idx]
            d2 = diff * diff if d2 is None else d2 + diff * diff
        return score + lw[b, kv_idx] - lam_h[h] * d2

    return score_mod


def flex_distance_attention(pos_dst: Tensor, pos_src: Tensor, lam: Tensor, log_w: Tensor,
                            v: Tensor, compiled: bool = True) -> Tensor:
    r"""Position attention ``softmax_j(-lam_h |x_i - y_j|^2 + log w_j) v_j`` with the
    whole logit as FlexAttention's score_mod (exact distances, no ``N_dst x N_src``
    matrix).

    The query/key inputs FlexAttention multiplies are zeros of width 16 (the score it
    passes in is 0); the distances are formed from the captured coordinates.  A mesh
    shared by the batch (2-D positions) folds the batch into the heads, so the values
    keep their per-head width.

    Args:
        pos_dst: ``[(B,) Nd, d]`` destination points ``x_i``.
        pos_src: ``[(B,) Ns, d]`` source points ``y_j``.
        lam: ``[H]`` positive :math:`\lambda_h`.
        log_w: ``[(B,) Ns]`` log weights (``-inf``: excluded).
        v: ``[B, Ns, H, c]`` values.
        compiled: False runs FlexAttention's unfused reference (for tests).

    Returns:
        ``[B, Nd, H, c]``.

    Raises:
        ValueError: inputs FlexAttention cannot take (the reason is named).
    """
    B, Ns, H, c = v.shape
    shared = pos_src.dim() == 2
    Nd = pos_dst.shape[-2]
    if shared:
        # [B, Ns, H, c] -> [1, H*B, Ns, c]: head index hb = h*B + b
        vv = v.permute(2, 0, 1, 3).reshape(1, H * B, Ns, c)
        lam_h = lam.repeat_interleave(B)
        pos_dst, pos_src, log_w = pos_dst[None], pos_src[None], log_w[None]
    else:
        vv = v.transpose(1, 2)
        lam_h = lam
    nb, nh = vv.shape[0], vv.shape[1]
    zeros = vv.new_zeros(1, 1, 1, MIN_HEAD_DIM)
    q = zeros.expand(nb, nh, Nd, MIN_HEAD_DIM)
    k = zeros.expand(nb, nh, Ns, MIN_HEAD_DIM)
    why = flex_unsupported(q, k, vv, compiled=compiled)
    if why is None and torch.is_grad_enabled() and v.device.type == "cpu" and any(
            t.requires_grad for t in (lam, log_w, pos_dst, pos_src)):
        why = "FlexAttention on the CPU has no backward (torch raises NotImplementedError)"
    if why is not None:
        raise ValueError(f"impl='flex': {why}")
    vv = _pad(vv, MIN_HEAD_DIM)
    score_mod = _distance_score(pos_dst, pos_src, lam_h, log_w, v.dtype)
    out = _call(q, k, vv, score_mod, 1.0, compiled)[..., :c]
    if shared:
        return out.reshape(H, B, Nd, c).permute(1, 2, 0, 3)
    return out.transpose(1, 2)
