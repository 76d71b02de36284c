"""Error against the rollout horizon, beside two baselines that need no training.

For every test series and every step ``h = 1 .. H`` after the start, the relative L2
error of a predicted state against the true one, with the mesh's quadrature weights
and all state channels pooled (the metric of :func:`meshops.training.loss.lp_errors`;
NaN where the true state is zero everywhere). Statistics per step are over the
series (mean, median and worst, NaN left out).

The baselines:

* **persistence**: the state at the start, held for every later step (what a model
  must beat to have learned any dynamics);
* **nearest training trajectory**: the states of the training series closest to the
  test series, at the same steps after the same start. Closest by the parameters
  (each standardised by its spread over the training series) when the series have
  them, else by the initial state (the quadrature-weighted L2 distance between the
  states at the start). A training series on other points than the test series (a
  family of geometries) is moved to the test series' points by linear moving least
  squares (:func:`on_points_of`); steps beyond the chosen series' end are NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from meshops.datasets.series import TimeSeries
from meshops.training.loss import lp_errors, summarize_errors

__all__ = ["HorizonErrors", "horizon_statistics", "nearest_trajectory", "persistence",
           "same_points", "step_errors"]


@dataclass
class HorizonErrors:
    """Per-series, per-step relative errors of one predictor.

    Attributes:
        name: ``"model"``, ``"persistence"`` or ``"nearest training trajectory"``.
        errors: ``[S, H]`` float64, NaN where undefined or unavailable; None when the
            predictor is not available at all.
        note: How it was computed, or why it is not available (``"n/a: ..."``).
        chosen: For the nearest trajectory, the name of the training series used for
            each test series.
    """

    name: str
    errors: np.ndarray | None
    note: str = ""
    chosen: list[str] | None = None


def step_errors(pred: Tensor, truth: Tensor, weight: Tensor) -> np.ndarray:
    """Relative L2 error of each step, quadrature-weighted, channels pooled.

    Shapes:
        pred, truth ``[H, N, C]``, weight ``[N]`` -> ``[H]`` float64 (NaN where the
        true state is zero everywhere)
    """
    h, n, c = truth.shape
    batch = torch.arange(h).repeat_interleave(n)
    e = lp_errors(pred.to(torch.float64).reshape(h * n, c),
                  truth.to(torch.float64).reshape(h * n, c),
                  weight.to(torch.float64).repeat(h), batch)
    return e["relative"].numpy()


def persistence(series: TimeSeries, targets: Sequence[str], start: int, steps: int
                ) -> Tensor:
    """The state at ``start`` held for ``steps`` steps.

    Shapes:
        -> ``[steps, N, C]`` float64
    """
    u = series.channels(targets)[start]
    return u[None].expand(steps, *u.shape)


def same_points(a: TimeSeries, b: TimeSeries) -> bool:
    """Whether two series are on the same points (within ``1e-9`` of the extent)."""
    pa, pb = a.mesh.pos, b.mesh.pos
    if pa.shape != pb.shape:
        return False
    scale = max(float(pa.abs().max()), 1.0)
    return bool(((pa - pb).abs() <= 1e-9 * scale).all())


def on_points_of(source: TimeSeries, target: TimeSeries, states: Tensor) -> Tensor:
    """``states [T, N_source, C]`` of ``source`` at ``target``'s points: as they are on
    the same points, else by linear moving least squares
    (:func:`meshops.reduced.transfer.mls_weights`, exact for linear fields; where the
    geometries differ, e.g. a hole that moved, the values are extrapolated from the
    nearest points)."""
    if same_points(source, target):
        return states
    from meshops.reduced.transfer import mls_weights, transfer

    idx, w = mls_weights(source.mesh.pos.to(torch.float64),
                         target.mesh.pos.to(torch.float64), degree=1)
    return transfer(states, idx, w)


def _start_distances(train: Sequence[TimeSeries], ok: list[int], s: TimeSeries,
                     targets: Sequence[str], start: int) -> Tensor:
    """Quadrature-weighted squared L2 distances between the test series' state at
    ``start`` and each training series' (moved to the test mesh)."""
    u0 = s.channels(targets)[start]
    w = s.mesh.weight.to(torch.float64)[:, None]
    return torch.stack([
        (w * (on_points_of(train[j], s, train[j].channels(targets)[start:start + 1])[0]
              - u0) ** 2).sum() for j in ok])


def nearest_trajectory(train: Sequence[TimeSeries], test: Sequence[TimeSeries],
                       targets: Sequence[str], start: int, steps: Sequence[int]
                       ) -> tuple[list[Tensor | None], list[str | None], str]:
    """The nearest training series' states for each test series (see the module
    docstring).

    Args:
        train, test: The series.
        targets: The state fields.
        start: The step the rollouts start from.
        steps: The number of steps of each test series' rollout.

    Returns:
        ``(predictions, chosen, note)``: per test series ``[steps, N, C]`` float64 (NaN
        past the chosen series' end; moved to the test series' points by
        :func:`on_points_of` where the meshes differ) or None where no training series
        reaches ``start``, the chosen series' names, and how they were chosen.
    """
    by_params = all(s.params is not None for s in list(train) + list(test)) and bool(train)
    if by_params:
        p = torch.cat([s.params for s in train]).to(torch.float64)
        scale = p.std(0, unbiased=False)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        note = (f"the training series nearest in the parameters "
                f"({', '.join(train[0].param_names)}, standardised)")
    else:
        note = f"the training series with the nearest state at time step {start} (L2)"
    if any(not same_points(r, s) for r in train for s in test):
        note += "; moved to the test mesh by linear moving least squares where meshes differ"
    preds: list[Tensor | None] = []
    chosen: list[str | None] = []
    for s, h in zip(test, steps):
        ok = [j for j, r in enumerate(train) if len(r) > start]
        if not ok:
            preds.append(None)
            chosen.append(None)
            continue
        if by_params:
            d = (((p[ok] - s.params.to(torch.float64)) / scale) ** 2).sum(1)
        else:
            d = _start_distances(train, ok, s, targets, start)
        j = ok[int(torch.argmin(d))]  # ties go to the first
        u = on_points_of(train[j], s, train[j].channels(targets)[start + 1:start + 1 + h])
        if u.shape[0] < h:  # past the end of the chosen series: undefined
            pad = torch.full((h - u.shape[0], *u.shape[1:]), float("nan"), dtype=u.dtype)
            u = torch.cat([u, pad])
        preds.append(u)
        chosen.append(train[j].name)
    return preds, chosen, note


def horizon_statistics(errors: np.ndarray, names: Sequence[str]) -> list[dict]:
    """Per step (column of ``errors [S, H]``): mean, median and worst over the series
    where the error is defined, the worst series' name and the count (see
    :func:`meshops.training.loss.summarize_errors`)."""
    out = []
    for k in range(errors.shape[1]):
        st = summarize_errors(errors[:, k], names)
        out.append({"step": k + 1, "mean": st["mean"], "median": st["median"],
                    "worst": st["max"], "worst_series": st["worst_sample"], "n": st["n"]})
    return out
