r"""Fused CPU attention with a per-key bias, differentiable.

.. math::
    \mathrm{out}_i = \sum_j \mathrm{softmax}_j(s\, q_i \cdot k_j + b_j)\, v_j

with one bias :math:`b_j` per key shared by all heads (``log w`` of a quadrature rule,
``-inf`` for excluded keys).  This is the same function as
``F.scaled_dot_product_attention(q, k, v, attn_mask=b[:, None, None, :], scale=s)``
and the layers use it in place of that call on the CPU (see
:func:`fused_attention_supported`).  The kernel (``attention_cpu.cpp``) keeps a
block of queries and keys in L1 from the scores to the weighted values, which is
what matters at the small head dimensions of neural operators; nothing of size
``N_q x N_k`` is stored, forward or backward (the backward pass recomputes the
scores from the saved log-sum-exp, as flash attention does).
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from contextlib import suppress
from pathlib import Path
from types import ModuleType
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from meshops.kernels.build import Built, Extension, KernelBuildError, ensure_built, load_module

__all__ = ["CPU_FLAGS", "MAX_VECTORS", "attention_extension", "attention_kernel",
           "build_attention_kernel", "fused_attention", "fused_attention_supported",
           "kernels_enabled"]


# ---------------------------------------------------------------- build and load
_SOURCE = Path(__file__).with_name("attention_cpu.cpp")
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}

#: Compiler flags per ATen CPU capability: the kernels use ATen's Vectorized<T>, whose
#: SIMD specialisations are chosen by these macros.
CPU_FLAGS = {
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c",
               "-DCPU_CAPABILITY_AVX512", "-DCPU_CAPABILITY=AVX512"],
}


def kernels_enabled() -> bool:
    """False when ``MESHOPS_KERNELS`` is set to ``0``/``false``/``no``/``off``."""
    return os.environ.get("MESHOPS_KERNELS", "1").strip().lower() not in ("0", "false", "no",
                                                                          "off")


def attention_kernel() -> Extension:
    """The fused-attention extension for this CPU (sources, flags, cache location).

    Raises :class:`KernelBuildError` on a CPU without AVX2.
    """
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in CPU_FLAGS:
        raise KernelBuildError(f"no fused CPU attention kernel for CPU capability {cap!r} "
                               f"(AVX2 or AVX512 needed)")
    return Extension(name=f"meshops_attention_{cap.lower()}", sources=(_SOURCE,),
                     cflags=("-O3", "-fopenmp", *CPU_FLAGS[cap]), ldflags=("-fopenmp",),
                     title="the fused CPU attention kernel")


def build_attention_kernel(force: bool = False) -> Built:
    """Compile the fused-attention kernel into the cache unless it is there (or ``force``).

    Returns where it is and how long the compile took (``None``: already built).
    Raises :class:`KernelBuildError` when it cannot be built.
    """
    return ensure_built(attention_kernel(), force=force)


def attention_extension() -> Optional[ModuleType]:
    """The compiled fused-attention module, or ``None`` where it cannot be had.

    Builds it on the first call if the cache lacks it (bounded by
    ``MESHOPS_KERNEL_TIMEOUT``).  Thread-safe; attempted once per process, with one
    warning when it fails.
    """
    if not kernels_enabled():
        return None
    with _LOCK:
        if "attention" not in _STATE:
            _STATE["attention"] = _load_attention()
        return _STATE["attention"]  # type: ignore[return-value]


def _load_attention() -> Optional[ModuleType]:
    try:
        ext = attention_kernel()
        module = load_module(ext.name, ensure_built(ext).path)
        # the kernel as PyTorch operators (torch.compile traces through them): all
        # parts at once, or nothing and no kernel
        _register_ops()
        return module
    except Exception as err:  # noqa: BLE001 - any failure means "use PyTorch's attention"
        reason = str(err) if isinstance(err, KernelBuildError) else f"{type(err).__name__}: {err}"
        warnings.warn(f"meshops: the fused CPU attention kernel is not available ({reason}); "
                      f"using PyTorch's attention, which gives the same numbers more slowly "
                      f"(MESHOPS_KERNELS=0 skips the attempt)", RuntimeWarning, stacklevel=4)
        return None



#: Widest head (query/key or value channels) the kernel takes, in SIMD vectors
#: (8 vectors: 64 float32 or 32 float64 channels with AVX2).
MAX_VECTORS = 8
#: Keys per tile (scored, exponentiated and applied while in L1).
KEY_TILE = 256


def _width(dtype: torch.dtype) -> int:
    """SIMD lanes of ``dtype`` in the kernel (0 where the kernel is not available)."""
    return _simd_widths()[0 if dtype == torch.float32 else 1]


@torch.compiler.assume_constant_result
def _simd_widths() -> Tuple[int, int]:
    """SIMD lanes of float32 and float64 in the kernel, ``(0, 0)`` without it.

    Loads (or builds) the kernel, and so registers its operators, on the first call.
    ``torch.compile`` calls this once while tracing and keeps the result as a
    constant, so neither the lock nor the extension module is traced.
    """
    ext = attention_extension()
    if ext is None:
        return 0, 0
    return int(ext.simd_width_float()), int(ext.simd_width_double())


def _vectors(channels: int, width: int) -> int:
    """Smallest of 1, 2, 4, 8 SIMD vectors holding ``channels``."""
    need = -(-channels // width)
    return next(m for m in (1, 2, 4, 8) if m >= need) if need <= MAX_VECTORS else 0


def _functorch_active() -> bool:
    try:
        return bool(torch._C._are_functorch_transforms_active())
    except AttributeError:  # older PyTorch without the query: be conservative
        return True


def fused_attention_supported(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor] = None
                              ) -> bool:
    """Whether :func:`fused_attention` can run on these tensors: CPU, float32 or
    float64, no autocast, no :mod:`torch.func` transform active, no empty dimension,
    head widths within :data:`MAX_VECTORS` SIMD vectors, and the kernel built
    (:func:`meshops.kernels.attention_extension`)."""
    tensors = [t for t in (q, k, v, bias) if t is not None]
    if any(t.device.type != "cpu" for t in tensors):
        return False
    if 0 in (q.shape[0], q.shape[1], q.shape[2], k.shape[2]):
        return False  # nothing to attend over (SDPA handles the empty cases)
    if _functorch_active():
        return False  # torch.func transforms (grad, vmap) cannot see into the kernel
    if q.dtype not in (torch.float32, torch.float64) or any(t.dtype != q.dtype for t in tensors):
        return False
    if torch.is_autocast_enabled("cpu"):
        return False
    w = _width(q.dtype)
    if w == 0:
        return False  # no kernel
    return _vectors(max(q.shape[-1], v.shape[-1]), w) > 0


def fused_attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor] = None,
                    scale: Optional[float] = None) -> Tensor:
    """Softmax attention with an additive per-key bias, through the fused CPU kernel.

    Args:
        q: queries.
        k: keys (one set per head, or one set ``[B, 1, Nk, E]`` shared by the heads).
        v: values (per head, or one set shared by the heads).
        bias: per-key bias ``[B, Nk]`` (``-inf``: key excluded), or None. Every query
            needs at least one key with a finite bias.
        scale: score scale; defaults to ``1 / sqrt(E)``.

    Returns:
        Tensor: ``[B, H, Nq, C]``.

    Gradients flow to ``q``, ``k``, ``v`` and ``bias`` (first order: the backward pass
    is not itself differentiable).  Raises ``RuntimeError`` where
    :func:`fused_attention_supported` is False.  It runs as the PyTorch operator
    ``torch.ops.meshops.fused_attention``, so ``torch.compile`` traces through it
    (``fullgraph=True`` works).

    Shapes:
        - **q:** ``[B, H, Nq, E]``; **k:** ``[B, H or 1, Nk, E]``;
          **v:** ``[B, H or 1, Nk, C]``; **bias:** ``[B, Nk]``
        - **output:** ``[B, H, Nq, C]``
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, H, N, D], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, H, Nq, E = q.shape
    if k.shape[0] != B or k.shape[1] not in (1, H) or k.shape[-1] != E:
        raise ValueError(f"k has shape {tuple(k.shape)}, expected [{B}, {H} or 1, Nk, {E}]")
    Nk = k.shape[2]
    if v.dim() != 4 or v.shape[0] != B or v.shape[1] not in (1, H) or v.shape[2] != Nk:
        raise ValueError(f"v has shape {tuple(v.shape)}, expected [{B}, {H} or 1, {Nk}, C]")
    if bias is not None and bias.shape != (B, Nk):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected {(B, Nk)}")
    if not fused_attention_supported(q, k, v, bias):
        raise RuntimeError("fused_attention: unsupported input (needs CPU float32/float64 "
                           "tensors without empty dimensions, head widths within the "
                           "kernel's limit, no torch.func transform, and the kernel built; "
                           "see meshops.kernels)")
    s = 1.0 / math.sqrt(E) if scale is None else float(scale)
    if torch.compiler.is_compiling():
        return torch.ops.meshops.fused_attention(q, k, v, bias, s)[0]
    return _EagerFusedAttention.apply(q, k, v, bias, s)[0]


# ------------------------------------------------------------------------------ layout
def _key_tiling(nk: int, width: int) -> Tuple[int, int]:
    """Keys per tile (a multiple of two SIMD vectors) and the padded key count."""
    step = 2 * width
    kb = KEY_TILE if nk >= KEY_TILE else -(-nk // step) * step
    return kb, -(-nk // kb) * kb


def _heads(x: Tensor, H: int) -> Tensor:
    """``[B, H or 1, N, D]`` -> ``[B*H, N, D]`` (a shared set is repeated per head)."""
    B, _, N, D = x.shape
    return x.expand(B, H, N, D).reshape(B * H, N, D)


def _pad(x: Tensor, rows: int, cols: int) -> Tensor:
    """Zero-pad ``[BH, N, D]`` to ``[BH, rows, cols]`` (contiguous)."""
    return F.pad(x, (0, cols - x.shape[-1], 0, rows - x.shape[-2])).contiguous()


def _tiles(x: Tensor, kb: int) -> Tensor:
    """``[BH, Np, D]`` -> key tiles ``[BH, Np/kb, D, kb]`` (keys in SIMD lanes)."""
    BH, Np, D = x.shape
    return x.view(BH, Np // kb, kb, D).transpose(2, 3).contiguous()


def _bias(bias: Optional[Tensor], B: int, H: int, nk: int, np_: int, like: Tensor) -> Tensor:
    """``[B, Nk]`` or None -> ``[B*H, Np]`` with ``-inf`` on the padded keys."""
    b = like.new_zeros(B, nk) if bias is None else bias
    b = F.pad(b, (0, np_ - nk), value=-math.inf)
    return b[:, None].expand(B, H, np_).reshape(B * H, np_).contiguous()


# ------------------------------------------------------------------ the operators
# Two custom operators (torch.library): meshops::fused_attention -> (out, lse) and its
# backward. torch.compile and torch.export see them as single nodes (their fake
# implementations give the output shapes), so a compiled model traces through the
# kernel without a graph break; autograd reaches the backward operator through
# register_autograd. They are registered when the kernel is loaded
# (attention_extension), all parts at once, and never without it.
_OPS: dict[str, object] = {}


def _forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], scale: float
             ) -> Tuple[Tensor, Tensor]:
    """The kernel's forward: ``out [B, H, Nq, C]`` and the log-sum-exp ``[B, H, Nq]``."""
    ext = attention_extension()
    B, H, Nq, E = q.shape
    Nk, C = k.shape[2], v.shape[-1]
    w = _width(q.dtype)
    kb, np_ = _key_tiling(Nk, w)
    cp = _vectors(C, w) * w
    qs = (q * scale).reshape(B * H, Nq, E).contiguous()
    kt = _tiles(_pad(_heads(k, H), np_, E), kb)
    vp = _pad(_heads(v, H), np_, cp)
    b = _bias(bias, B, H, Nk, np_, q)
    out, lse = ext.forward(qs, kt, vp, b)
    # a fresh tensor, not a view of the kernel's padded output: callers may modify
    # it in place (as they can SDPA's), and the backward pass reads it
    out = out[..., :C].reshape(B, H, Nq, C).clone()
    return out, lse.view(B, H, Nq)


def _forward_fake(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], scale: float
                  ) -> Tuple[Tensor, Tensor]:
    B, H, Nq, _ = q.shape
    return q.new_empty(B, H, Nq, v.shape[-1]), q.new_empty(B, H, Nq)


def _backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
              out: Tensor, lse: Tensor, scale: float
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The kernel's backward: gradients of ``q``, ``k``, ``v`` and of the bias
    ``[B, Nk]`` (of a zero bias when ``bias`` is None)."""
    ext = attention_extension()
    B, H, Nq, E = q.shape
    Nk, C = k.shape[2], v.shape[-1]
    w = _width(q.dtype)
    kb, np_ = _key_tiling(Nk, w)
    m = _vectors(max(E, C), w) * w
    g = _pad(grad.reshape(B * H, Nq, C).to(q.dtype), Nq, m)
    delta = (g[..., :C] * out.reshape(B * H, Nq, C)).sum(-1).contiguous()
    qs = _pad((q * scale).reshape(B * H, Nq, E), Nq, m)
    kp = _pad(_heads(k, H), np_, m)
    vp = _pad(_heads(v, H), np_, m)
    b = _bias(bias, B, H, Nk, np_, q)
    dq, dk, dv, db = ext.backward(qs, kp, _tiles(kp, kb), vp, _tiles(vp, kb), b, g,
                                  lse.reshape(B * H, Nq).contiguous(), delta)
    dq = dq[..., :E].reshape(B, H, Nq, E) * scale
    dk = dk[:, :Nk, :E].reshape(B, H, Nk, E)
    dv = dv[:, :Nk, :C].reshape(B, H, Nk, C)
    if k.shape[1] == 1:  # one key set shared by the heads
        dk = dk.sum(1, keepdim=True)
    else:
        dk = dk.contiguous()  # fresh tensors: an operator's outputs may not be views
    if v.shape[1] == 1:
        dv = dv.sum(1, keepdim=True)
    else:
        dv = dv.contiguous()
    db = db[:, :Nk].reshape(B, H, Nk).sum(1)
    return dq, dk, dv, db


def _backward_fake(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                   out: Tensor, lse: Tensor, scale: float
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    # contiguous, as _backward returns them: not empty_like, which keeps the strides of
    # a head-major view [B, H, N, E] of a [B, N, H, E] tensor, and compiled code would
    # then index the real gradients with the wrong strides
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(q.shape[0], k.shape[2]))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, bias, scale = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, bias, out, lse)
    ctx.scale = scale


def _input_grads(ctx, backward, grad: Tensor):
    """The gradients of ``(q, k, v, bias, scale)`` through ``backward`` (the operator or
    its Python implementation :func:`_backward`)."""
    q, k, v, bias, out, lse = ctx.saved_tensors
    dq, dk, dv, db = backward(grad, q, k, v, bias, out, lse, ctx.scale)
    dbias = db.to(bias.dtype) if bias is not None and ctx.needs_input_grad[3] else None
    return dq, dk, dv, dbias, None


def _autograd_backward(ctx, grad: Tensor, _grad_lse: Optional[Tensor]):
    # first order only: the backward operator has no derivative of its own
    return _input_grads(ctx, torch.ops.meshops.fused_attention_backward, grad)


class _EagerFusedAttention(torch.autograd.Function):
    """The operator's forward and backward without the dispatcher, for eager calls:
    torch.library's per-call overhead (about 0.1 ms) was 5-10 % of a small layer's step
    (the patch-token layer at 4,096 points). Compiled code uses the operator; a graph
    built for a second derivative goes through the backward operator, which refuses it
    by name."""

    @staticmethod
    def forward(ctx, q, k, v, bias, scale):
        out, lse = _forward(q, k, v, bias, scale)
        _setup_context(ctx, (q, k, v, bias, scale), (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, grad, _grad_lse):
        # create_graph=True goes through the backward operator, which refuses a second
        # derivative by name
        return _input_grads(ctx, torch.ops.meshops.fused_attention_backward
                            if torch.is_grad_enabled() else _backward, grad)


def _register_ops() -> None:
    """Register the two operators with their fake and autograd implementations (once)."""
    if _OPS:
        return
    lib = torch.library
    made = []
    try:
        made.append(lib.custom_op(
            "meshops::fused_attention", _forward, mutates_args=(), device_types="cpu",
            schema="(Tensor q, Tensor k, Tensor v, Tensor? bias, float scale) -> (Tensor, Tensor)"))
        made.append(lib.custom_op(
            "meshops::fused_attention_backward", _backward, mutates_args=(), device_types="cpu",
            schema="(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor out, "
                   "Tensor lse, float scale) -> (Tensor, Tensor, Tensor, Tensor)"))
        fwd, bwd = made
        fwd.register_fake(_forward_fake)
        bwd.register_fake(_backward_fake)
        fwd.register_autograd(_autograd_backward, setup_context=_setup_context)
    except BaseException:
        for op in made:  # all or nothing: no operator without its fake or autograd part
            _unregister(op)
        raise
    _OPS.update(forward=fwd, backward=bwd)


def _unregister(op) -> None:
    """Remove a custom operator again (torch.library has no public way; best effort:
    the caller reports the kernel unavailable, so nothing calls a remnant anyway)."""
    with suppress(Exception):
        from torch._library import custom_ops

        custom_ops.OPDEF_TO_LIB.pop(op._qualname, op._lib)._destroy()
        custom_ops.OPDEFS.pop(op._qualname, None)
