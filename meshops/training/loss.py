"""Relative Lp losses between fields on meshes, with or without quadrature weights,
and per-sample error reports that say where the relative error is undefined.

With several target fields (:class:`~meshops.datasets.fields.TargetFields`) every
relative error is taken per field and averaged over the fields with their weights, so
that a field of small magnitude counts as much as a large one."""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import torch
from torch import Tensor
from torch_geometric.utils import scatter

from meshops.datasets.fields import TargetFields, field_mean


def lp_norms(pred: Tensor, target: Tensor, weight: Tensor | None = None,
             batch: Tensor | None = None, p: int = 2) -> tuple[Tensor, Tensor]:
    """Per-sample ``||pred - target||_p`` and ``||target||_p``.

    With ``weight`` the norms are quadrature integrals ``(sum_i w_i |e_i|^p)^(1/p)``;
    without, plain vector norms. All channels of a sample are pooled into one norm.

    The norms are scale-free: each sample's values are divided by its largest
    ``|target|`` or ``|pred - target|`` before the powers are taken and the norms
    multiplied back, ``||e|| = s ||e / s||``. Squares of fields of order 1e-20 would
    underflow float32 (the target would look zero everywhere) and those of order 1e20
    overflow it (an infinite loss); scaled, the relative error of a field is the same
    number at every magnitude that float32 can hold. ``s`` carries no gradient: the
    norms do not depend on it, so the gradient is that of the unscaled formula.

    Shapes:
        pred ``[N, C]`` or ``[N]``, target like pred, weight ``[N]``, batch ``[N]``
        -> ``([B], [B])``
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred has shape {tuple(pred.shape)} but target {tuple(target.shape)}")
    if pred.dim() == 1:
        pred, target = pred[:, None], target[:, None]
    if batch is None:
        batch = torch.zeros(pred.shape[0], dtype=torch.long, device=pred.device)
    diff = pred - target
    with torch.no_grad():
        big = torch.maximum(target.abs(), diff.abs()).amax(-1) if pred.shape[-1] else \
            target.new_zeros(pred.shape[0])
        scale = scatter(big, batch, dim=0, reduce="max")
        # an all-zero sample, or a non-finite one (which must stay non-finite): 1
        scale = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
        point_scale = scale[batch][:, None]
    err = (diff / point_scale).abs().pow(p).sum(-1)
    ref = (target / point_scale).abs().pow(p).sum(-1)
    if weight is not None:
        err, ref = err * weight.to(err.dtype), ref * weight.to(ref.dtype)
    num = _root(scatter(err, batch, dim=0, reduce="sum"), p) * scale
    den = _root(scatter(ref, batch, dim=0, reduce="sum"), p) * scale
    return num, den


def _root(total: Tensor, p: int) -> Tensor:
    """``total ** (1/p)`` with the gradient 0 where ``total`` is 0: the derivative of
    the root is infinite there and times the 0 of ``d total`` gave NaN (an exactly
    predicted field); 0 is a subgradient of the norm at 0.

    Shapes:
        ``[B]`` -> ``[B]``
    """
    zero = total == 0
    return torch.where(zero, torch.zeros_like(total),
                       torch.where(zero, torch.ones_like(total), total).pow(1 / p))


def field_norms(pred: Tensor, target: Tensor, weight: Tensor | None = None,
                batch: Tensor | None = None, p: int = 2,
                fields: TargetFields | None = None) -> tuple[Tensor, Tensor]:
    """:func:`lp_norms` of every target field: ``||pred_f - target_f||_p`` and
    ``||target_f||_p`` per sample and field, each over the field's channels
    (``fields=None``: all channels, one field).

    Shapes:
        pred ``[N, C]`` or ``[N]``, target like pred, weight ``[N]``, batch ``[N]``
        -> ``([B, F], [B, F])``
    """
    if fields is None:
        num, den = lp_norms(pred, target, weight, batch, p)
        return num[:, None], den[:, None]
    if pred.dim() == 1:
        pred, target = pred[:, None], target[:, None]
    fields.check_channels(pred.shape[-1])
    norms = [lp_norms(pred[:, sl], target[:, sl], weight, batch, p)
             for sl in fields.slices().values()]
    return torch.stack([n for n, _ in norms], 1), torch.stack([d for _, d in norms], 1)


def failed_samples(pred: Tensor, batch: Tensor | None = None,
                   num_samples: int | None = None) -> Tensor:
    """Which samples have a non-finite predicted value (NaN or inf) anywhere.

    With finite inputs and targets (the data sets refuse others) such a prediction
    is a failure of the model on that sample: its error is infinite, not undefined.

    Shapes:
        pred ``[N, C]`` or ``[N]``, batch ``[N]`` -> ``[B]`` bool
    """
    bad = ~torch.isfinite(pred)
    bad = bad.reshape(bad.shape[0], -1).any(-1) if bad.dim() > 1 else bad
    if batch is None:
        batch = torch.zeros(bad.shape[0], dtype=torch.long, device=bad.device)
    return scatter(bad.to(torch.int32), batch, dim=0, dim_size=num_samples,
                   reduce="max") > 0


def zero_target(ref_norm: Tensor, eps: float | None = None) -> Tensor:
    """Which samples have an all-zero target: a target norm ``<= eps``, by default
    the smallest normal number of its dtype (every value 0, or an underflowed
    denormal). The relative error of such a sample is ``||e|| / 0``: undefined, not
    a large number. Pass ``eps`` (in the target's units, as a norm) to count
    near-zero targets as zero too.
    """
    return ref_norm <= (torch.finfo(ref_norm.dtype).tiny if eps is None else eps)


def relative_lp(pred: Tensor, target: Tensor, weight: Tensor | None = None,
                batch: Tensor | None = None, p: int = 2, reduction: str = "mean",
                eps: float | None = None, fields: TargetFields | None = None) -> Tensor:
    """Per-sample relative Lp error ``||pred - target||_p / ||target||_p``, per target
    field and averaged over the fields (``fields``; ``None``: all channels pooled).

    With ``weight`` the norms are quadrature integrals over the domain,
    ``(sum_i w_i |e_i|^p)^(1/p)``, so the loss is the same number on any mesh of the
    same fields; without it (``weight=None``) it is the plain vector norm used by
    the published benchmarks (Geo-FNO, PiT, Transolver), for comparison.
    With ``fields`` each field's channels make one norm, and a sample's error is the
    weighted mean of its fields' relative errors
    (:mod:`meshops.datasets.fields`); without, all channels are pooled into one norm.

    A sample whose target (or one of whose fields) is zero everywhere (see
    :func:`zero_target`) has no relative error: it is refused with a ``ValueError``
    rather than divided by a tiny number (which gave errors of 1e5-1e12 and gradients
    to match). To report errors over data that holds such samples use
    :func:`lp_errors`.

    Args:
        pred, target: ``[N, C]`` or ``[N]``.
        weight: Quadrature weights ``[N]`` or ``None``.
        batch: PyG batch vector ``[N]`` (``None``: one sample).
        p: Norm order.
        reduction: ``"mean"`` or ``"sum"`` over samples, or ``"none"`` for ``[B]``.
        eps: Target norms up to ``eps`` count as zero (see :func:`zero_target`).
        fields: The target fields, or ``None`` for one field of all channels.

    Raises:
        ValueError: a sample with an all-zero target field (the message gives its index
            in the batch and the field), or an unknown ``reduction``.

    Shapes:
        pred ``[N, C]``, target ``[N, C]``, weight ``[N]``, batch ``[N]`` -> ``[]`` or ``[B]``
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    num, den = field_norms(pred, target, weight, batch, p, fields)
    zero = zero_target(den, eps)
    if bool(zero.any()):
        i, f = (int(v) for v in zero.nonzero()[0])
        what = "target" if fields is None else f"target field {fields.names[f]!r}"
        raise ValueError(f"relative_lp: the {what} of sample {i} of the batch is zero "
                         f"everywhere ({int(zero.any(-1).sum())} such samples); its relative "
                         f"L{p} error is undefined. Drop such samples from a relative loss, or "
                         f"report them with lp_errors()")
    per_sample = field_mean(num / den, fields)
    if reduction == "none":
        return per_sample
    if reduction == "sum":
        return per_sample.sum()
    return per_sample.mean()


def lp_errors(pred: Tensor, target: Tensor, weight: Tensor | None = None,
              batch: Tensor | None = None, p: int = 2, eps: float | None = None,
              fields: TargetFields | None = None) -> dict[str, Tensor]:
    """Per-sample relative and absolute Lp errors, for reports.

    Returns ``{"relative": [B], "fields": [B, F], "absolute": [B], "zero_target": [B]
    bool, "failed": [B] bool}``: ``"fields"`` holds the relative error of every target
    field (``fields``; ``None``: one field of all channels), NaN where the field's
    target is zero everywhere (:func:`zero_target`), since it is undefined there;
    ``"relative"`` is their weighted mean over the defined fields (NaN, and
    ``zero_target``, where no field is defined); the absolute error is
    ``||pred - target||_p`` over all channels (quadrature-weighted with ``weight``:
    ``(sum_i w_i |e_i|^p)^(1/p)``). A sample with a non-finite prediction
    (:func:`failed_samples`) has every error ``inf``, whatever its target: the model
    failed on it, and a mean over the samples must say so rather than leave it out.
    """
    num, den = field_norms(pred, target, weight, batch, p, fields)
    zero = zero_target(den, eps)
    failed = failed_samples(pred, batch, num.shape[0])
    rel = torch.where(zero, torch.full_like(num, float("nan")),
                      num / torch.where(zero, torch.ones_like(den), den))
    rel = torch.where(failed[:, None], torch.full_like(rel, float("inf")), rel)
    absolute = num[:, 0] if fields is None else lp_norms(pred, target, weight, batch, p)[0]
    mean = field_mean(rel, fields)
    return {"relative": mean, "fields": rel,
            "absolute": torch.where(failed, torch.full_like(absolute, float("inf")), absolute),
            "zero_target": torch.isnan(mean) & ~failed, "failed": failed}


def sample_errors(pred: Tensor, target: Tensor, weight: Tensor | None,
                  fields: TargetFields | None = None) -> dict[str, float]:
    """The errors reported for one sample: relative L2 quadrature-weighted (``"l2"``)
    and plain (``"l2_unweighted"``), the mean over the target ``fields`` (``None``: all
    channels pooled), NaN where the target is zero everywhere, and the
    quadrature-weighted absolute L2 error (``"abs_l2"``); all three ``inf`` where the
    prediction is not finite (a failure of the model); see :func:`lp_errors`.

    Shapes:
        pred, target: ``[N, C]``; weight: ``[N]`` or ``None`` (plain sums only)
    """
    weighted = lp_errors(pred, target, weight, fields=fields)
    plain = lp_errors(pred, target, None, fields=fields)
    return {"l2": float(weighted["relative"]), "l2_unweighted": float(plain["relative"]),
            "abs_l2": float(weighted["absolute"])}


def summarize_errors(values: Sequence[float], names: Sequence[str] | None = None) -> dict:
    """Mean, median and worst of per-sample errors, over the samples where they are
    defined (NaN marks an undefined relative error, see :func:`lp_errors`).

    An infinite error (a sample on which the model predicted a non-finite value) is
    defined: it counts, so the mean and the worst are ``inf`` and the worst sample
    is that one; the median is that of all defined errors.

    Returns ``mean``, ``median``, ``max`` (``None`` when no sample has a defined
    error), ``worst_sample`` and ``median_sample`` (from ``names``, default the
    indices), ``n`` (samples with a defined error), ``undefined`` (the names of the
    others) and ``failed`` (the names of the samples with an infinite error).
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    names = list(range(len(v))) if names is None else list(names)
    ok = ~np.isnan(v)
    idx = np.flatnonzero(ok)
    out = {"n": int(idx.size), "undefined": [names[i] for i in np.flatnonzero(~ok)],
           "failed": [names[i] for i in np.flatnonzero(np.isinf(v))]}
    if not idx.size:
        return {**out, "mean": None, "median": None, "max": None, "worst_sample": None,
                "median_sample": None}
    order = idx[np.argsort(v[idx], kind="stable")]
    worst, med = int(order[-1]), int(order[(len(order) - 1) // 2])
    return {**out, "mean": float(v[idx].mean()), "median": float(np.median(v[idx])),
            "max": float(v[worst]), "worst_sample": names[worst], "median_sample": names[med]}


def warn_zero_targets(names: Sequence, what: str = "target", stacklevel: int = 2) -> None:
    """One warning listing the samples whose relative error is undefined."""
    if len(names):
        shown = ", ".join(str(n) for n in list(names)[:5]) + (", ..." if len(names) > 5 else "")
        warnings.warn(f"{len(names)} sample(s) have a {what} that is zero everywhere, so their "
                      f"relative L2 error is undefined; it is left out of the relative means "
                      f"(their absolute error is reported): {shown}", UserWarning,
                      stacklevel=stacklevel + 1)


def warn_failed(names: Sequence, stacklevel: int = 2) -> None:
    """One warning listing the samples on which the model predicted a non-finite value."""
    if len(names):
        shown = ", ".join(str(n) for n in list(names)[:5]) + (", ..." if len(names) > 5 else "")
        warnings.warn(f"the model predicts a non-finite value (NaN or inf) on {len(names)} "
                      f"sample(s) with finite inputs: {shown}; their errors count as inf, so "
                      f"the mean and worst error are inf", UserWarning, stacklevel=stacklevel + 1)


class RelativeLpLoss(torch.nn.Module):
    """Module form of :func:`relative_lp`: ``loss(pred, target, weight, batch)``.

    A batch with an all-zero target field raises ``ValueError`` (see
    :func:`relative_lp`).

    Args:
        p: Norm order.
        quadrature: Weight the norms with the mesh's quadrature weights (default);
            ``False`` gives the unweighted per-point loss of the published recipes.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        fields: The target fields (:class:`~meshops.datasets.fields.TargetFields`):
            the loss is the weighted mean of their relative errors; ``None`` pools all
            channels into one norm.
    """

    def __init__(self, p: int = 2, quadrature: bool = True, reduction: str = "mean",
                 fields: TargetFields | None = None) -> None:
        super().__init__()
        self.p, self.quadrature, self.reduction = p, quadrature, reduction
        self.fields = fields

    def forward(self, pred: Tensor, target: Tensor, weight: Tensor | None = None,
                batch: Tensor | None = None) -> Tensor:
        return relative_lp(pred, target, weight if self.quadrature else None, batch,
                           self.p, self.reduction, fields=self.fields)

    def extra_repr(self) -> str:
        fields = "" if self.fields is None else f", fields={self.fields.describe()!r}"
        return (f"p={self.p}, quadrature={self.quadrature}, reduction={self.reduction!r}"
                f"{fields}")
