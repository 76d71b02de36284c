"""The one metric of the accuracy benchmark, computed by the benchmark itself.

Per test sample, the relative L2 error of a prediction over all target channels
together, with the sample mesh's own P1 lumped-mass quadrature weights
``w_i = sum over the triangles T around node i of |T| / 3`` (the row sums of the
consistent P1 mass matrix):

    e = sqrt(sum_i w_i sum_c (pred_ic - true_ic)^2) / sqrt(sum_i w_i sum_c true_ic^2),

then the mean, median and worst ``e`` over the test samples. The channels are
concatenated, not averaged: a channel of large magnitude (the pressure of the
Navier-Stokes set) weighs more, as in the issue's reference figures.

Only numpy here: the peers' runner (another virtual environment) imports it too.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def lumped_mass_weights(points, triangles) -> np.ndarray:
    """P1 lumped-mass quadrature weights of a triangle mesh.

    Shapes:
        points ``[N, 2]`` (or ``[N, 3]`` with z = 0), triangles ``[M, 3]`` -> ``[N]``
    """
    p = np.asarray(points, np.float64)[:, :2]
    t = np.asarray(triangles, np.int64)
    a, b, c = p[t[:, 0]], p[t[:, 1]], p[t[:, 2]]
    area = 0.5 * np.abs((b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1])
                        - (c[:, 0] - a[:, 0]) * (b[:, 1] - a[:, 1]))
    w = np.zeros(len(p))
    np.add.at(w, t.ravel(), np.repeat(area / 3.0, 3))
    return w


def relative_l2(pred, true, weight) -> float:
    """Weighted relative L2 error of one sample over all channels (NaN when the true
    field is zero everywhere).

    Shapes:
        pred ``[N, C]`` (or ``[N]``), true likewise, weight ``[N]`` -> scalar
    """
    pred = np.asarray(pred, np.float64).reshape(len(weight), -1)
    true = np.asarray(true, np.float64).reshape(len(weight), -1)
    if pred.shape != true.shape:
        raise ValueError(f"prediction {pred.shape} and truth {true.shape} differ in shape")
    w = np.asarray(weight, np.float64)[:, None]
    den = float((w * true ** 2).sum())
    num = float((w * (pred - true) ** 2).sum())
    return math.sqrt(num / den) if den > 0 else math.nan


def summarize(errors: Sequence[float]) -> dict:
    """``{"mean", "median", "worst", "n"}`` of per-sample errors (NaNs left out and
    counted in ``"undefined"``)."""
    e = np.asarray(errors, np.float64)
    ok = e[np.isfinite(e)]
    if not len(ok):
        return {"mean": None, "median": None, "worst": None, "n": 0, "undefined": len(e)}
    return {"mean": float(ok.mean()), "median": float(np.median(ok)), "worst": float(ok.max()),
            "n": int(len(ok)), "undefined": int(len(e) - len(ok))}
