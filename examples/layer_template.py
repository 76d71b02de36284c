r"""Template: a new meshops layer in one file (copy it, rename the class, change the kernel).

The layer below is a Gaussian kernel integral operator, per head :math:`h`

.. math::
    \mathrm{out}(x_i) = W_O \Big[\sum_j w_j\, e^{-\|x_i - y_j\|^2 / (2\sigma_h^2)}\,
        (W_V u)^{(h)}(y_j)\Big]_h
    \approx W_O \Big[\int_\Omega e^{-\|x_i - y\|^2 / (2\sigma_h^2)}\,
        (W_V u)^{(h)}(y)\, dy\Big]_h ,

with the source mesh's quadrature weights :math:`w_j`, so it converges to one
operator as the mesh is refined.  Only :meth:`_attend` is the layer's own; the base
class (:class:`meshops.nn.GlobalAttentionBase`) provides the rest:

* the flat PyG form ``layer(x, pos, weight, batch)`` and cross-attention with
  ``(src, dst)`` pairs of ``x``, ``pos`` and ``batch``;
* the dense form ``layer.dense(x, pos, weight, mask)``;
* input checks, and trusted pre-validated inputs ``layer(x, batch_points(pos, weight,
  batch))`` whose forward compiles with ``torch.compile(fullgraph=True)``;
* ``reset_parameters`` (Glorot weights, zero biases) and ``__repr__``.

``_attend`` receives dense, checked tensors: ``x_src [B, Ns, Cs]``, ``x_dst [B, Nd,
Cd]``, ``pos_src [B, Ns, d]``, ``pos_dst [B, Nd, d]`` (or None when not given),
``weight [B, Ns]`` (zero on padding, so padding drops out of every sum) and the masks
(or None); keyword arguments of ``forward``/``dense`` beyond these come after them.  A
check of its own that reads tensor values runs only when
``meshops.utils.checks.checking()`` (eager calls, not under ``torch.compile``).  Padded
destination rows of its result are zeroed by the base.  For softmax
attention call :func:`meshops.nn.functional.weighted_attention`; for a neighbourhood
layer derive from :class:`meshops.nn.LocalAttentionBase` and implement
``_edges_attend`` instead.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from meshops.nn import GlobalAttentionBase

__all__ = ["GaussianIntegral"]


class GaussianIntegral(GlobalAttentionBase):
    r"""Gaussian kernel integral operator with quadrature weights (see the module).

    Args:
        in_channels (int or tuple): input channels, or ``(src, dst)`` channels.
        out_channels (int, optional): output channels, divisible by ``heads``.
            Defaults to the destination's ``in_channels``.
        heads (int): number of heads, each with its own width. (default: ``4``)
        sigma (float or sequence): kernel width, one or one per head. (default: ``0.1``)
        bias (bool): biases in :math:`W_V` and :math:`W_O`. (default: ``True``)

    Shapes:
        - **input (flat):** ``x [N, C]`` or ``(x_src, x_dst)``, ``pos [N, d]`` or a pair,
          ``weight [Ns]``, ``batch [N]`` or a pair (sorted), optional
        - **output (flat):** ``[Nd, out_channels]``
        - **dense:** ``x [B, N, C]``, ``pos [B, N, d]``, ``weight [B, Ns]``, ``mask``
          -> ``[B, Nd, out_channels]``
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]],
                 out_channels: Optional[int] = None, heads: int = 4,
                 sigma: Union[float, Sequence[float]] = 0.1, bias: bool = True) -> None:
        super().__init__()
        self._init_channels(in_channels, out_channels, heads)
        sigmas = [float(sigma)] * heads if isinstance(sigma, (int, float)) else list(sigma)
        if len(sigmas) != heads or min(sigmas) <= 0:
            raise ValueError(f"sigma must be positive, one value or one per head, got {sigma!r}")
        self.sigma = tuple(sigmas)   # plain floats: exact in any dtype
        self.lin_v = torch.nn.Linear(self.in_src, self.out_channels, bias=bias)
        self.lin_out = torch.nn.Linear(self.out_channels, self.out_channels, bias=bias)
        self.reset_parameters()

    def _attend(self, x_src: Tensor, x_dst: Tensor, pos_src: Optional[Tensor],
                pos_dst: Optional[Tensor], weight: Tensor, m_src: Optional[Tensor],
                m_dst: Optional[Tensor]) -> Tensor:
        if pos_src is None or pos_dst is None:
            raise ValueError(f"{type(self).__name__} needs the positions, got None")
        B, Ns, _ = x_src.shape
        H = self.heads
        d2 = torch.cdist(pos_dst.to(x_src.dtype), pos_src.to(x_src.dtype)).square()
        sigma = torch.tensor(self.sigma, dtype=x_src.dtype, device=x_src.device)[:, None, None]
        kernel = torch.exp(-d2[:, None] / (2 * sigma * sigma)) * weight[:, None, None, :]
        v = self.lin_v(x_src).view(B, Ns, H, -1).transpose(1, 2)            # [B, H, Ns, c]
        out = (kernel @ v).transpose(1, 2).flatten(2)                       # [B, Nd, H*c]
        return self.lin_out(out)

    def _repr_extra(self) -> str:
        return f", sigma={list(self.sigma)}"
