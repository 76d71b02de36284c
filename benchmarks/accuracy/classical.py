"""The predictors that need no neural network, on the benchmark's arrays.

* **training mean**: the node-wise mean of the training targets (one shared mesh
  only).
* **nearest training sample**: the targets of the training sample whose parameters
  (the input fields' node means, standardised by their spread over the training
  set) are closest; on another mesh its field is carried over by P1 interpolation
  on the training mesh's triangles (nearest node outside them).
* **POD + RBF**: the classical reduced-order model of a parametric study; see
  :func:`pod_rbf`.

Each returns one ``[N, C]`` prediction per test sample, or a reason why it does not
apply.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from benchmarks.accuracy.folder import Sample, same_mesh


class NotApplicable(Exception):
    """The predictor does not apply to this data set (the message says why)."""


def _standardised_params(train: Sequence[Sample], test: Sequence[Sample]):
    p_tr = np.stack([s.params for s in train])
    p_te = np.stack([s.params for s in test])
    mu, sd = p_tr.mean(0), p_tr.std(0)
    sd[~(sd > 0)] = 1.0  # a parameter constant over the training set cannot rank
    return (p_tr - mu) / sd, (p_te - mu) / sd


def training_mean(train: Sequence[Sample], test: Sequence[Sample]) -> list[np.ndarray]:
    """Node-wise mean of the training targets, for every test sample."""
    if not same_mesh(list(train) + list(test)):
        raise NotApplicable("one mesh per sample")
    mean = np.mean([s.targets for s in train], axis=0)
    return [mean.copy() for _ in test]


def _transfer(src: Sample, dst: Sample) -> np.ndarray:
    """``src.targets`` at ``dst``'s nodes: P1 interpolation, nearest node outside."""
    if src.points.shape == dst.points.shape and np.array_equal(src.points, dst.points):
        return src.targets.copy()
    import matplotlib.tri as mtri
    from scipy.spatial import cKDTree

    tri = mtri.Triangulation(src.points[:, 0], src.points[:, 1], src.triangles)
    out = np.empty((len(dst.points), src.targets.shape[1]))
    nearest = cKDTree(src.points).query(dst.points)[1]
    for c in range(src.targets.shape[1]):
        v = mtri.LinearTriInterpolator(tri, src.targets[:, c])(dst.points[:, 0], dst.points[:, 1])
        out[:, c] = np.where(np.ma.getmaskarray(v), src.targets[nearest, c], np.ma.getdata(v))
    return out


def nearest_sample(train: Sequence[Sample], test: Sequence[Sample]) -> list[np.ndarray]:
    """The nearest training sample in standardised parameter space, per test sample."""
    if train[0].inputs.shape[1] == 0:
        raise NotApplicable("no input parameters")
    p_tr, p_te = _standardised_params(train, test)
    idx = np.argmin(((p_te[:, None] - p_tr[None]) ** 2).sum(-1), axis=1)
    return [_transfer(train[i], t) for i, t in zip(idx, test)]


def pod_rbf(train: Sequence[Sample], test: Sequence[Sample], modes: int = 10) -> list[np.ndarray]:
    """POD + RBF: the SVD of the centred training snapshots (all target channels
    stacked) truncated to ``modes`` modes, and scipy's ``RBFInterpolator`` (thin-plate
    spline) from the standardised parameters to the mode coefficients.

    Shapes:
        train/test targets ``[N, C]`` on one mesh -> ``T`` predictions ``[N, C]``
    """
    from scipy.interpolate import RBFInterpolator

    if not same_mesh(list(train) + list(test)):
        raise NotApplicable("one mesh per sample")
    if train[0].inputs.shape[1] == 0:
        raise NotApplicable("no input parameters")
    shape = train[0].targets.shape
    Y = np.stack([s.targets.reshape(-1) for s in train])
    mean = Y.mean(0)
    _, _, vt = np.linalg.svd(Y - mean, full_matrices=False)
    r = min(modes, len(vt))
    coef = (Y - mean) @ vt[:r].T
    p_tr, p_te = _standardised_params(train, test)
    keep = np.ptp(p_tr, axis=0) > 0  # a constant parameter makes the RBF system singular
    rbf = RBFInterpolator(p_tr[:, keep], coef, kernel="thin_plate_spline")
    pred = mean + rbf(p_te[:, keep]) @ vt[:r]
    return [row.reshape(shape) for row in pred]
