"""Layer benchmarks: every layer of :mod:`meshops.nn` against a plain dense evaluation of
the same formula.

Inputs: ``N`` points uniform in the unit square, uniform quadrature weights ``1/N``,
64 channels, 4 heads, one sample (unless stated), float32.  ``impl="lib"`` is the
library layer as a user calls it; ``impl="ref"`` computes the same numbers the plain
way, materialising the ``N_dst x N_src`` matrix:

==========================  ==============================================================
case                        reference (``ref``)
==========================  ==============================================================
``continuum``               ``ContinuumAttention(impl="naive")``: explicit softmax
                            (``continuum_sdpa``: the library through PyTorch's SDPA)
``galerkin`` / ``fourier``  ``(Q K^T diag(w)) V`` with the ``N x N`` product formed first
``window``                  global softmax with a same-patch mask ``[N, N]``
``token``                   tokens and read-out with dense one-hot ``[N, P*M]`` matrices
``position``                ``PositionAttention(impl="kernel")`` (materialised kernel)
``position_batch``          8 samples on one mesh; the kernel recomputed per sample
                            (positions given per sample, ``impl="kernel"``)
``position_cross``          100k-style input mesh -> 2,048-point latent mesh; kernel path
                            (``position_cross_sdpa``: the library through PyTorch's SDPA)
``local_position_cross``    dense distances, top-k mask, softmax (same neighbourhoods)
``local_attention``         dense content logits with the kNN mask
==========================  ==============================================================
"""

from __future__ import annotations

import math
import types

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.harness import Case, Runner
from meshops.nn._utils import merge_heads, safe_log, split_heads

C = 64          # channels
H = 4           # heads
LATENT = 2048   # latent mesh of the cross cases
LAM = [1.0, 10.0, 100.0, 1000.0]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def points(n: int, device: str, d: int = 2, seed: int = 0) -> Tensor:
    return torch.rand(n, d, generator=_gen(seed)).to(device)


def features(n: int, device: str, c: int = C, seed: int = 1, grad: bool = True) -> Tensor:
    x = torch.randn(n, c, generator=_gen(seed)).to(device)
    return x.requires_grad_(grad)


def uniform_weight(n: int, device: str) -> Tensor:
    return torch.full((n,), 1.0 / n, device=device)


# ------------------------------------------------------------------ dense references
def dense_simple_attend(self, x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst):
    """Galerkin/Fourier attention with the ``[B, H, Nd, Ns]`` matrix formed first:
    ``((Q~ K~^T) diag(w)) V~`` - the same sum as the layer's ``Q~ (K~^T diag(w) V~)``."""
    heads = self.heads
    qkv = {"q": split_heads(self.lin_q(x_dst), heads),
           "k": split_heads(self.lin_k(x_src), heads),
           "v": split_heads(self.lin_v(x_src), heads)}
    for name, norm in self.norms.items():
        qkv[name] = norm(qkv[name])
    q = self._with_pos(qkv["q"], pos_dst, "pos_dst")
    k = self._with_pos(qkv["k"], pos_src, "pos_src")
    v = self._with_pos(qkv["v"], pos_src, "pos_src")
    att = (q @ k.transpose(-1, -2)) * weight[:, None, None, :]
    return self.lin_out(merge_heads(att @ v))


def dense_window_forward(self, x, pos, weight, batch=None, parts=None):
    """Windowed attention as a global softmax with a same-patch mask ``[N, N]``."""
    if parts is None:
        parts = self.partition(pos, batch)
    key = parts if batch is None else batch * (int(parts.max()) + 1) + parts
    q, k, v = (split_heads(t[None], self.heads) for t in self.lin_qkv(x).chunk(3, dim=-1))
    same = key[:, None] == key[None, :]
    bias = torch.where(same, safe_log(weight.to(x.dtype))[None, :],
                       torch.full((), float("-inf"), dtype=x.dtype, device=x.device))
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + bias
    out = torch.softmax(logits, dim=-1) @ v
    return self.lin_out(merge_heads(out)[0])


def dense_token_forward(self, x, pos, weight, batch=None, parts=None):
    """Patch-token attention (one sample) with dense one-hot ``[N, P*M]`` matrices for
    the token integrals and the read-out instead of padded per-patch groups."""
    if parts is None:
        parts = self.partition(pos, batch)
    _, gid = torch.unique(parts, return_inverse=True)
    G, M, N = int(gid.max()) + 1, self.num_basis, x.shape[0]
    measure, xi = self.local_coordinates(pos.to(x.dtype), weight, gid, G)
    onehot = F.one_hot(gid, G).to(x.dtype)                              # [N, G]
    w = weight.to(x.dtype)
    a = (onehot[:, :, None] * (w[:, None] * self.g(xi))[:, None, :]).reshape(N, G * M)
    t = (a.T @ self.lin_in(x)).view(G, M, -1)                           # [G, M, C']
    tokens = self.embed((t / measure[:, None, None]).reshape(G, -1))
    q, k, v = (split_heads(z[None], self.heads) for z in self.lin_qkv(tokens).chunk(3, -1))
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + measure.log()[None, None, None]
    out = torch.softmax(logits, dim=-1) @ v
    coeff = self.lin_out(merge_heads(out)[0]).view(G * M, self.out_channels)
    b = (onehot[:, :, None] * self.h(xi)[:, None, :]).reshape(N, G * M)
    return b @ coeff


def _sq_dist(a: Tensor, b: Tensor) -> Tensor:
    """``|a_i - b_j|^2`` ``[Na, Nb]``, coordinate by coordinate."""
    d = None
    for c in range(a.shape[-1]):
        diff = a[:, None, c] - b[None, :, c]
        d = diff * diff if d is None else d + diff * diff
    return d


def dense_local_position(layer, x_src, pos_src, pos_dst, weight) -> Tensor:
    """Local position attention with a dense ``[H, Nd, Ns]`` kernel and a top-k mask."""
    from meshops.nn.local import quantile_k

    ns = pos_src.shape[0]
    k = layer.k if layer.k is not None else quantile_k(layer.quantile, ns)
    dist = _sq_dist(pos_dst, pos_src)                                   # [Nd, Ns]
    idx = torch.topk(dist, k, dim=-1, largest=False).indices
    mask = torch.zeros_like(dist, dtype=torch.bool).scatter_(1, idx, True)
    logits = -layer.lam[:, None, None] * dist + safe_log(weight)[None, None, :]
    logits = logits.masked_fill(~mask, float("-inf"))
    heads, c = layer.heads, layer.out_channels // layer.heads
    v = layer.lin(x_src).view(ns, heads, c).transpose(0, 1)             # [H, Ns, c]
    out = torch.softmax(logits, dim=-1) @ v                             # [H, Nd, c]
    return out.transpose(0, 1).reshape(pos_dst.shape[0], heads * c)


def dense_local_attention(layer, x, pos, weight) -> Tensor:
    """kNN-restricted content attention with dense ``[H, N, N]`` logits and a top-k mask."""
    n = x.shape[0]
    dist = _sq_dist(pos, pos)
    idx = torch.topk(dist, layer.k, dim=-1, largest=False).indices
    mask = torch.zeros_like(dist, dtype=torch.bool).scatter_(1, idx, True)
    heads, c = layer.heads, layer.out_channels // layer.heads
    q = layer.lin_q(x).view(n, heads, c).transpose(0, 1)
    k = layer.lin_k(x).view(n, heads, c).transpose(0, 1)
    v = layer.lin_v(x).view(n, heads, c).transpose(0, 1)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(c) + safe_log(weight)[None, None, :]
    logits = logits.masked_fill(~mask, float("-inf"))
    out = (torch.softmax(logits, dim=-1) @ v).transpose(0, 1).reshape(n, heads * c)
    return layer.lin_out(out)


# -------------------------------------------------------------------------- builders
def _mod(module: torch.nn.Module, device: str) -> torch.nn.Module:
    return module.to(device)


def build_continuum(n: int, impl: str, device: str, lib_impl: str = "auto") -> Runner:
    """``lib_impl``: the library path measured as ``lib`` (``"auto"``: the default, i.e.
    meshops' fused kernel on the CPU; ``"sdpa"``: PyTorch's fused kernel)."""
    torch.manual_seed(0)
    from meshops.nn.continuum import ContinuumAttention

    att = _mod(ContinuumAttention(C, C, heads=H, impl=lib_impl if impl == "lib" else "naive"),
               device)
    x, w = features(n, device), uniform_weight(n, device)
    return Runner(lambda: att(x, None, w), att.parameters(), [x])


def _build_simple(cls_name: str, n: int, impl: str, device: str) -> Runner:
    from meshops.nn import galerkin

    torch.manual_seed(0)
    att = _mod(getattr(galerkin, cls_name)(C, C, heads=H, pos_dim=2), device)
    if impl == "ref":
        att._attend = types.MethodType(dense_simple_attend, att)
    x, pos, w = features(n, device), points(n, device), uniform_weight(n, device)
    return Runner(lambda: att(x, pos, w), att.parameters(), [x])


def build_galerkin(n: int, impl: str, device: str) -> Runner:
    torch.manual_seed(0)
    return _build_simple("GalerkinAttention", n, impl, device)


def build_galerkin_keepmem(n: int, impl: str, device: str) -> Runner:
    """``build_galerkin`` in a process whose glibc keeps freed memory (the builder runs in
    a fresh child before anything is timed, so the setting covers the whole measurement)."""
    from meshops.utils.allocator import keep_freed_memory

    if not keep_freed_memory():
        raise RuntimeError("galerkin_keepmem needs glibc (meshops.keep_freed_memory)")
    return build_galerkin(n, impl, device)


def build_fourier(n: int, impl: str, device: str) -> Runner:
    torch.manual_seed(0)
    return _build_simple("FourierAttention", n, impl, device)


def build_window(n: int, impl: str, device: str, patch_size: int = 1024) -> Runner:
    torch.manual_seed(0)
    from meshops.nn.patch import WindowAttention

    p = max(1, n // patch_size)
    att = _mod(WindowAttention(C, C, heads=H, num_patches=p, method="kd"), device)
    if impl == "ref":
        att.forward = types.MethodType(dense_window_forward, att)
    x, pos, w = features(n, device), points(n, device), uniform_weight(n, device)
    return Runner(lambda: att(x, pos, w), att.parameters(), [x], {"num_patches": p})


def build_token(n: int, impl: str, device: str, patch_size: int = 1024) -> Runner:
    torch.manual_seed(0)
    from meshops.nn.patch import PatchTokenAttention

    p = max(1, n // patch_size)
    att = _mod(PatchTokenAttention(C, C, heads=H, num_patches=p, method="kd", pos_dim=2),
               device)
    if impl == "ref":
        att.forward = types.MethodType(dense_token_forward, att)
    x, pos, w = features(n, device), points(n, device), uniform_weight(n, device)
    return Runner(lambda: att(x, pos, w), att.parameters(), [x], {"num_patches": p})


def _position(path: str, device: str):
    from meshops.nn.position import PositionAttention

    return _mod(PositionAttention(C, C, heads=H, lam_init=LAM, impl=path), device)


def build_position(n: int, impl: str, device: str) -> Runner:
    torch.manual_seed(0)
    att = _position("auto" if impl == "lib" else "kernel", device)
    x, pos, w = features(n, device), points(n, device), uniform_weight(n, device)
    return Runner(lambda: att(x, pos, w), att.parameters(), [x])


def build_position_batch(n: int, impl: str, device: str, batch: int = 8) -> Runner:
    """``batch`` samples on one mesh: the library gets the shared positions ``[N, d]``
    (kernel once for the batch); the reference gets them per sample ``[B, N, d]`` with
    the materialised-kernel path, i.e. the distance kernel recomputed for every sample."""
    torch.manual_seed(0)
    x = torch.randn(batch, n, C, generator=_gen(1)).to(device).requires_grad_()
    pos, w = points(n, device), uniform_weight(n, device)
    if impl == "lib":
        att = _position("auto", device)
        return Runner(lambda: att.dense(x, pos, w), att.parameters(), [x])
    att = _position("kernel", device)
    pos_b, w_b = pos.expand(batch, n, 2), w.expand(batch, n)
    return Runner(lambda: att.dense(x, pos_b, w_b), att.parameters(), [x])


def build_position_cross(n: int, impl: str, device: str, lib_path: str = "auto") -> Runner:
    torch.manual_seed(0)
    att = _position(lib_path if impl == "lib" else "kernel", device)
    x, pos, w = features(n, device), points(n, device), uniform_weight(n, device)
    lat = points(LATENT, device, seed=7)
    return Runner(lambda: att((x, None), (pos, lat), w), att.parameters(), [x])


def build_local_position_cross(n: int, impl: str, device: str, quantile: float = 0.01
                               ) -> Runner:
    torch.manual_seed(0)
    from meshops.nn.local import LocalPositionAttention, quantile_k

    att = _mod(LocalPositionAttention(C, C, heads=H, quantile=quantile, lam_init=LAM), device)
    x, pos, w = features(n, device), points(n, device), uniform_weight(n, device)
    lat = points(LATENT, device, seed=7)
    meta = {"k": quantile_k(quantile, n), "latent": LATENT}
    if impl == "lib":
        return Runner(lambda: att((x, None), (pos, lat), w), att.parameters(), [x], meta)
    return Runner(lambda: dense_local_position(att, x, pos, lat, w), att.parameters(), [x], meta)


def build_local_attention(n: int, impl: str, device: str, k: int = 16) -> Runner:
    torch.manual_seed(0)
    from meshops.nn.local import LocalAttention

    att = _mod(LocalAttention(C, C, heads=H, k=k), device)
    x, pos, w = features(n, device), points(n, device), uniform_weight(n, device)
    if impl == "lib":
        return Runner(lambda: att(x, pos, w), att.parameters(), [x])
    return Runner(lambda: dense_local_attention(att, x, pos, w), att.parameters(), [x])


# ------------------------------------------------------------------------------ cases
_P2 = [1 << k for k in range(10, 17)]            # 1k .. 64k
_P4 = [1024, 4096, 16384, 65536, 262144, 1048576]
_CROSS = [4096, 16384, 65536, 100_000, 262144, 1048576]
_LOCAL_CROSS = _CROSS[:-1]   # quantile 0.01 of 1M points is k = 10,000 per latent point


def cases() -> list[Case]:
    B = "benchmarks.layers:"
    return [
        Case("layers", "continuum", B + "build_continuum", _P2, [1024, 4096, 8192],
             desc="ContinuumAttention(64, heads=4), default impl (fused CPU kernel)",
             ref_desc="ContinuumAttention(impl='naive')", max_run_s=90.0, quick_max_run_s=12.0,
             must=(8192, 65536), must_impls=("lib", "ref")),
        Case("layers", "continuum_sdpa", B + "build_continuum", _P2, [1024, 4096],
             impls=("lib",), params={"lib_impl": "sdpa"},
             desc="ContinuumAttention(impl='sdpa'): PyTorch's fused kernel, for comparison",
             max_run_s=90.0, quick_max_run_s=12.0),
        Case("layers", "galerkin", B + "build_galerkin", _P4, [1024, 4096, 16384, 65536],
             desc="GalerkinAttention(64, heads=4, pos_dim=2)",
             ref_desc="dense (QK^T diag w) V", must=(16384, 65536, 262144, 1048576)),
        Case("layers", "galerkin_keepmem", B + "build_galerkin_keepmem", _P4,
             [16384, 65536], impls=("lib",),
             desc="GalerkinAttention, glibc keeping freed memory (meshops.utils.allocator)",
             must=(16384, 65536, 262144, 1048576)),
        Case("layers", "fourier", B + "build_fourier", _P4, [1024, 4096],
             desc="FourierAttention(64, heads=4, pos_dim=2)",
             ref_desc="dense (QK^T diag w) V"),
        Case("layers", "window", B + "build_window", _P4, [1024, 4096],
             desc="WindowAttention(64, heads=4, kd, P=N/1024)",
             ref_desc="global softmax with same-patch mask"),
        Case("layers", "token", B + "build_token", _P4, [1024, 4096],
             desc="PatchTokenAttention(64, heads=4, kd, P=N/1024, M=8)",
             ref_desc="dense one-hot token integrals"),
        Case("layers", "position", B + "build_position", _P2[:5], [1024, 2048],
             desc="PositionAttention(64, heads=4), self, path=auto",
             ref_desc="PositionAttention(path='kernel')"),
        Case("layers", "position_batch", B + "build_position_batch", [512, 1024, 2048, 4096],
             [1024, 2048], batch=8,
             desc="PositionAttention.dense, 8 samples sharing one mesh (kernel once)",
             ref_desc="kernel recomputed per sample (pos [B,N,d], path='kernel')",
             must=(2048,), must_impls=("lib", "ref")),
        Case("layers", "position_cross", B + "build_position_cross", _CROSS,
             [4096, 16384, 100_000],
             desc=f"PositionAttention cross N -> {LATENT} latent, path=auto",
             ref_desc="materialised kernel [H, 2048, N]", must=(100_000,)),
        Case("layers", "position_cross_sdpa", B + "build_position_cross", _CROSS,
             [4096, 16384], impls=("lib",), params={"lib_path": "sdpa"},
             desc=f"PositionAttention cross N -> {LATENT}, path='sdpa' (PyTorch's kernel)"),
        Case("layers", "local_position_cross", B + "build_local_position_cross", _LOCAL_CROSS,
             [4096, 100_000],
             desc=f"LocalPositionAttention cross N -> {LATENT}, quantile 0.01 (kNN incl.)",
             ref_desc="dense distances + top-k mask", must=(100_000,)),
        Case("layers", "local_attention", B + "build_local_attention", _P4, [1024, 4096],
             desc="LocalAttention(64, heads=4, k=16), self (kNN incl.)",
             ref_desc="dense logits + kNN mask"),
    ]


def verify_references(n: int = 300, device: str = "cpu", names=None) -> dict[str, float]:
    """Largest relative difference between library and reference outputs per case at a
    small ``n`` (both are built with the same seed, hence the same parameters)."""
    out = {}
    for case in cases():
        if names is not None and case.name not in names:
            continue
        build = globals()[case.builder.split(":")[1]]
        with torch.no_grad():
            a = build(n, "lib", device, **case.params).forward()
            b = build(n, "ref", device, **case.params).forward()
        out[case.name] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    return out
