"""The predictors that need no neural network, on the benchmark's arrays.

* **training mean**: the node-wise mean of the training targets; on meshes that
  differ, the mean of the training fields carried over to the test mesh by P1
  interpolation on each training mesh's triangles (nearest node outside them).
* **nearest training sample**: the targets of the training sample whose parameters
  (those of ``params.json``, e.g. a family's shape parameters, else the input
  fields' node means; standardised by their spread over the training set) are
  closest; on another mesh its field is carried over by P1 interpolation.
* **POD + RBF**: the classical reduced-order model of a parametric study, as
  meshops itself reports it; see :func:`pod_rbf`.

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
    """Node-wise mean of the training targets, for every test sample; on meshes that
    differ, the mean of the training fields interpolated to each test mesh
    (:func:`transfer`)."""
    if same_mesh(list(train) + list(test)):
        mean = np.mean([s.targets for s in train], axis=0)
        return [mean.copy() for _ in test]
    # every training field once onto all test nodes together
    points = np.concatenate([t.points for t in test])
    total = sum(_values_at(s, points) for s in train) / len(train)
    ends = np.cumsum([0] + [len(t.points) for t in test])
    return [total[a:b] for a, b in zip(ends[:-1], ends[1:])]


def _values_at(src: Sample, points: np.ndarray) -> np.ndarray:
    """``src.targets`` at ``points [P, 2]``: P1 interpolation on ``src``'s triangles, the
    nearest node's value outside them."""
    import matplotlib.tri as mtri
    from scipy.spatial import cKDTree

    nearest = cKDTree(src.points).query(points)[1]
    tri = mtri.Triangulation(src.points[:, 0], src.points[:, 1], src.triangles)
    try:
        finder = tri.get_trifinder()
    except RuntimeError:  # matplotlib refuses e.g. a C-grid's duplicated wake-cut nodes
        return _values_by_search(src, points, nearest)
    out = np.empty((len(points), src.targets.shape[1]))
    for c in range(src.targets.shape[1]):
        v = mtri.LinearTriInterpolator(tri, src.targets[:, c], trifinder=finder)(
            points[:, 0], points[:, 1])
        out[:, c] = np.where(np.ma.getmaskarray(v), src.targets[nearest, c], np.ma.getdata(v))
    return out


def _values_by_search(src: Sample, points: np.ndarray, nearest: np.ndarray,
                      k: int = 64, chunk: int = 4096) -> np.ndarray:
    """P1 interpolation as :func:`_values_at`, the triangle of each point found among the
    ``k`` triangles with the nearest centroids (barycentric coordinates all >= -1e-9),
    the nearest node's value where none holds it. For triangulations matplotlib's
    finder refuses (duplicated nodes, overlapping cells)."""
    from scipy.spatial import cKDTree

    p, t, y = src.points[:, :2], src.triangles, src.targets
    k = min(k, len(t))
    out = y[nearest].astype(np.float64)
    tree = cKDTree(p[t].mean(1))
    for s in range(0, len(points), chunk):
        q = points[s:s + chunk, :2]
        cand = tree.query(q, k)[1].reshape(len(q), k)                  # [n, k]
        a, b, c = (p[t[cand, i]] for i in range(3))                     # [n, k, 2]
        v0, v1, v2 = b - a, c - a, q[:, None] - a
        d00, d01, d11 = (v0 * v0).sum(-1), (v0 * v1).sum(-1), (v1 * v1).sum(-1)
        d20, d21 = (v2 * v0).sum(-1), (v2 * v1).sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            den = d00 * d11 - d01 * d01
            l1 = (d11 * d20 - d01 * d21) / den
            l2 = (d00 * d21 - d01 * d20) / den
        lam = np.stack([1 - l1 - l2, l1, l2], -1)                      # [n, k, 3]
        inside = np.isfinite(lam).all(-1) & (lam >= -1e-9).all(-1)
        found = inside.any(1)
        j = inside.argmax(1)
        rows = np.arange(len(q))
        verts = t[cand[rows, j]]                                        # [n, 3]
        vals = (lam[rows, j][..., None] * y[verts]).sum(1)              # [n, C]
        out[s:s + chunk][found] = vals[found]
    return out


def transfer(src: Sample, dst: Sample) -> np.ndarray:
    """``src.targets`` at ``dst``'s nodes (:func:`_values_at`; a copy on the same mesh)."""
    if src.points.shape == dst.points.shape and np.array_equal(src.points, dst.points):
        return src.targets.copy()
    return _values_at(src, dst.points)


def nearest_sample(train: Sequence[Sample], test: Sequence[Sample]) -> list[np.ndarray]:
    """The nearest training sample in standardised parameter space (the shape
    parameters of ``params.json`` for a family of geometries), per test sample,
    interpolated to its mesh."""
    if train[0].given_params is None and train[0].inputs.shape[1] == 0:
        raise NotApplicable("no input parameters")
    p_tr, p_te = _standardised_params(train, test)
    idx = np.argmin(((p_te[:, None] - p_tr[None]) ** 2).sum(-1), axis=1)
    return [transfer(train[i], t) for i, t in zip(idx, test)]


def pod_rbf(train: Sequence[Sample], test: Sequence[Sample]) -> list[np.ndarray]:
    """POD + RBF as meshops reports it (:func:`meshops.training.baselines.pod_rbf_baseline`:
    POD in the quadrature inner product with the rank chosen by energy, thin-plate RBF
    from the standardised parameters to the modal coefficients), on the benchmark's
    arrays; :data:`LAST_NOTE` keeps its note (rank, energy, parameters).

    Shapes:
        train/test targets ``[N, C]`` on one mesh -> ``T`` predictions ``[N, C]``
    """
    import torch

    from meshops.mesh.data import MeshData
    from meshops.training.baselines import pod_rbf_baseline

    def mesh_data(s: Sample) -> MeshData:
        t = lambda a: torch.as_tensor(a, dtype=torch.float64)  # noqa: E731
        return MeshData(pos=t(s.points), weight=t(s.weight), x=t(s.inputs), y=t(s.targets),
                        params=t(s.params)[None])

    res = pod_rbf_baseline([mesh_data(s) for s in train], [mesh_data(s) for s in test])
    LAST_NOTE[0] = res.note
    if not res.available:
        raise NotApplicable(res.note.removeprefix("n/a: "))
    return [p.numpy() for p in res.predictions]


#: The note of the last :func:`pod_rbf` call.
LAST_NOTE = [""]
