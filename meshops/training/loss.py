"""Relative Lp losses between fields on meshes, with or without quadrature weights."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.utils import scatter


def relative_lp(pred: Tensor, target: Tensor, weight: Tensor | None = None,
                batch: Tensor | None = None, p: int = 2, reduction: str = "mean",
                eps: float = 1e-12) -> Tensor:
    """Per-sample relative Lp error ``||pred - target||_p / ||target||_p``.

    With ``weight`` the norms are quadrature integrals over the domain,
    ``(sum_i w_i |e_i|^p)^(1/p)``, so the loss is the same number on any mesh of the
    same fields; without it (``weight=None``) it is the plain vector norm used by
    the published benchmarks (Geo-FNO, PiT, Transolver), for comparison.
    All channels of a sample are pooled into one norm.

    Args:
        pred, target: ``[N, C]`` or ``[N]``.
        weight: Quadrature weights ``[N]`` or ``None``.
        batch: PyG batch vector ``[N]`` (``None``: one sample).
        p: Norm order.
        reduction: ``"mean"`` or ``"sum"`` over samples, or ``"none"`` for ``[B]``.

    Shapes:
        pred ``[N, C]``, target ``[N, C]``, weight ``[N]``, batch ``[N]`` -> ``[]`` or ``[B]``
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred has shape {tuple(pred.shape)} but target {tuple(target.shape)}")
    if pred.dim() == 1:
        pred, target = pred[:, None], target[:, None]
    err = (pred - target).abs().pow(p).sum(-1)
    ref = target.abs().pow(p).sum(-1)
    if weight is not None:
        err, ref = err * weight.to(err.dtype), ref * weight.to(ref.dtype)
    if batch is None:
        batch = torch.zeros(err.shape[0], dtype=torch.long, device=err.device)
    num = scatter(err, batch, dim=0, reduce="sum").pow(1 / p)
    den = scatter(ref, batch, dim=0, reduce="sum").pow(1 / p)
    per_sample = num / den.clamp_min(eps)
    if reduction == "none":
        return per_sample
    if reduction == "sum":
        return per_sample.sum()
    if reduction == "mean":
        return per_sample.mean()
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


class RelativeLpLoss(torch.nn.Module):
    """Module form of :func:`relative_lp`: ``loss(pred, target, weight, batch)``.

    Args:
        p: Norm order.
        quadrature: Weight the norms with the mesh's quadrature weights (default);
            ``False`` gives the unweighted per-point loss of the published recipes.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """

    def __init__(self, p: int = 2, quadrature: bool = True, reduction: str = "mean") -> None:
        super().__init__()
        self.p, self.quadrature, self.reduction = p, quadrature, reduction

    def forward(self, pred: Tensor, target: Tensor, weight: Tensor | None = None,
                batch: Tensor | None = None) -> Tensor:
        return relative_lp(pred, target, weight if self.quadrature else None, batch,
                           self.p, self.reduction)

    def extra_repr(self) -> str:
        return f"p={self.p}, quadrature={self.quadrature}, reduction={self.reduction!r}"
