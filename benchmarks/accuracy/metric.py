"""The one metric of the accuracy benchmark, computed by the benchmark itself.

Per test sample and target field ``f`` (a data set's ``fields``: ``u+v`` is the
velocity, its two channels together), the relative L2 error of a prediction with the
sample mesh's own P1 lumped-mass quadrature weights ``w_i = sum over the triangles T
around node i of |T| / 3`` (tetrahedra: ``|T| / 4``; the row sums of the consistent P1
mass matrix):

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


def lumped_mass_weights(points, cells) -> np.ndarray:
    """P1 lumped-mass quadrature weights of a simplex mesh: each triangle's area / 3,
    each tetrahedron's volume / 4, to its vertices (the row sums of the consistent P1
    mass matrix). Triangles in 3-D (a surface) get their true area.

    Shapes:
        points ``[N, d]`` (d = 2 or 3), cells ``[M, 3]`` (triangles) or ``[M, 4]``
        (tetrahedra, d = 3) -> ``[N]``

    Raises:
        ValueError: cells that are neither, or tetrahedra in 2-D.
    """
    p = np.asarray(points, np.float64)
    t = np.asarray(cells, np.int64)
    if t.ndim != 2 or t.shape[1] not in (3, 4) or (t.shape[1] == 4 and p.shape[1] != 3):
        raise ValueError(f"lumped_mass_weights: cells must be triangles [M, 3] or tetrahedra "
                         f"[M, 4] in 3-D, got cells {t.shape} and points {p.shape}")
    p = np.pad(p, ((0, 0), (0, 3 - p.shape[1])))
    edges = p[t[:, 1:]] - p[t[:, :1]]                       # [M, k - 1, 3]
    if t.shape[1] == 3:
        measure = 0.5 * np.linalg.norm(np.cross(edges[:, 0], edges[:, 1]), axis=1)
    else:
        measure = np.abs(np.linalg.det(edges)) / 6.0
    w = np.zeros(len(p))
    np.add.at(w, t.ravel(), np.repeat(measure / t.shape[1], t.shape[1]))
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
