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
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from meshops.nn import functional
from meshops.nn._flex import flex_distance_attention
from meshops.nn._utils import as_pair, safe_log
from meshops.nn.base import (
    AttentionBase,
    GlobalAttentionBase,
    batch_points,
    dense_geometry,
    reset_linear,
)
from meshops.utils.checks import check_pos, checking

__all__ = ["PositionAttention", "position_kernel"]

IMPLS = ("auto", "kernel", "fused", "sdpa", "flex")
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


def _prepare_weight(weight: Tensor, has_dst: Optional[Tensor]) -> Tensor:
    """Reject samples whose source carries no weight (the normalising integral is
    zero) when they have destination points (when :func:`meshops.utils.checks.checking`:
    the test reads the values); scale each sample's weights by their maximum (the
    softmax is invariant to it, and ``log w`` near 0 keeps float32 rounding small).
    ``weight [(B,) Ns]``, ``has_dst [(B,)]`` or None (= all).  An empty source
    (``Ns = 0``) is a source without weight."""
    if weight.shape[-1] == 0:
        peak = weight.new_zeros(weight.shape[:-1] + (1,))
    else:
        peak = weight.amax(-1, keepdim=True)
    empty = peak.squeeze(-1) <= 0
    if checking() and bool(empty.any()):
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
        if not isinstance(p, Tensor) or p.dim() not in ((2,) if batch is not None else (2, 3)):
            check_pos(p, name)      # raises, naming the argument
    lam = _as_lam(lam, pos_src)
    if batch is not None:
        if mask is not None:
            raise ValueError("mask is for the dense form; the flat form takes batch")
        src, dst = batch_points((pos_src, pos_dst), weight, (b_src, b_dst))
        has_dst = (torch.full((1,), dst.num_points > 0, device=pos_src.device)
                   if dst.mask is None else dst.mask.any(-1))
        w = _prepare_weight(src.to_dense(weight).to(pos_src.dtype), has_dst)
        return _dense_kernel(src.to_dense(pos_src), dst.to_dense(pos_dst), w, lam)
    return _dense_form_kernel(pos_src, pos_dst, weight, mask, lam)


def _dense_form_kernel(pos_src: Tensor, pos_dst: Tensor, weight: Tensor,
                       mask: Optional[Tensor], lam: Tensor) -> Tensor:
    """:func:`position_kernel` of one mesh pair or a dense batch."""
    ps, pd, w, m_src, _, B = dense_geometry(pos_src, pos_dst, weight, mask, None,
                                            pos_src.shape[-2], pos_dst.shape[-2])
    w = w.to(ps.dtype)
    has_dst = torch.zeros((), dtype=torch.bool) if pd.shape[-2] == 0 else None
    if B is not None:  # a batch: broadcast, and the source mask folded into the weights
        ps, pd = ps.expand(B, *ps.shape[-2:]), pd.expand(B, *pd.shape[-2:])
        w = w.expand(B, ps.shape[-2])
        if m_src is not None:
            w = w.masked_fill(~m_src, 0)
            ps = ps.masked_fill(~m_src.unsqueeze(-1), 0)
    return _dense_kernel(ps, pd, _prepare_weight(w, has_dst), lam)


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


def _check_impl(impl: str, impls: Tuple[str, ...]) -> str:
    """``impl``, one of ``impls``."""
    if impl not in impls:
        raise ValueError(f"impl must be one of {impls}, got {impl!r}")
    return impl


class PositionAttention(PositionParameters, GlobalAttentionBase):
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
      times the batch size unless the mesh is shared), else ``"fused"`` where it
      applies, else ``"sdpa"`` (:func:`meshops.nn.functional.weighted_attention`);
      never ``"flex"``, whose gradients have not yet run on a GPU (opt-in).

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

    needs_x_dst = False     # the kernel depends on the positions only
    shared_mesh = True      # one mesh shared by a dense batch: one kernel for all samples

    def __init__(self, in_channels: int, out_channels: Optional[int] = None, heads: int = 4,
                 lam_init: Union[float, Sequence[float]] = 1.0, bias: bool = True,
                 impl: str = "auto", lam_param: str = "softplus") -> None:
        super().__init__()
        self._init_position_parameters(in_channels, out_channels, heads, lam_init, bias,
                                       lam_param)
        self.impl = _check_impl(impl, IMPLS)
        self.reset_parameters()

    def kernel(self, pos: PairOrTensor, weight: Tensor, batch: PairOrTensor = None,
               mask: Optional[Tensor] = None) -> Tensor:
        """:func:`position_kernel` with this layer's :math:`\\lambda`; ``pos`` is one
        tensor (self) or a ``(pos_src, pos_dst)`` pair."""
        pos_src, pos_dst = as_pair(pos)
        return position_kernel(pos_src, pos_dst, weight, self.lam, batch=batch,
                               mask=as_pair(mask)[0])

    # ---------------------------------------------------------- the layer contract
    def _weightless(self, extra: dict) -> bool:
        return extra.get("kernel") is not None      # a precomputed kernel holds them

    def _attend(self, x_src: Tensor, x_dst: None, pos_src: Optional[Tensor],
                pos_dst: Optional[Tensor], weight: Optional[Tensor], m_src: Optional[Tensor],
                m_dst: Optional[Tensor], kernel: Optional[Tensor] = None,
                lam: Optional[Tensor] = None) -> Tensor:
        """:class:`~meshops.nn.base.GlobalAttentionBase`'s ``_attend`` (positions and
        weights unbatched for a mesh shared by a dense batch), plus ``kernel``, a
        row-stochastic kernel as from :func:`position_kernel` / :meth:`kernel` for the
        same batch (positions and weights are then not used and may be None), and
        ``lam``, which replaces the layer's own :math:`\\lambda` (e.g. another layer's)."""
        v = head_values(self, x_src)                                     # [B, Ns, H, c]
        if kernel is not None:
            out = _apply_kernel(kernel, v)
            if m_dst is not None and m_dst.shape[1] != out.shape[1]:
                raise ValueError(f"kernel has {out.shape[1]} destination rows but batch_dst "
                                 f"has up to {m_dst.shape[1]} points per sample")
            return project_heads(self, out)
        if pos_src is None or pos_dst is None:
            raise ValueError(f"{type(self).__name__} needs pos (or a precomputed kernel=)")
        if m_dst is not None:
            has_dst = m_dst.any(-1)
        else:
            has_dst = None if pos_dst.shape[-2] else torch.zeros((), dtype=torch.bool)
        weight = _prepare_weight(weight.to(pos_src.dtype), has_dst)
        return project_heads(self, self._mix(v, pos_src, pos_dst, weight, lam))

    def _mix(self, v: Tensor, pos_src: Tensor, pos_dst: Tensor, weight: Tensor,
             lam: Optional[Tensor] = None) -> Tensor:
        """The kernel applied to ``v [B, Ns, H, c]`` -> ``[B, Nd, H, c]``; positions and
        prepared weights ``[Ns, ...]`` (shared) or batched."""
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
            return _apply_kernel(kernel, v)

        def expanded():
            return _expanded_attention(pos_src, pos_dst, weight, lam, v, impl)

        def flex():
            return flex_distance_attention(pos_dst, pos_src, lam, safe_log(weight), v)

        if impl == "flex":
            return flex()
        return expanded()
