"""Galerkin- and Fourier-type (softmax-free) attention with quadrature weights.

Cao, "Choose a Transformer: Fourier or Galerkin" (§4, eqs. (5), (6), (8), (14)):
the ``1/n`` in the paper is the mesh weight of a uniform 1-D grid; here it is the
source mesh's quadrature weight ``w_j``, so both layers approximate integral
operators on any mesh.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from meshops.nn._utils import merge_heads, split_heads
from meshops.nn.base import Channels, GlobalAttentionBase

__all__ = ["GalerkinAttention", "FourierAttention"]


class _HeadNorm(torch.nn.Module):
    """Layer normalisation over each head's channels, with a per-head affine map.

    Equivalent to one :class:`torch.nn.LayerNorm` per head (as in the paper's
    reference code), applied to ``[B, H, N, D]``.
    """

    def __init__(self, heads: int, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.empty(heads, channels))
        self.bias = torch.nn.Parameter(torch.empty(heads, channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.ones_(self.weight)
        torch.nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        return x * self.weight[:, None, :] + self.bias[:, None, :]

    def extra_repr(self) -> str:
        return f"heads={self.weight.shape[0]}, channels={self.weight.shape[1]}, eps={self.eps}"


def galerkin_init_(weight: Tensor, eta: float, delta: float) -> Tensor:
    r"""The paper's initialisation ``W = xavier_uniform(gain=eta) + delta I``.

    The identity is added to the leading ``min(out, in)`` square block, so it also
    applies to rectangular projections.
    """
    with torch.no_grad():
        torch.nn.init.xavier_uniform_(weight, gain=eta)
        m = min(weight.shape)
        weight[:m, :m] += delta * torch.eye(m, dtype=weight.dtype, device=weight.device)
    return weight


#: rows (points per sample) per block in the two passes of :meth:`_SimpleAttention._attend`,
#: used without autograd on meshes of more than ``BLOCK_ABOVE`` points
ROWS = 16384
BLOCK_ABOVE = 131072


def _blocks(*tensors: Optional[Tensor], rows: int) -> list:
    """Each tensor ``[B, N, ...]`` split into blocks of ``rows`` points (``None`` stays
    ``None`` for every block); at least one block, even for ``N = 0``."""
    n = tensors[0].shape[1]
    if n and rows >= n:  # one block (no division: torch.export keeps N symbolic)
        return [[t] for t in tensors]
    size = max(1, min(rows, n)) if n else 1
    count = max(1, -(-n // size))
    return [[None] * count if t is None else list(t.split(size, dim=1)) for t in tensors]


class _SimpleAttention(GlobalAttentionBase):
    """Shared body of Galerkin and Fourier attention (they differ in which of
    Q, K, V are layer-normalised)."""

    _normed: Tuple[str, str]

    def __init__(self, in_channels: Channels, out_channels: Optional[int] = None,
                 heads: int = 4, pos_dim: int = 0, eta: float = 1e-2, delta: float = 1e-2,
                 dropout: float = 0.0, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self._init_channels(in_channels, out_channels, heads)
        out_channels = self.out_channels
        if not isinstance(pos_dim, int) or pos_dim < 0:
            raise ValueError(f"pos_dim must be a non-negative int, got {pos_dim!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.head_channels = out_channels // heads
        self.pos_dim = pos_dim
        self.eta = eta
        self.delta = delta
        self.dropout = dropout
        self._init_projections(bias, out_in=heads * (self.head_channels + pos_dim))
        self.norms = torch.nn.ModuleDict(
            {name: _HeadNorm(heads, self.head_channels, eps) for name in self._normed})
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_q, self.lin_k, self.lin_v):
            galerkin_init_(lin.weight, self.eta, self.delta)
            if lin.bias is not None:
                torch.nn.init.zeros_(lin.bias)
        for norm in self.norms.values():
            norm.reset_parameters()
        self.lin_out.reset_parameters()

    def _repr_extra(self) -> str:
        return f", pos_dim={self.pos_dim}" if self.pos_dim else ""

    def _with_pos(self, t: Tensor, pos: Optional[Tensor], name: str) -> Tensor:
        if not self.pos_dim:
            return t
        if pos is None:
            raise ValueError(f"{self.__class__.__name__} was built with pos_dim={self.pos_dim} "
                             f"and needs {name}, got None")
        if pos.shape[-1] != self.pos_dim:
            raise ValueError(f"{name} has {pos.shape[-1]} coordinates, expected "
                             f"pos_dim={self.pos_dim}")
        B, H, N, _ = t.shape
        pos = pos.to(t.dtype).unsqueeze(1).expand(B, H, N, self.pos_dim)
        return torch.cat([pos, t], dim=-1)  # coordinates first, as the reference code

    def _project(self, x: Tensor, lin: torch.nn.Linear, name: str, pos: Optional[Tensor],
                 pos_name: str) -> Tensor:
        t = split_heads(lin(x), self.heads)
        if name in self.norms:
            t = self.norms[name](t)
        return self._with_pos(t, pos, pos_name)

    def _attend(self, x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst):
        # Without autograd, two passes over row blocks, so that the [B, H, rows, D']
        # intermediates of a block stay in cache on large meshes (faster on CPU: python
        # -m benchmarks --only layers); the result is the same sum in a different
        # order. With autograd one block: the backward pass gained nothing from blocks,
        # nor did meshes that fit in cache anyway.
        weight = weight.to(x_src.dtype)
        grad = torch.is_grad_enabled() and (
            x_src.requires_grad or x_dst.requires_grad or weight.requires_grad
            or any(p.requires_grad for p in self.parameters()))
        n = max(x_src.shape[1], x_dst.shape[1], 1)
        rows = n if grad or n <= BLOCK_ABOVE else ROWS
        # K^T diag(w) V: a [B, H, D', D'] matrix per sample and head, O(N D'^2).
        # Padded and zero-weight source points drop out of the sum.
        kv = None
        # torch.split, not slicing: the backward of a split is one concatenation,
        # whereas each slice's backward would write a full-size zero gradient.
        for xs, ps, ws in zip(*_blocks(x_src, pos_src, weight, rows=rows)):
            k = self._project(xs, self.lin_k, "k", ps, "pos_src")
            v = self._project(xs, self.lin_v, "v", ps, "pos_src")
            part = (k * ws[:, None, :, None]).transpose(-1, -2) @ v
            kv = part if kv is None else kv + part
        if self.training and self.dropout > 0:
            kv = F.dropout(kv, self.dropout)
        out = []
        for xd, pd in zip(*_blocks(x_dst, pos_dst, rows=rows)):
            q = self._project(xd, self.lin_q, "q", pd, "pos_dst")
            out.append(self.lin_out(merge_heads(q @ kv)))
        return out[0] if len(out) == 1 else torch.cat(out, dim=1)


class GalerkinAttention(_SimpleAttention):
    r"""Galerkin-type (linear) attention with quadrature weights.

    Cao's Galerkin-type attention (eq. (6), (14)) with the mesh weight ``1/n``
    replaced by the source quadrature weights, per head:

    .. math::
        z = Q\,\big(\tilde K^\top \operatorname{diag}(w)\, \tilde V\big), \qquad
        z_i = \sum_{l} \Big(\sum_j w_j\, \tilde k_{jl}\, \tilde v_j\Big) q_{il}
            \approx \sum_l \Big(\int \tilde k_l(\xi)\, \tilde v(\xi)\, d\xi\Big) q_l(x_i),

    where :math:`\tilde\cdot` is a layer normalisation over each head's channels
    with its own learnable affine map (applied to K and V), followed by an output
    projection :math:`W_O` over the concatenated heads.  No softmax: the cost is
    :math:`O(N d^2)` per head.  With ``pos_dim > 0`` the coordinates are
    concatenated (in front) to every head's Q, K and V after the normalisation, as
    in the paper's reference code, so the head dimension grows to ``d + pos_dim``.
    Q/K/V projections are initialised as ``xavier_uniform(gain=eta) + delta I``.
    Cross-attention takes Q from the destination and K, V from the source.  A
    sample whose source weights are all zero has a zero integral (the output is
    then the output projection's bias).

    Args:
        in_channels (int or tuple): input channels, or ``(src, dst)``.
        out_channels (int, optional): output channels and total width of the
            Q/K/V projections; divisible by ``heads``. Defaults to the
            destination's ``in_channels``.
        heads (int): number of heads. (default: ``4``)
        pos_dim (int): number of coordinates concatenated to each head
            (``0``: none). (default: ``0``)
        eta (float): Xavier gain of the Q/K/V initialisation. (default: ``1e-2``)
        delta (float): diagonal added to the Q/K/V initialisation. (default: ``1e-2``)
        dropout (float): dropout on the ``[d, d]`` matrix ``K^T diag(w) V``.
            (default: ``0.0``)
        bias (bool): biases in the projections. (default: ``True``)
        eps (float): layer-norm epsilon. (default: ``1e-5``)

    Shapes:
        - **input (flat):** ``x [N, C]`` or ``(x_src [Ns, Cs], x_dst [Nd, Cd])``,
          ``pos [N, pos_dim]`` or a pair (only used when ``pos_dim > 0``),
          ``weight [Ns]``, ``batch [N]`` or a pair (sorted), optional
        - **output (flat):** ``[Nd, out_channels]``
        - **input (dense, :meth:`dense`):** ``x [B, N, C]`` or a pair,
          ``pos [B, N, pos_dim]`` or a pair, ``weight [B, Ns]``, ``mask [B, N]`` or
          a pair, optional
        - **output (dense):** ``[B, Nd, out_channels]`` (zeros on padded rows)
    """

    _normed = ("k", "v")


class FourierAttention(_SimpleAttention):
    r"""Fourier-type (softmax-free, kernel-integral) attention with quadrature weights.

    Cao's Fourier-type attention (eq. (5), (8)) with the mesh weight ``1/n``
    replaced by the source quadrature weights, per head:

    .. math::
        z = (\tilde Q \tilde K^\top) \operatorname{diag}(w)\, V, \qquad
        z_i = \sum_j w_j (\tilde q_i \cdot \tilde k_j)\, v_j
            \approx \int \kappa(x_i, \xi)\, v(\xi)\, d\xi,

    with :math:`\tilde\cdot` a per-head layer normalisation (on Q and K), then an
    output projection over the concatenated heads.  As in the paper there is no
    ``1/sqrt(d)`` scaling.  The product is evaluated as
    :math:`\tilde Q (\tilde K^\top \operatorname{diag}(w) V)` — the same number by
    associativity, at :math:`O(N d^2)` instead of :math:`O(N^2 d)` cost and
    memory; dropout therefore acts on the ``[d, d]`` matrix.  Coordinates
    (``pos_dim > 0``), initialisation, cross-attention and all arguments are as
    in :class:`GalerkinAttention`.

    Args:
        in_channels (int or tuple): input channels, or ``(src, dst)``.
        out_channels (int, optional): output channels (divisible by ``heads``).
        heads (int): number of heads. (default: ``4``)
        pos_dim (int): coordinates concatenated to each head. (default: ``0``)
        eta (float): Xavier gain of the Q/K/V initialisation. (default: ``1e-2``)
        delta (float): diagonal added to the Q/K/V initialisation. (default: ``1e-2``)
        dropout (float): dropout on ``K^T diag(w) V``. (default: ``0.0``)
        bias (bool): biases in the projections. (default: ``True``)
        eps (float): layer-norm epsilon. (default: ``1e-5``)

    Shapes:
        - **input (flat):** ``x [N, C]`` or ``(x_src [Ns, Cs], x_dst [Nd, Cd])``,
          ``pos`` (used when ``pos_dim > 0``), ``weight [Ns]``, ``batch``, optional
        - **output (flat):** ``[Nd, out_channels]``
        - **input (dense):** ``x [B, N, C]`` or a pair, ``pos [B, N, pos_dim]``,
          ``weight [B, Ns]``, ``mask [B, N]`` or a pair, optional
        - **output (dense):** ``[B, Nd, out_channels]`` (zeros on padded rows)
    """

    _normed = ("q", "k")
