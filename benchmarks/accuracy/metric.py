"""The one metric of the accuracy benchmark, computed by the benchmark itself.

Per test sample and target field ``f`` (a data set's ``fields``: ``u+v`` is the
velocity, its two channels together), the relative L2 error of a prediction with the
sample mesh's own P1 lumped-mass quadrature weights ``w_i = sum over the triangles T
around node i of |T| / 3`` (the row sums of the consistent P1 mass matrix):

    e_f = sqrt(sum_i w_i sum_{c in f} (pred_ic - true_ic)^2)
          / sqrt(sum_i w_i sum_{c in f} true_ic^2),

and the sample's error ``e``, the mean of its fields' ``e_f``; then the mean, median and
worst over the test samples, of ``e`` and of each ``e_f``. The fields are averaged, not
pooled: pooled, a field of large magnitude (a pressure 100 times the velocity) would
decide the error alone (issue 27). With one field (or ``fields=None``) ``e`` is the
relative error over all channels together.

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


def field_columns(targets: Sequence[str], fields: Sequence[str] | None,
                  widths: Sequence[int] | None = None) -> dict[str, list[int]]:
    """``{field: its columns}`` of targets concatenated in order (``widths``: the
    columns of each target, default 1 each); ``fields`` joins targets with ``+`` and
    ``None`` is one field of all columns (``"all"``).

    Raises:
        ValueError: fields that do not join the targets in order.
    """
    widths = [1] * len(targets) if widths is None else list(widths)
    if fields is None:
        return {"all": list(range(sum(widths)))}
    flat = [t for f in fields for t in f.split("+")]
    if flat != list(targets):
        raise ValueError(f"fields {list(fields)} do not join the targets {list(targets)} in order")
    start = np.cumsum([0] + widths)
    at = dict(zip(targets, range(len(targets))))
    return {f: [c for t in f.split("+") for c in range(start[at[t]], start[at[t] + 1])]
            for f in fields}


def field_errors(pred, true, weight, columns: dict[str, list[int]]) -> dict[str, float]:
    """:func:`relative_l2` of each field's columns of one sample, and their mean
    (``"mean"``; NaN when a field's is).

    Shapes:
        pred ``[N, C]``, true ``[N, C]``, weight ``[N]`` -> ``{field: e_f, "mean": e}``
    """
    pred = np.asarray(pred, np.float64).reshape(len(weight), -1)
    true = np.asarray(true, np.float64).reshape(len(weight), -1)
    out = {f: relative_l2(pred[:, cols], true[:, cols], weight) for f, cols in columns.items()}
    out["mean"] = float(np.mean(list(out.values())))
    return out
