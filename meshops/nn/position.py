r"""Position attention (PiT, Chen & Wu, §2.2): an input-independent attention kernel.

The attention weights depend only on the positions of the two meshes,

.. math::
    K^{(h)}_{ij} = \frac{w_j \exp(-\lambda_h \|x_i - y_j\|^2)}
                        {\sum_l w_l \exp(-\lambda_h \|x_i - y_l\|^2)}
                 = \mathrm{softmax}_j\big(-\lambda_h \|x_i - y_j\|^2 + \log w_j\big),

(:math:`x_i` destination points, :math:`y_j` source points with quadrature weights
:math:`w_j`), so a kernel can be computed once per pair of meshes and reused for
every channel, every sample of a batch that shares the mesh, and every layer with
the same :math:`\lambda` (:func:`position_kernel`, ``forward(..., kernel=K)``).
With :math:`w_j = 1/N` this is PiT's eq. (5)/(9); with a quadrature rule it is
the discretisation of the integral operator of PiT's eq. (7)-(8) on any mesh.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple, Union

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from meshops.nn import functional
from meshops.nn._flex import (MAX_HEAD_DIM, auto_fallback, auto_rule, flex_available,
                              flex_distance_attention)
from meshops.nn._utils import as_pair, check_weight, checking, safe_log
from meshops.nn.base import AttentionBase, batch_points, is_points, reset_linear

__all__ = ["PositionAttention", "position_kernel"]

IMPLS = ("auto", "kernel", "fused", "sdpa", "flex")
PATHS = IMPLS  # old name

#: Old name of :data:`meshops.nn.functional.KERNEL_LIMIT` (the threshold is read there).
KERNEL_LIMIT = functional.KERNEL_LIMIT

LAM_PARAMS = ("softplus", "exp")

PairOrTensor = Union[Tensor, Tuple[Optional[Tensor], Optional[Tensor]]]


# --------------------------------------------------------------------------- helpers
def _as_lam(lam: Union[Tensor, float, Sequence[float]], like: Tensor) -> Tensor:
    """``lam`` as a 1-D tensor ``[H]`` of positive values on ``like``'s device/dtype."""
    if not isinstance(lam, Tensor):
        lam = torch.as_tensor(lam, dtype=like.dtype, device=like.device)
    lam = lam.to(like.dtype).reshape(-1)
    if lam.numel() < 1:
        raise ValueError("lam must hold one value per head, got an empty tensor")
    if checking() and not bool(torch.isfinite(lam).all() & (lam > 0).all()):
        raise ValueError(f"lam must be finite and positive, got {lam.detach().tolist()}")
    return lam


def _check_pos(pos: Tensor, name: str, dims: Tuple[int, ...]) -> None:
    if not isinstance(pos, Tensor) or pos.dim() not in dims:
        got = tuple(pos.shape) if isinstance(pos, Tensor) else type(pos).__name__
        want = " or ".join({2: "[N, d]", 3: "[B, N, d]"}[d] for d in dims)
        raise ValueError(f"{name} must be a {want} tensor, got {got}")
    if not pos.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {pos.dtype}")


def _sq_dist(pos_src: Tensor, pos_dst: Tensor) -> Tensor:
    """Exact ``||x_i - y_j||^2`` ``[..., Nd, Ns]`` (coordinate by coordinate: no
    ``|x|^2 + |y|^2 - 2 x.y`` cancellation and no ``[Nd, Ns, d]`` temporary)."""
    dist = None
    for c in range(pos_src.shape[-1]):
        diff = pos_dst[..., :, None, c] - pos_src[..., None, :, c]
        dist = diff * diff if dist is None else dist + diff * diff
    return dist


def _dense_kernel(pos_src: Tensor, pos_dst: Tensor, weight: Tensor, lam: Tensor) -> Tensor:
    """Materialised kernel from validated dense inputs (zero weight = excluded).

    ``pos_src [(B,) Ns, d]``, ``pos_dst [(B,) Nd, d]``, ``weight [(B,) Ns]``,
    ``lam [H]`` -> ``[(B,) H, Nd, Ns]``.
    """
    dist = _sq_dist(pos_src, pos_dst).unsqueeze(-3)                 # [(B,) 1, Nd, Ns]
    logits = dist * (-lam[:, None, None]) + safe_log(weight)[..., None, None, :]
    return torch.softmax(logits, dim=-1)


def _prepare_weight(weight: Tensor, has_dst: Optional[Tensor], checked: bool = True) -> Tensor:
    """Reject samples whose source carries no weight (the normalising integral is
    zero) when they have destination points (``checked`` in eager mode only: the
    test reads the values); scale each sample's weights by their maximum (the softmax is invariant
    to it, and ``log w`` near 0 keeps float32 rounding small).  ``weight [(B,) Ns]``,
    ``has_dst [(B,)]`` or None (= all).  An empty source (``Ns = 0``) is a source
    without weight."""
    if weight.shape[-1] == 0:
        peak = weight.new_zeros(weight.shape[:-1] + (1,))
    else:
        peak = weight.amax(-1, keepdim=True)
    empty = peak.squeeze(-1) <= 0
    if checked and checking() and bool(empty.any()):
        bad = empty if has_dst is None else empty & has_dst
        if bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0]) if bad.dim() else 0
            raise ValueError(f"sample {i} has destination points but no source point with "
                             f"positive weight; position attention normalises by the source "
                             f"integral and is undefined")
    if weight.shape[-1] == 0:
        return weight
    # All-padding slots: dummy weights so that no NaN is formed anywhere.
    weight = torch.where(empty.unsqueeze(-1), torch.ones_like(weight), weight)
    return weight / torch.where(empty.unsqueeze(-1), torch.ones_like(peak), peak)


def position_kernel(pos_src: Tensor, pos_dst: Tensor, weight: Tensor,
                    lam: Union[Tensor, float, Sequence[float]],
                    batch: PairOrTensor = None,
                    mask: Optional[Tensor] = None) -> Tensor:
    r"""The weighted, row-normalised position-attention kernel.

    .. math::
        K_{hij} = \frac{w_j \exp(-\lambda_h \|x_i - y_j\|^2)}
                       {\sum_l w_l \exp(-\lambda_h \|x_i - y_l\|^2)}

    for destination points :math:`x_i`, source points :math:`y_j` with quadrature
    weights :math:`w_j` and one :math:`\lambda_h > 0` per head.  The kernel depends
    only on the meshes: compute it once and pass it to
    :meth:`PositionAttention.forward` / :meth:`PositionAttention.dense`
    (``kernel=K``) of every layer with the same :math:`\lambda` (e.g. from
    ``layer.lam`` or :meth:`PositionAttention.kernel`).  Gradients flow to ``lam``
    (and to the positions and weights).

    Three input forms:

    * one mesh pair: ``pos_src [Ns, d]``, ``pos_dst [Nd, d]``, ``weight [Ns]``
      -> ``[H, Nd, Ns]`` (shared by all samples of a batch);
    * dense batch: ``pos_* [B, N, d]`` (or one of them ``[N, d]``, shared),
      ``weight [B, Ns]`` or ``[Ns]``, optional source ``mask [B, Ns]``
      -> ``[B, H, Nd, Ns]``;
    * flat PyG batch: ``pos_src [Ns, d]``, ``pos_dst [Nd, d]``, ``weight [Ns]`` and
      ``batch=(batch_src, batch_dst)`` (or one vector for ``pos_src is pos_dst``)
      -> ``[B, H, Nd_max, Ns_max]``, padded as :func:`torch_geometric.utils.to_dense_batch`
      pads (padded columns are zero).

    Args:
        pos_src: source positions.
        pos_dst: destination positions (pass ``pos_src`` again for self-attention).
        weight: source quadrature weights (finite, non-negative).
        lam: positive :math:`\lambda` per head, ``[H]`` (or a float for ``H = 1``).
        batch: flat-form batch vector(s), sorted.
        mask: dense-form source mask ``[B, Ns]`` (True = real point).

    Returns:
        Tensor: the kernel; rows sum to 1.

    Raises:
        ValueError: on mismatched shapes, non-positive ``lam``, invalid weights, or
            a sample with destination points whose source carries no weight.
    """
    b_src, b_dst = as_pair(batch)
    for name, p in (("pos_src", pos_src), ("pos_dst", pos_dst)):
        _check_pos(p, name, (2,) if batch is not None else (2, 3))
    if pos_src.shape[-1] != pos_dst.shape[-1]:
        raise ValueError(f"pos_src and pos_dst have different dimensions "
                         f"({pos_src.shape[-1]} and {pos_dst.shape[-1]})")
    lam = _as_lam(lam, pos_src)
    if batch is not None:
        if mask is not None:
            raise ValueError("mask is for the dense form; the flat form takes batch")
        src, dst = batch_points((pos_src, pos_dst), weight, (b_src, b_dst))
        w = _prepare_weight(src.to_dense(weight).to(pos_src.dtype), dst.mask.any(-1))
        return _dense_kernel(src.to_dense(pos_src), dst.to_dense(pos_dst), w, lam)
    pos_src, pos_dst, weight, has_dst = _dense_inputs(pos_src, pos_dst, weight, mask, None, None)
    return _dense_kernel(pos_src, pos_dst, _prepare_weight(weight, has_dst), lam)


def _dense_inputs(pos_src: Tensor, pos_dst: Tensor, weight: Tensor, m_src: Optional[Tensor],
                  m_dst: Optional[Tensor], batch_size: Optional[int], check: bool = True
                  ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Validate dense inputs; fold the source mask into the weights.

    Keeps everything unbatched (one shared mesh) when positions and weights are
    unbatched and there is no source mask; otherwise broadcasts to a batch.
    Returns ``pos_src, pos_dst, weight (zeros on padding), has_dst``.
    """
    if not isinstance(weight, Tensor) or weight.dim() not in (1, 2):
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be [Ns] or [B, Ns], got {got}")
    ns = pos_src.shape[-2]
    if weight.shape[-1] != ns:
        raise ValueError(f"weight has shape {tuple(weight.shape)} but the source has {ns} "
                         f"points")
    if check:
        check_weight(weight.reshape(-1), weight.numel())
    sizes = {t.shape[0] for t in (pos_src, pos_dst) if t.dim() == 3}
    if weight.dim() == 2:
        sizes.add(weight.shape[0])
    for name, m, n in (("mask_src", m_src, ns), ("mask_dst", m_dst, pos_dst.shape[-2])):
        if m is not None:
            if m.dim() != 2 or m.shape[1] != n:
                raise ValueError(f"{name} has shape {tuple(m.shape)}, expected [B, {n}]")
            sizes.add(m.shape[0])
    if batch_size is not None and sizes:  # x's batch; unbatched pos/weight stay shared
        sizes.add(batch_size)
    if len(sizes) > 1:
        raise ValueError(f"inconsistent batch sizes {sorted(sizes)} among x, pos, weight, mask")
    weight = weight.to(pos_src.dtype)
    # No destination points: no sample needs a source integral (None means "all do").
    no_dst = pos_dst.shape[-2] == 0
    if not sizes:  # one mesh shared by the whole batch
        return pos_src, pos_dst, weight, (torch.zeros((), dtype=torch.bool) if no_dst else None)
    B = sizes.pop()
    pos_src = pos_src.expand(B, *pos_src.shape[-2:])
    pos_dst = pos_dst.expand(B, *pos_dst.shape[-2:])
    weight = weight.expand(B, ns)
    if m_src is not None:
        m_src = m_src.to(torch.bool)
        weight = weight.masked_fill(~m_src, 0)
        pos_src = pos_src.masked_fill(~m_src.unsqueeze(-1), 0)
    if m_dst is not None:
        has_dst = m_dst.to(torch.bool).any(-1)
    else:
        has_dst = torch.zeros(B, dtype=torch.bool) if no_dst else None
    return pos_src, pos_dst, weight, has_dst


# ------------------------------------------------------------------------ kernels
def _apply_kernel(kernel: Tensor, v: Tensor) -> Tensor:
    """``kernel [H, Nd, Ns]`` (shared) or ``[B, H, Nd, Ns]`` applied to per-head values
    ``v [B, Ns, H, c]`` -> ``[B, Nd, H, c]``."""
    B, Ns, H, c = v.shape
    if kernel.dim() not in (3, 4) or kernel.shape[-3] != H or kernel.shape[-1] != Ns \
            or (kernel.dim() == 4 and kernel.shape[0] != B):
        want = f"[{H}, N_dst, {Ns}] or [{B}, {H}, N_dst, {Ns}]"
        raise ValueError(f"kernel has shape {tuple(kernel.shape)}, expected {want}")
    kernel = kernel.to(v.dtype)
    Nd = kernel.shape[-2]
    if kernel.dim() == 3:
        # One kernel for the whole batch: fold the batch into the channels,
        # [H, Nd, Ns] @ [H, Ns, B*c], so the kernel is read once per head.
        vv = v.permute(2, 1, 0, 3).reshape(H, Ns, B * c)
        return torch.bmm(kernel, vv).view(H, Nd, B, c).permute(2, 1, 0, 3)
    return (kernel @ v.transpose(1, 2)).transpose(1, 2)              # [B, Nd, H, c]


def _expanded(pos_src: Tensor, pos_dst: Tensor, weight: Tensor, lam: Tensor, dtype: torch.dtype
              ) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``-\lambda\|x-y\|^2 + \log w`` as a dot product plus a per-key bias.

    ``-\lambda\|x-y\|^2 + \log w = 2\lambda x\cdot y - \lambda|y|^2 + \log w -
    \lambda|x|^2`` and the last term is constant along a softmax row, so with
    ``q = [2\lambda x, -\lambda]``, ``k = [y, |y|^2]`` and bias ``\log w`` (scale 1)
    a fused attention kernel computes the kernel block by block.  Positions are
    centred on the sample's source centroid first: the expansion subtracts numbers of
    size ``\lambda |y|^2``, whose rounding would swamp the distances of a mesh far from
    the origin.

    ``pos_src [Bk, Ns, d]``, ``pos_dst [Bk, Nd, d]``, ``weight [Bk, Ns]`` (scaled, zeros
    excluded), ``lam [H]`` -> ``q [Bk, H, Nd, d+1]``, ``k [Bk, 1, Ns, d+1]`` (shared by
    the heads), ``log w [Bk, Ns]`` (``-inf`` at zero weights).
    """
    valid = (weight > 0).to(pos_src.dtype).unsqueeze(-1)
    centre = (pos_src * valid).sum(-2, keepdim=True) / valid.sum(-2, keepdim=True)
    ys = (pos_src - centre).to(dtype)
    xs = (pos_dst - centre).to(dtype)
    k = torch.cat([ys, (ys * ys).sum(-1, keepdim=True)], -1).unsqueeze(1)    # [Bk,1,Ns,d+1]
    lam = lam.to(dtype)[None, :, None, None]                                  # [1,H,1,1]
    Bk, Nd = xs.shape[0], xs.shape[1]
    H = lam.shape[1]
    q = torch.cat([2 * lam * xs[:, None], (-lam).expand(Bk, H, Nd, 1)], -1)  # [Bk,H,Nd,d+1]
    return q, k, safe_log(weight.to(dtype))


def _shared_values(v: Tensor, shared: bool) -> Tensor:
    """``v [B, Ns, H, c]`` -> ``[1, H, Ns, B*c]`` for a shared mesh (the batch folded into
    the channels, so the kernel is evaluated once), else ``[B, H, Ns, c]``."""
    B, Ns, H, c = v.shape
    if shared:
        return v.permute(2, 1, 0, 3).reshape(1, H, Ns, B * c)
    return v.transpose(1, 2)


def _unshare(out: Tensor, B: int, c: int, shared: bool) -> Tensor:
    """Inverse of :func:`_shared_values` on the output: -> ``[B, Nd, H, c]``."""
    if shared:
        _, H, Nd, _ = out.shape
        return out.reshape(H, Nd, B, c).permute(2, 1, 0, 3)
    return out.transpose(1, 2)


def _expanded_attention(pos_src: Tensor, pos_dst: Tensor, weight: Tensor, lam: Tensor,
                        v: Tensor, impl: str = "auto") -> Tensor:
    r"""Position attention as softmax attention with a per-key bias, through
    :func:`meshops.nn.functional.weighted_attention` (no ``N_dst x N_src`` matrix).

    The logits are expanded as in :func:`_expanded` (scale 1, keys shared by the
    heads); a shared mesh (unbatched positions) folds the batch into the value
    channels, so its kernel is evaluated once.  ``impl``: ``"auto"`` (the fused kernel
    where it applies), ``"fused"``, or ``"sdpa"`` (``log w`` folded into the keys).

    ``pos_src [(Bk,) Ns, d]``, ``pos_dst [(Bk,) Nd, d]``, ``weight [(Bk,) Ns]`` (scaled,
    zeros excluded), ``lam [H]``, ``v [B, Ns, H, c]`` -> ``[B, Nd, H, c]``.
    """
    shared = pos_src.dim() == 2
    if shared:
        pos_src, pos_dst, weight = pos_src[None], pos_dst[None], weight[None]
    q, k, logw = _expanded(pos_src, pos_dst, weight, lam, v.dtype)
    out = functional.weighted_attention(q, k, _shared_values(v, shared), logw, scale=1.0,
                                        impl="fold" if impl == "sdpa" else impl)
    return _unshare(out, v.shape[0], v.shape[-1], shared)


def _flex_auto(v: Tensor, scores: int) -> bool:
    """``impl="auto"`` takes FlexAttention's exact-distance kernel for ``v [B, Ns, H, c]``
    (:func:`meshops.nn._flex.auto_rule`, per-head width at most ``MAX_HEAD_DIM``)."""
    return (auto_rule(v.device, v.dtype, scores) and v.shape[-1] <= MAX_HEAD_DIM
            and flex_available(v.device))


# ------------------------------------------- lambda and values (shared with local.py)
def lam_init_values(lam_init: Union[float, Sequence[float]], heads: int) -> list:
    """Initial :math:`\\lambda` per head from one value or one per head (validated)."""
    if isinstance(lam_init, (int, float)):
        init = [float(lam_init)] * heads
    else:
        init = [float(v) for v in lam_init]
    if len(init) != heads:
        raise ValueError(f"lam_init has {len(init)} values but heads={heads}")
    if not all(math.isfinite(v) and v > 0 for v in init):
        raise ValueError(f"lam_init must be finite and positive, got {lam_init!r}")
    return init


def inverse_softplus(values: Sequence[float]) -> Tensor:
    """``rho`` with ``softplus(rho) = values`` (float64; stable for small and large)."""
    y = torch.tensor(values, dtype=torch.float64)
    return y + torch.log(-torch.expm1(-y))


def project_after(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` (with ``lin``, ``heads``, ``in_channels``, ``out_channels``)
    applies ``W_V`` after its row-stochastic kernel: ``heads * in_channels <
    out_channels``.  Exact because ``K (x W + b) = (K x) W + b`` when rows of K sum
    to 1."""
    return layer.heads * layer.in_channels < layer.out_channels


def head_values(layer: torch.nn.Module, x: Tensor) -> Tensor:
    """Per-head values ``[..., N, H, c]``: ``x W_V + b`` split into heads, or the raw
    input repeated per head when :func:`project_after`."""
    if project_after(layer):
        return x.unsqueeze(-2).expand(*x.shape[:-1], layer.heads, layer.in_channels)
    return layer.lin(x).unflatten(-1, (layer.heads, layer.out_channels // layer.heads))


def project_heads(layer: torch.nn.Module, out: Tensor) -> Tensor:
    """Kernel-mixed values ``[..., H, c]`` -> ``[..., out_channels]``."""
    if project_after(layer):
        H = layer.heads
        weight = layer.lin.weight.view(H, layer.out_channels // H, layer.in_channels)
        out = torch.einsum("...hi,hoi->...ho", out, weight)
        if layer.lin.bias is not None:
            out = out + layer.lin.bias.view(H, -1)
    return out.flatten(-2)


# -------------------------------------------------------------------------- module
class PositionParameters(AttentionBase):
    """The parameters shared by global and local position attention: a positive
    ``lambda_h`` per head (``softplus`` or ``exp`` of a raw parameter ``lam_raw``, as
    ``lam_param`` says) and the value projection ``W_V`` (``self.lin``)."""

    def _init_position_parameters(self, in_channels: int, out_channels: Optional[int],
                                  heads: int, lam_init: Union[float, Sequence[float]],
                                  bias: bool, lam_param: str = "softplus") -> None:
        if not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f"in_channels must be a positive int, got {in_channels!r}")
        self._init_channels(in_channels, out_channels, heads)
        if lam_param not in LAM_PARAMS:
            raise ValueError(f"lam_param must be one of {LAM_PARAMS}, got {lam_param!r}")
        self.lam_param = lam_param
        self.lam_init = lam_init_values(lam_init, heads)
        self.lin = torch.nn.Linear(in_channels, self.out_channels, bias=bias)
        self.lam_raw = torch.nn.Parameter(torch.empty(heads))

    def reset_parameters(self) -> None:
        reset_linear(self.lin)
        init = torch.tensor(self.lam_init, dtype=torch.float64)
        with torch.no_grad():
            self.lam_raw.copy_(inverse_softplus(self.lam_init) if self.lam_param == "softplus"
                               else torch.log(init))

    @property
    def lam(self) -> Tensor:
        r""":math:`\lambda_h > 0`, ``[heads]``: :math:`\mathrm{softplus}(\rho_h)`, or
        :math:`\exp(\rho_h)` with ``lam_param="exp"`` (Adam then moves
        :math:`\lambda` by a relative amount per step, so sharp kernels are reachable;
        PiT's reference code uses :math:`\tan(\frac{\pi}{4}(1 + \sin r))` for the
        same reason)."""
        if self.lam_param == "exp":
            return torch.exp(self.lam_raw)
        return F.softplus(self.lam_raw)

    @property
    def project_after(self) -> bool:
        """Apply :math:`W_V` after the kernel (``heads * in_channels < out_channels``).

        The kernel is linear and its rows sum to 1, so ``K (x W + b) = (K x) W + b``
        per head; mixing the ``in_channels`` input channels per head instead of the
        ``out_channels / heads`` projected ones is cheaper for narrow inputs (e.g. a
        PiT encoder lifting a few input fields from a large mesh).
        """
        return project_after(self)

    def _repr_extra(self) -> str:
        return "" if self.lam_param == "softplus" else f", lam_param={self.lam_param!r}"


def _impl_from_path(impl: str, path: Optional[str], impls: Tuple[str, ...]) -> str:
    """``impl``, or the deprecated ``path=`` keyword it replaced."""
    if path is not None:
        warnings.warn("PositionAttention(path=...) is deprecated; use impl=... (the one "
                      "keyword of every meshops layer)", DeprecationWarning, stacklevel=3)
        impl = path
    if impl not in impls:
        raise ValueError(f"impl must be one of {impls}, got {impl!r}")
    return impl


class PositionAttention(PositionParameters):
    r"""Position attention of PiT (global, self or cross) with quadrature weights.

    PiT's eqs. (5) and (9), with the source mesh's quadrature weights :math:`w_j`
    in the softmax and one :math:`\lambda_h > 0` per head:

    .. math::
        \mathrm{PosAtt}(U)_i^{(h)} = \sum_j
            \mathrm{softmax}_j\big(-\lambda_h \|x_i - y_j\|^2 + \log w_j\big)\,
            (U W_V)^{(h)}_j ,

    i.e. the discretisation of :math:`\int_\Omega \kappa^{\lambda}(x - y)\, v(y) W_V
    \,dy` (PiT eqs. (7)-(8)) by the source rule :math:`\{(y_j, w_j)\}`.  :math:`x_i`
    are destination points, :math:`y_j` source points; for self-attention both are
    the same mesh.  The ``out_channels`` of :math:`U W_V` are split into ``heads``
    slices, each mixed by its own kernel; heads are concatenated (no output
    projection: PiT follows the attention with an MLP).  The kernel does not
    depend on :math:`U`; the destination features are never used (cross-attention
    accepts ``x=(x_src, None)``).  :math:`\lambda_h = \mathrm{softplus}(\rho_h)`
    with a raw parameter :math:`\rho_h` (``lam_raw``), so it stays positive; it has
    units of 1/length^2 (the kernel's width is about :math:`1/\sqrt{\lambda}`).

    Computation (``impl``):

    * ``"kernel"``: the ``[H, N_dst, N_src]`` kernel is materialised (exact distances)
      and applied with a matrix product; for a mesh shared by the batch (dense form
      with unbatched ``pos``) it is built once for all samples;
    * ``"fused"``: memory-light; ``-\lambda\|x-y\|^2 + \log w`` is expanded into a dot
      product of centred positions plus a per-key bias ``log w`` and run through
      meshops' fused CPU kernel (no ``N_dst x N_src`` matrix, forward or backward);
      float32 rounding of the logits is about ``\lambda R^2 \cdot 10^{-7}`` for a
      source of radius ``R`` around its centroid.  CPU, float32/float64, at most 64
      value channels per head (for a mesh shared by the batch: ``batch * channels``
      per head);
    * ``"sdpa"``: the same expansion through
      :func:`~torch.nn.functional.scaled_dot_product_attention` (PyTorch's fused
      kernel, CPU or GPU), ``log w`` folded into the keys;
    * ``"flex"``: PyTorch's FlexAttention with the whole logit
      ``-\lambda_h\|x_i-y_j\|^2 + \log w_j`` as its ``score_mod``
      (:func:`meshops.nn._flex.flex_distance_attention`): exact distances in float32
      inside the kernel even for bf16 values, no ``N_dst x N_src`` matrix; CUDA
      forward and backward, CPU forward only (torch 2.13); per-head value width at
      most 256;
    * ``"auto"`` (default): ``"kernel"`` when the kernel has at most
      :data:`meshops.nn.functional.KERNEL_LIMIT` entries (``heads * N_dst * N_src``,
      times the batch size unless the mesh is shared), else ``"flex"`` on CUDA at
      ``N_dst * N_src >=`` :data:`meshops.nn._flex.FLEX_MIN_SCORES` (float16,
      bfloat16, float32), else ``"fused"`` where it applies, else ``"sdpa"``
      (:func:`meshops.nn.functional.weighted_attention`).

    Either way the cost is ``heads * N_dst * N_src`` exponentials per call (per sample
    unless the mesh is shared; timings: ``python -m benchmarks --only layers``).
    When ``heads * in_channels < out_channels`` the kernel mixes the input channels and
    :math:`W_V` is applied afterwards (:attr:`project_after`; exact, as the kernel's
    rows sum to 1), which keeps the values narrow.

    A precomputed kernel (:func:`position_kernel`, :meth:`kernel`) passed as
    ``kernel=`` is used as is (the layer's own :math:`\lambda` is then ignored): build
    it once per mesh pair and share it across layers with equal :math:`\lambda`.

    Args:
        in_channels (int): source feature channels.
        out_channels (int, optional): output channels, divisible by ``heads``.
            Defaults to ``in_channels``.
        heads (int): number of heads, each with its own :math:`\lambda_h`.
            (default: ``4``)
        lam_init (float or sequence): initial :math:`\lambda` (one value, or one per
            head), positive. (default: ``1.0``)
        bias (bool): bias in :math:`W_V`. (default: ``True``)
        impl (str): ``"auto"``, ``"kernel"``, ``"fused"``, ``"sdpa"`` or ``"flex"``, see
            above.
            (``path=`` is the deprecated old name.)
        lam_param (str): ``"softplus"`` (default) or ``"exp"``: how :math:`\lambda`
            is made positive from the raw parameter ``lam_raw`` (see :attr:`lam`).

    Shapes:
        - **input (flat):** ``x [Ns, C]`` (or ``(x_src [Ns, C], x_dst or None)``),
          ``pos [N, d]`` or ``(pos_src [Ns, d], pos_dst [Nd, d])``, ``weight [Ns]``,
          ``batch [N]`` or ``(batch_src [Ns], batch_dst [Nd])`` (sorted), optional;
          ``kernel`` ``[H, Nd, Ns]`` or ``[B, H, Nd_max, Ns_max]``, optional
        - **output (flat):** ``[Nd, out_channels]``
        - **input (dense, :meth:`dense`):** ``x [B, Ns, C]`` (or a pair),
          ``pos [N, d]`` (one mesh shared by the batch) or ``[B, N, d]`` (or a pair
          of either), ``weight [Ns]`` or ``[B, Ns]``, ``mask [B, N]`` or
          ``(mask_src, mask_dst)``, optional
        - **output (dense):** ``[B, Nd, out_channels]`` (zeros on padded rows)
        - empty inputs (``N = 0``, or ``Nd = 0`` in cross-attention) give an empty
          output of these shapes (``[0, out_channels]`` flat); an empty source with
          destination points is the zero-weight error below.

    Raises:
        ValueError: ``out_channels`` not divisible by ``heads``, non-positive
            ``lam_init``, unknown ``impl`` or ``lam_param``; at call time mismatched lengths or
            dimensions, invalid weights (negative, non-finite, wrong length), a
            sample with destination points but no source weight, or a kernel of the
            wrong shape.

    Example:
        >>> att = PositionAttention(64, heads=4)
        >>> y = att(x, pos, weight, batch)                      # global, flat batch
        >>> z = att((x_in, None), (pos_in, pos_lat), w_in)      # cross: input -> latent
        >>> K = att.kernel(pos_lat, w_lat)                      # [4, N, N], built once
        >>> y = att.dense(x_lat, pos_lat, w_lat, kernel=K)      # x_lat [B, N, 64]
    """

    def __init__(self, in_channels: int, out_channels: Optional[int] = None, heads: int = 4,
                 lam_init: Union[float, Sequence[float]] = 1.0, bias: bool = True,
                 impl: str = "auto", lam_param: str = "softplus",
                 path: Optional[str] = None) -> None:
        super().__init__()
        self._init_position_parameters(in_channels, out_channels, heads, lam_init, bias,
                                       lam_param)
        self.impl = _impl_from_path(impl, path, IMPLS)
        self.reset_parameters()

    @property
    def path(self) -> str:
        """Old name of :attr:`impl`."""
        return self.impl

    @path.setter
    def path(self, value: str) -> None:
        self.impl = value

    def kernel(self, pos: PairOrTensor, weight: Tensor, batch: PairOrTensor = None,
               mask: Optional[Tensor] = None) -> Tensor:
        """:func:`position_kernel` with this layer's :math:`\\lambda`; ``pos`` is one
        tensor (self) or a ``(pos_src, pos_dst)`` pair."""
        pos_src, pos_dst = as_pair(pos)
        return position_kernel(pos_src, pos_dst, weight, self.lam, batch=batch,
                               mask=as_pair(mask)[0])

    # -------------------------------------------------------------------- flat
    def forward(self, x: PairOrTensor, pos: Any, weight: Optional[Tensor] = None,
                batch: PairOrTensor = None, kernel: Optional[Tensor] = None,
                lam: Optional[Tensor] = None) -> Tensor:
        """Flat (PyG) form; see the class docstring for shapes.  With ``kernel`` (a
        row-stochastic kernel as from :func:`position_kernel` / :meth:`kernel`, for the
        same ``batch``), ``pos`` and ``weight`` are not used and may be None.  ``pos``
        may be a :class:`~meshops.nn.base.Points` pair (trusted: no value checks).
        ``lam`` replaces the layer's own :math:`\\lambda` (e.g. another layer's, to
        share it)."""
        x_src = as_pair(x)[0]
        self._check_x(x_src, self.in_channels, "x")
        trusted = is_points(pos)
        v = self._values(x_src)
        if kernel is not None and not trusted:
            b_src, b_dst = as_pair(batch)
            n_dst = kernel.shape[-2] if b_dst is None else b_dst.shape[0]
            src, dst = batch_points((None, None), None, (b_src, b_dst),
                                    (x_src.shape[0], n_dst))
            checked = True
        else:
            if not trusted:
                pos_src, pos_dst = as_pair(pos)
                _check_pos(pos_src, "pos_src", (2,))
                _check_pos(pos_dst, "pos_dst", (2,))
                n_dst = pos_dst.shape[0]
            else:
                n_dst = as_pair(pos)[1].num_points
            src, dst, checked = self._points(pos, weight, batch, x_src.shape[0], n_dst)
        vd = src.to_dense(v.flatten(1)).unflatten(-1, v.shape[1:])
        if kernel is not None:
            out = self._project(_apply_kernel(kernel, vd))
            if dst.index is not None and dst.max_points != out.shape[1]:
                raise ValueError(f"kernel has {out.shape[1]} destination rows but batch_dst "
                                 f"has up to {dst.max_points} points per sample")
            return dst.to_flat(out)
        ps = src.to_dense(src.pos)
        pd = ps if dst.pos is src.pos and dst.index is src.index else dst.to_dense(dst.pos)
        if dst.mask is not None:
            has_dst = dst.mask.any(-1)
        else:
            has_dst = None if n_dst else torch.zeros(1, dtype=torch.bool)
        w = _prepare_weight(src.to_dense(src.weight).to(ps.dtype), has_dst, checked)
        return dst.to_flat(self._attend(vd, ps, pd, w, lam))

    # ------------------------------------------------------------------- dense
    def dense(self, x: PairOrTensor, pos: PairOrTensor, weight: Optional[Tensor],
              mask: PairOrTensor = None, kernel: Optional[Tensor] = None,
              lam: Optional[Tensor] = None, check: bool = True) -> Tensor:
        """Dense form: ``x [B, Ns, C]`` (or ``(x_src, x_dst or None)``), ``pos [N, d]``
        (one mesh shared by the batch: the kernel is built once) or ``[B, N, d]`` (or a
        ``(pos_src, pos_dst)`` pair), ``weight [Ns]`` or ``[B, Ns]``, ``mask [B, N]`` or
        ``(mask_src, mask_dst)`` (True = real point), ``kernel`` as from
        :func:`position_kernel`, ``lam`` as in :meth:`forward`; ``check=False`` skips
        the value checks (weights already validated).  Returns ``[B, Nd, out_channels]``,
        zeros on padded destination rows."""
        x_src = as_pair(x)[0]
        self._check_x(x_src, self.in_channels, "x", 3)
        m_src, m_dst = as_pair(mask)
        B, Ns = x_src.shape[:2]
        if m_src is not None:
            if m_src.shape != (B, Ns):
                raise ValueError(f"mask_src has shape {tuple(m_src.shape)}, expected {(B, Ns)}")
            # garbage (even NaN) in padded slots must not reach real outputs
            x_src = x_src.masked_fill(~m_src.to(torch.bool).unsqueeze(-1), 0)
        v = self._values(x_src)
        if kernel is not None:
            out = self._project(_apply_kernel(kernel, v))
        else:
            pos_src, pos_dst = as_pair(pos)
            _check_pos(pos_src, "pos_src", (2, 3))
            _check_pos(pos_dst, "pos_dst", (2, 3))
            if pos_src.shape[-2] != Ns:
                raise ValueError(f"pos_src has {pos_src.shape[-2]} points but x_src has {Ns}")
            if pos_src.shape[-1] != pos_dst.shape[-1]:
                raise ValueError(f"pos_src and pos_dst have different dimensions "
                                 f"({pos_src.shape[-1]} and {pos_dst.shape[-1]})")
            ps, pd, w, has_dst = _dense_inputs(pos_src, pos_dst, weight, m_src, m_dst, B, check)
            out = self._attend(v, ps, pd, _prepare_weight(w, has_dst, check), lam)
        if m_dst is not None:
            if m_dst.shape != out.shape[:2]:
                raise ValueError(f"mask_dst has shape {tuple(m_dst.shape)}, expected "
                                 f"{tuple(out.shape[:2])}")
            out = out.masked_fill(~m_dst.to(torch.bool).unsqueeze(-1), 0)
        return out

    # ---------------------------------------------------------------- internals
    def _values(self, x: Tensor) -> Tensor:
        return head_values(self, x)

    def _project(self, out: Tensor) -> Tensor:
        return project_heads(self, out)

    def _attend(self, v: Tensor, pos_src: Tensor, pos_dst: Tensor, weight: Tensor,
                lam: Optional[Tensor] = None) -> Tensor:
        """``v [B, Ns, H, c]``; positions/weights ``[Ns, ...]`` (shared) or batched."""
        lam = self.lam if lam is None else lam
        shared = pos_src.dim() == 2
        nb = 1 if shared else v.shape[0]
        nd, ns = pos_dst.shape[-2], pos_src.shape[-2]
        impl = self.impl
        if impl == "auto" and functional.materialise_kernel(nb * self.heads * nd * ns):
            impl = "kernel"
        if nd == 0 or ns == 0:
            # Nothing to attend (only padded rows are left): the materialised kernel
            # is empty and its product keeps the graph, so backward works too.
            impl = "kernel"
        if impl == "kernel":
            kernel = _dense_kernel(pos_src.to(v.dtype), pos_dst.to(v.dtype),
                                   weight.to(v.dtype), lam.to(v.dtype))
            return self._project(_apply_kernel(kernel, v))
        def expanded():
            return _expanded_attention(pos_src, pos_dst, weight, lam, v, impl)

        def flex():
            return flex_distance_attention(pos_dst, pos_src, lam, safe_log(weight), v)

        if impl == "flex":
            return self._project(flex())
        if impl == "auto" and _flex_auto(v, nd * ns):
            return self._project(auto_fallback(flex, expanded))
        return self._project(expanded())
