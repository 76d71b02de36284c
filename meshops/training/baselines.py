"""Baselines that need no training, scored with the trainer's metric.

A surrogate has learned something only if it beats predictors that need no
training. Three are computed here, on the same test samples and with the same
per-sample relative L2 error as :meth:`meshops.training.Trainer.evaluate`
(quadrature-weighted and unweighted, all target channels pooled):

* **Training mean field**: the point-wise mean of the training targets. It is
  defined only when every training and test sample lives on the same points:
  the same number of points at the same positions (within ``1e-5`` of the
  largest extent of the meshes, loose enough for positions stored in float32),
  or structured grids of the same ``grid_shape`` (point ``k`` is grid node ``k``
  on every sample, as for the Geo-FNO NACA C-grids, whose points move with the
  airfoil). Otherwise it is not available and the result says why.
* **Nearest training sample**: the targets of the training sample closest to the
  test sample in input space. Each sample is described by the quadrature-weighted
  mean of each input channel, standardised by the spread of the training samples'
  means (so that a channel's units do not decide the distance); the distance is
  the Euclidean one between these descriptors. Geometry-only problems (no input
  channels) compare the meshes: structured grids of one ``grid_shape`` by the
  root-mean-square distance between their corresponding nodes, anything else
  (point clouds, meshes of different sizes) by the symmetric Chamfer distance,
  the mean distance of each point to the other mesh's nearest point, both ways.
  It predicts on the test mesh, so it needs the nearest sample's targets there:
  available when the meshes correspond (as for the mean field) and otherwise
  transferred by nearest-point interpolation (the value of the training mesh's
  point closest to each test point).

* **POD + RBF**: the classical reduced-order model of a parametric study, what an
  engineer with EZyRB or similar uses today. The training snapshots' proper
  orthogonal decomposition in the quadrature inner product, its rank chosen by
  energy (:func:`meshops.reduced.pod_basis`, all but 1e-10 of the energy), and a
  thin-plate-spline interpolation from the standardised parameters to the modal
  coefficients (:class:`meshops.reduced.rbf.ThinPlateSpline`, scipy's
  ``RBFInterpolator`` formula). Defined when the samples correspond point by point
  (as for the mean field) and each sample has a parameter vector (``params``, or
  input fields constant over the mesh: :func:`meshops.reduced.sample_parameters`).

Ties (e.g. geometry-only samples on one fixed mesh, all at distance 0) go to the
first training sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from meshops.datasets.fields import TargetFields
from meshops.training.loss import sample_errors, summarize_errors

#: The baselines' names, in the order :func:`baselines` returns them.
BASELINE_NAMES = ("training mean", "nearest training sample", "POD + RBF")

#: Relative tolerance (of the largest mesh extent) for "the same positions".
POSITION_RTOL = 1e-5


@dataclass
class BaselineResult:
    """Per-sample errors of one baseline on a test set.

    Attributes:
        name: ``"training mean"`` or ``"nearest training sample"``.
        predictions: One ``[M, C_out]`` float64 tensor per test sample, or ``None``
            when the baseline is not available.
        errors: ``{"l2": [T], "l2_unweighted": [T]}`` per-sample relative L2 errors
            (empty when not available).
        note: How the baseline was computed, or why it is not available (``"n/a: ..."``).
        nearest: For the nearest-sample baseline, the training index chosen for each
            test sample.
    """

    name: str
    predictions: list[Tensor] | None
    errors: dict[str, np.ndarray] = field(default_factory=dict)
    note: str = ""
    nearest: list[int] | None = None

    @property
    def available(self) -> bool:
        return self.predictions is not None

    def summary(self) -> dict:
        """``{metric: {"mean", "median", "worst"}}``, or ``{"note": ...}`` when not available."""
        out: dict = {"note": self.note}
        for metric, v in self.errors.items():
            out[metric] = error_stats(v)
        return out


def error_stats(values: np.ndarray) -> dict:
    """``mean``, ``median`` and ``worst`` of per-sample errors over the samples where
    they are defined (``None`` when none is), and ``undefined``: how many are not (a
    relative error against a target that is zero everywhere is NaN)."""
    st = summarize_errors(values)
    return {"mean": st["mean"], "median": st["median"], "worst": st["max"],
            "undefined": len(st["undefined"])}


def target_points(sample) -> tuple[Tensor, Tensor]:
    """Positions and quadrature weights of the points where ``sample.y`` lives.

    The mesh points, or the query points (``query_pos``, weighted by
    ``query_weight`` or uniformly) as in :func:`meshops.training.targets_of`.

    Shapes:
        -> pos ``[M, d]``, weight ``[M]``
    """
    q = getattr(sample, "query_pos", None)
    if q is None:
        return sample.pos, sample.weight
    w = getattr(sample, "query_weight", None)
    return q, (w if w is not None else torch.ones(q.shape[0], dtype=q.dtype))


def per_sample_errors(predictions: Sequence[Tensor], samples: Sequence,
                      fields: TargetFields | None = None) -> dict[str, np.ndarray]:
    """Relative L2 error of each prediction against its sample's ``y``, in float64,
    quadrature-weighted (``"l2"``) and unweighted (``"l2_unweighted"``), exactly
    as :meth:`~meshops.training.Trainer.evaluate` computes them: the mean over the
    target ``fields`` (``None``: all channels pooled), NaN where the target is zero
    everywhere (the relative error is undefined there, see
    :func:`~meshops.training.loss.lp_errors`); with several fields also each field's
    quadrature-weighted error (``"l2:<field>"``).

    Shapes:
        predictions: ``T`` tensors ``[M_t, C_out]`` -> ``{metric: [T]}``
    """
    out: dict[str, list[float]] = {"l2": [], "l2_unweighted": []}
    per_field = fields is not None and len(fields) > 1
    for pred, s in zip(predictions, samples):
        y, pred = s.y.to(torch.float64), pred.to(torch.float64)
        w = target_points(s)[1].to(torch.float64)
        e = sample_errors(pred, y, w, fields)
        out["l2"].append(e["l2"])
        out["l2_unweighted"].append(e["l2_unweighted"])
        if per_field:
            for name, sl in fields.slices().items():
                out.setdefault(f"l2:{name}", []).append(
                    sample_errors(pred[:, sl], y[:, sl], w)["l2"])
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def _grid_shape(sample) -> tuple[int, ...] | None:
    g = getattr(sample, "grid_shape", None)
    return None if g is None else tuple(int(n) for n in torch.as_tensor(g).reshape(-1))


def correspondence(samples: Sequence) -> tuple[str | None, str]:
    """How the samples' target points correspond, if they do.

    Returns:
        ``("positions", why)`` when all have the same number of points at the same
        positions (within :data:`POSITION_RTOL` of the largest extent), ``("grid",
        why)`` when all are structured grids of one ``grid_shape``, and ``(None,
        why not)`` otherwise.
    """
    pts = [target_points(s)[0].to(torch.float64) for s in samples]
    sizes = {int(p.shape[0]) for p in pts}
    grids = {_grid_shape(s) for s in samples}
    if len(sizes) == 1:
        ref = pts[0]
        extent = max(float((p.amax(0) - p.amin(0)).max()) for p in pts)
        tol = POSITION_RTOL * max(extent, np.finfo(float).tiny)
        gap = max(float((p - ref).abs().max()) for p in pts)
        if gap <= tol:
            return "positions", f"one fixed mesh of {ref.shape[0]} points"
        if len(grids) == 1 and None not in grids:
            shape = " x ".join(map(str, next(iter(grids))))
            return "grid", f"structured {shape} grids, matched node by node"
        return None, (f"meshes differ: points move by up to {gap:.3g} between samples "
                      f"(tolerance {tol:.3g})")
    return None, f"meshes differ: {min(sizes)} to {max(sizes)} points per sample"


def _not_available(name: str, train: Sequence, test: Sequence, why: str) -> BaselineResult:
    """The result of a baseline that cannot run: no samples, or ``why`` not."""
    if len(train) == 0 or len(test) == 0:
        why = "no training or no test samples"
    return BaselineResult(name, None, note=f"n/a: {why}")


def mean_field_baseline(train: Sequence, test: Sequence,
                        fields: TargetFields | None = None) -> BaselineResult:
    """Predict the point-wise mean of the training targets on every test sample.

    Args:
        train: Training samples (``y [M, C_out]`` at :func:`target_points`).
        test: Test samples.

    Returns:
        A :class:`BaselineResult`; not available (``note`` starts with ``"n/a"``)
        unless all samples live on corresponding points (see :func:`correspondence`).

    Shapes:
        train ``y [M, C]``, test ``y [M, C]`` -> errors ``[T]``
    """
    name = "training mean"
    how, why = correspondence(list(train) + list(test)) if train and test else (None, "")
    if how is None:
        return _not_available(name, train, test, why)
    mean = torch.stack([s.y.to(torch.float64) for s in train]).mean(0)
    preds = [mean.clone() for _ in test]
    return BaselineResult(name, preds, per_sample_errors(preds, test, fields),
                          note=f"mean of {len(train)} training samples ({why})")


def _input_descriptors(samples: Sequence) -> np.ndarray:
    """Quadrature-weighted mean of each input channel: ``[S, C_in]``."""
    rows = []
    for s in samples:
        w = s.weight.to(torch.float64)
        x = s.x.to(torch.float64)
        rows.append((w[:, None] * x).sum(0) / w.sum())
    return torch.stack(rows).numpy()


def _chamfer(a: np.ndarray, b: np.ndarray, tree_a, tree_b) -> float:
    return 0.5 * (float(tree_b.query(a)[0].mean()) + float(tree_a.query(b)[0].mean()))


def _geometry_distances(train: Sequence, test: Sequence, how: str | None) -> np.ndarray:
    """``[T, S]`` distances between test and training meshes (see the module docstring)."""
    if how is not None:  # corresponding points: RMS distance between matched points
        p_tr = torch.stack([target_points(s)[0].to(torch.float64).reshape(-1) for s in train])
        p_te = torch.stack([target_points(s)[0].to(torch.float64).reshape(-1) for s in test])
        n = target_points(train[0])[0].shape[0]
        # Flattened meshes: the Euclidean distance / sqrt(n) is the RMS point distance.
        d = torch.cdist(p_te, p_tr, compute_mode="donot_use_mm_for_euclid_dist")
        return (d / n ** 0.5).numpy()
    from scipy.spatial import cKDTree

    p_tr = [s.pos.to(torch.float64).numpy() for s in train]
    p_te = [s.pos.to(torch.float64).numpy() for s in test]
    t_tr = [cKDTree(p) for p in p_tr]
    t_te = [cKDTree(p) for p in p_te]
    return np.array([[_chamfer(a, b, ta, tb) for b, tb in zip(p_tr, t_tr)]
                     for a, ta in zip(p_te, t_te)])


def nearest_sample_baseline(train: Sequence, test: Sequence,
                            fields: TargetFields | None = None) -> BaselineResult:
    """Predict, on each test sample, the targets of the nearest training sample.

    Args:
        train: Training samples with ``x``, ``y``, ``pos``, ``weight``.
        test: Test samples.

    Returns:
        A :class:`BaselineResult` with the chosen training index per test sample
        in ``nearest`` and the distance used in ``note``.

    Shapes:
        train ``x [N, C_in]``, ``y [M, C]``; test likewise -> errors ``[T]``
    """
    name = "nearest training sample"
    if len(train) == 0 or len(test) == 0:
        return BaselineResult(name, None, note="n/a: no training or no test samples")
    how, why = correspondence(list(train) + list(test))
    c_in = int(train[0].x.shape[-1])
    if c_in:
        d_tr, d_te = _input_descriptors(train), _input_descriptors(test)
        scale = d_tr.std(0)
        scale[~(scale > 0)] = 1.0  # a channel constant over the training set cannot rank
        dist = np.linalg.norm((d_te[:, None] - d_tr[None]) / scale, axis=-1)
        metric = (f"distance between the means of the {c_in} input channel(s), "
                  "standardised over the training samples")
    else:
        dist = _geometry_distances(train, test, how)
        metric = ("geometry: RMS distance between matched points" if how is not None
                  else "geometry: symmetric Chamfer distance between the point sets")
    nearest = [int(i) for i in np.argmin(dist, axis=1)]
    preds = []
    for t, i in zip(test, nearest):
        y = train[i].y.to(torch.float64)
        if how is None:  # transfer to the test points: value at the nearest training point
            from scipy.spatial import cKDTree

            src = target_points(train[i])[0].to(torch.float64).numpy()
            dst = target_points(t)[0].to(torch.float64).numpy()
            y = y[torch.from_numpy(cKDTree(src).query(dst)[1])]
        preds.append(y)
    transfer = f"; {why}, values moved to the test points by nearest point" if how is None \
        else ""
    return BaselineResult(name, preds, per_sample_errors(preds, test, fields),
                          note=f"{metric}{transfer}", nearest=nearest)


def pod_rbf_baseline(train: Sequence, test: Sequence,
                     fields: TargetFields | None = None) -> BaselineResult:
    """Predict with POD + RBF fitted on ``train`` (see the module docstring).

    Args:
        train: Training samples with ``y`` and a parameter vector (``params [1, K]``
            or constant input fields).
        test: Test samples on the same points.

    Returns:
        A :class:`BaselineResult` whose ``note`` gives the rank, the captured energy
        and the parameters used; not available (``"n/a: ..."``) when the samples do
        not correspond point by point, have no parameter vector, or their parameters
        do not determine an interpolant (one training sample, repeated parameter
        vectors).

    Shapes:
        train ``y [M, C]``, ``params [1, K]``; test likewise -> errors ``[T]``
    """
    from meshops.reduced import pod_basis, sample_parameters
    from meshops.reduced.parameters import informative_columns
    from meshops.reduced.rbf import ThinPlateSpline

    name = "POD + RBF"
    how, why = correspondence(list(train) + list(test)) if train and test else (None, "")
    if how is None:
        return _not_available(name, train, test, why)
    if len(train) < 2:  # one snapshot has no modes to decompose into
        return BaselineResult(name, None, note=f"n/a: a POD needs at least 2 training "
                                               f"samples, got {len(train)}")
    p_tr, source = sample_parameters(train)
    p_te, _ = sample_parameters(test)
    if p_tr is None or p_te is None or p_te.shape[1] != p_tr.shape[1]:
        return BaselineResult(name, None, note=f"n/a: no parameter vector per sample "
                                               f"({source if p_tr is None else 'test samples'})")
    # a parameter constant over the training set cannot inform, nor one given twice
    keep = informative_columns(p_tr)
    mu, sd = p_tr.mean(0)[keep], p_tr.std(0)[keep]
    x_tr, x_te = (p_tr[:, keep] - mu) / sd, (p_te[:, keep] - mu) / sd
    y = torch.stack([s.y.to(torch.float64) for s in train])
    # One inner product for all: corresponding grids' weights move with their nodes.
    weight = torch.stack([target_points(s)[1].to(torch.float64) for s in train]).mean(0)
    basis = pod_basis(y, weight)
    coef = basis.coefficients(y, weight)
    try:
        spline = ThinPlateSpline(len(train), x_tr.shape[1], basis.rank).fit(x_tr, coef)
    except ValueError as e:
        return BaselineResult(name, None, note=f"n/a: {e}")
    preds = list(basis.expand(spline(x_te)))
    return BaselineResult(name, preds, per_sample_errors(preds, test, fields),
                          note=f"{basis.describe()}; thin-plate RBF on "
                               f"{len(keep)} standardised parameter(s) ({source})")


def baselines(train: Sequence, test: Sequence,
              fields: TargetFields | None = None) -> list[BaselineResult]:
    """The three baselines: ``[mean_field_baseline, nearest_sample_baseline,
    pod_rbf_baseline]``, scored over the target ``fields`` (``None``: pooled)."""
    return [mean_field_baseline(train, test, fields), nearest_sample_baseline(train, test, fields),
            pod_rbf_baseline(train, test, fields)]


def format_table(rows: Sequence[tuple[str, dict | None, str]], metric: str) -> str:
    """A small text table: one line per ``(name, {"mean","median","worst"} or None, note)``."""
    lines = [f"  {'':<26} {'mean':>9} {'median':>9} {'worst':>9}   ({metric})"]
    for name, st, note in rows:
        if st is None:
            lines.append(f"  {name:<26} {note}")
        else:
            cols = " ".join(f"{st[k]:>9.4g}" if st[k] is not None else f"{'undefined':>9}"
                            for k in ("mean", "median", "worst"))
            if st.get("undefined"):
                note = (f"{note}; " if note else "") + \
                    f"{st['undefined']} samples with a zero target left out"
            lines.append(f"  {name:<26} {cols}" + (f"   {note}" if note else ""))
    return "\n".join(lines)
