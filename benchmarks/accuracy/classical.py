"""The predictors that need no neural network, on the benchmark's arrays.

* **training mean**: the node-wise mean of the training targets; on meshes that
  differ, the mean of the training fields carried over to the test mesh by P1
  interpolation on each training mesh's triangles or tetrahedra (nearest node outside
  them: in a cavity of the training shape or beyond its domain; on a surface in space, at
  the point of the training surface closest to the node).
* **nearest training sample**: the targets of the training sample whose parameters
  (those of ``params.json``, e.g. a family's shape parameters, else the input
  fields' node means; or the global inputs alone, where the training samples' own
  lookups say so; standardised by their spread over the training set) are
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
    """``src.targets`` at ``points [P, d]``: P1 interpolation on ``src``'s cells, the
    nearest node's value outside them (a point in a cavity or beyond the source's
    domain). Triangles in the plane go through matplotlib's finder, tetrahedra (and
    triangulations matplotlib refuses) through :func:`_values_by_search`; triangles in
    space (a surface) through :func:`_values_on_surface`."""
    import matplotlib.tri as mtri
    from scipy.spatial import cKDTree

    if src.cells.shape[1] != src.points.shape[1] + 1:
        return _values_on_surface(src, points)
    nearest = cKDTree(src.points).query(points)[1]
    if src.points.shape[1] == 3:
        return _values_by_search(src, points, nearest)
    tri = mtri.Triangulation(src.points[:, 0], src.points[:, 1], src.cells)
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


def _barycentric_maps(points: np.ndarray, cells: np.ndarray):
    """``(first vertex [M, d], inverse edge matrices [M, d, d])`` of simplices: the
    barycentric coordinates of ``q`` but the first are ``inv @ (q - first)``; NaN for a
    degenerate cell, which then holds no point."""
    first = points[cells[:, 0]]
    edges = np.swapaxes(points[cells[:, 1:]] - first[:, None], 1, 2)     # columns: edges
    det = np.linalg.det(edges)
    ok = np.isfinite(det) & (np.abs(det) > 0)
    inv = np.linalg.inv(np.where(ok[:, None, None], edges, np.eye(points.shape[1])))
    inv[~ok] = np.nan
    return first, inv


def p1_search(points: np.ndarray, cells: np.ndarray, values: np.ndarray, at: np.ndarray,
              ks=(2, 8, 64), chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """P1 interpolation of nodal ``values`` on simplices (triangles in the plane,
    tetrahedra in space) at the points ``at``: the cell of each point is searched among
    the ``k`` cells with the nearest centroids, ``k`` = 2, then 8, then 64 for the points
    not yet placed (half the time of 8 and 64 alone on the 3-D family), and holds it when
    its barycentric coordinates are all >= -1e-9.

    Shapes:
        points ``[N, d]``, cells ``[M, d + 1]``, values ``[N, C]``, at ``[P, d]`` ->
        the values ``[P, C]`` (zero where no cell holds the point) and ``found [P]``.
    """
    from scipy.spatial import cKDTree

    first, inv = _barycentric_maps(points, cells)
    out = np.zeros((len(at), values.shape[1]))
    found_all = np.zeros(len(at), bool)
    todo = np.arange(len(at))
    tree = cKDTree(points[cells].mean(1))
    for k in ks:
        k = min(k, len(cells))
        for s in range(0, len(todo), chunk):
            rows = todo[s:s + chunk]
            cand = tree.query(at[rows], k)[1].reshape(len(rows), k)              # [n, k]
            lam = np.einsum("nkij,nkj->nki", inv[cand], at[rows, None] - first[cand])
            lam = np.concatenate([1 - lam.sum(-1, keepdims=True), lam], -1)    # [n, k, d+1]
            inside = np.isfinite(lam).all(-1) & (lam >= -1e-9).all(-1)
            found = inside.any(1)
            j = inside.argmax(1)[found]
            hit = np.flatnonzero(found)
            out[rows[found]] = (lam[hit, j][..., None] * values[cells[cand[hit, j]]]).sum(1)
            found_all[rows[found]] = True
        todo = np.flatnonzero(~found_all)
        if not len(todo):
            break
    return out, found_all


def _values_by_search(src: Sample, points: np.ndarray, nearest: np.ndarray) -> np.ndarray:
    """:func:`p1_search` of ``src.targets`` at ``points [P, d]``, the nearest node's value
    (``nearest [P]``) where no cell holds the point. For tetrahedra and for
    triangulations matplotlib's finder refuses (duplicated nodes, overlapping cells)."""
    out, found = p1_search(src.points, src.cells, src.targets.astype(np.float64), points)
    out[~found] = src.targets[nearest[~found]]
    return out


def _closest_on_triangles(q: np.ndarray, corners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distances and barycentric coordinates of the points of triangles closest to
    ``q``: the projection onto the plane where it falls inside, else the nearest point of
    the nearest edge (a degenerate triangle's projection is its first corner).

    Shapes:
        q ``[n, k, 3]``, corners ``[n, k, 3, 3]`` -> ``([n, k], [n, k, 3])``
    """
    e1, e2, r = (corners[..., 1, :] - corners[..., 0, :], corners[..., 2, :] - corners[..., 0, :],
                 q - corners[..., 0, :])
    g11, g12, g22 = (e1 * e1).sum(-1), (e1 * e2).sum(-1), (e2 * e2).sum(-1)
    r1, r2 = (r * e1).sum(-1), (r * e2).sum(-1)
    det = g11 * g22 - g12 * g12
    det = np.where(det > 0, det, np.inf)
    s, t = (g22 * r1 - g12 * r2) / det, (g11 * r2 - g12 * r1) / det
    lam = np.stack([1 - s - t, s, t], -1)

    def distance(weights):
        gap = q - (weights[..., :1] * corners[..., 0, :] + weights[..., 1:2] * corners[..., 1, :]
                   + weights[..., 2:] * corners[..., 2, :])
        return np.sqrt((gap * gap).sum(-1))

    dist = np.where((lam >= 0).all(-1), distance(lam), np.inf)
    for i, j in ((0, 1), (1, 2), (2, 0)):
        d = corners[..., j, :] - corners[..., i, :]
        u = np.clip(((q - corners[..., i, :]) * d).sum(-1) / np.maximum((d * d).sum(-1), 1e-300),
                    0, 1)
        edge = np.zeros_like(lam)
        edge[..., i], edge[..., j] = 1 - u, u
        de = distance(edge)
        nearer = de < dist
        dist, lam = np.where(nearer, de, dist), np.where(nearer[..., None], edge, lam)
    return dist, lam


def _values_on_surface(src: Sample, points: np.ndarray, k: int = 8,
                       chunk: int = 4096) -> np.ndarray:
    """``src.targets`` at ``points`` near a surface in space (triangles in 3-D): P1
    interpolation at the closest point of the closest of the ``k`` triangles with the
    nearest centroids.

    Shapes:
        points ``[P, 3]`` -> ``[P, C]``
    """
    from scipy.spatial import cKDTree

    p, t, y = src.points, src.cells, src.targets
    k = min(k, len(t))
    tree = cKDTree(p[t].mean(1))
    out = np.empty((len(points), y.shape[1]))
    for s in range(0, len(points), chunk):
        q = points[s:s + chunk]
        cand = tree.query(q, k)[1].reshape(len(q), k)                       # [n, k]
        dist, lam = _closest_on_triangles(np.repeat(q[:, None], k, 1), p[t[cand]])
        j = np.argmin(dist, 1)
        rows = np.arange(len(q))
        out[s:s + chunk] = (lam[rows, j][..., None] * y[t[cand[rows, j]]]).sum(1)
    return out


def transfer(src: Sample, dst: Sample) -> np.ndarray:
    """``src.targets`` at ``dst``'s nodes (:func:`_values_at`; a copy on the same mesh)."""
    if src.points.shape == dst.points.shape and np.array_equal(src.points, dst.points):
        return src.targets.copy()
    return _values_at(src, dst.points)


def nearest_sample(train: Sequence[Sample], test: Sequence[Sample]) -> list[np.ndarray]:
    """The nearest training sample in a standardised parameter space, per test sample,
    interpolated to its mesh; :data:`LAST_NOTE` says which space.

    The spaces (:func:`_lookups`): the parameters (those of ``params.json`` for a family
    of geometries, else the inputs' node means) and, where some inputs are constant over
    every mesh and the parameters are more than those, those global inputs alone (a
    load, a stream's direction: the lookup of a study that varies them). With two, the
    one whose lookup errs least on the training samples themselves (each predicted by
    its nearest other training sample) is used: chosen on training data alone."""
    if train[0].given_params is None and train[0].inputs.shape[1] == 0:
        raise NotApplicable("no input parameters")
    spaces = _lookups(train)
    # the same training set (its test and re-meshed splits) chooses once; held, so that
    # no later set can take its id, and two families' files of the same names differ
    if _CHOSEN.get("train") is not train:
        scores = {name: _leave_one_out(train, f) for name, f in spaces.items()}
        best = min(scores, key=scores.get)
        _CHOSEN.update(train=train, space=best, note=f"by {best}" + (
            " (leave-one-out error on the training samples: " + ", ".join(
                f"{n} {v:.3g}" for n, v in scores.items()) + ")" if len(scores) > 1 else ""))
    LAST_NOTE[0] = _CHOSEN["note"]
    p_tr, p_te = _standardised(spaces[_CHOSEN["space"]], train, test)
    idx = np.argmin(((p_te[:, None] - p_tr[None]) ** 2).sum(-1), axis=1)
    return [transfer(train[i], t) for i, t in zip(idx, test)]


#: The lookup space :func:`nearest_sample` chose for the training set it holds (computed
#: once for its test and re-meshed splits).
_CHOSEN: dict = {}


def _lookups(train: Sequence[Sample]) -> dict:
    """``{name: sample -> [K] vector}``: the parameters, and the global inputs (inputs
    constant over every training mesh) when they are fewer than the parameters."""
    out = {"the parameters": lambda s: s.params}
    const = [c for c in range(train[0].inputs.shape[1])
             if all(np.ptp(s.inputs[:, c]) == 0 for s in train)]
    if const and len(const) < len(train[0].params):
        out["the global inputs"] = lambda s: s.inputs[0, const]
    return out


def _standardised(vector, train: Sequence[Sample], test: Sequence[Sample]):
    p_tr = np.stack([vector(s) for s in train])
    p_te = np.stack([vector(s) for s in test])
    mu, sd = p_tr.mean(0), p_tr.std(0)
    sd[~(sd > 0)] = 1.0  # a parameter constant over the training set cannot rank
    return (p_tr - mu) / sd, (p_te - mu) / sd


def _leave_one_out(train: Sequence[Sample], vector) -> float:
    """Mean over the training samples and their target channels of the relative L2 error
    of the nearest other training sample's field (``vector`` the lookup space)."""
    from benchmarks.accuracy.metric import relative_l2

    p, _ = _standardised(vector, train, train[:1])
    d = ((p[:, None] - p[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    errs = []
    for i, j in enumerate(np.argmin(d, axis=1)):
        pred, s = transfer(train[j], train[i]), train[i]
        errs += [relative_l2(pred[:, c:c + 1], s.targets[:, c:c + 1], s.weight)
                 for c in range(s.targets.shape[1])]
    return float(np.nanmean(errs))


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


#: The note of the last :func:`pod_rbf` or :func:`nearest_sample` call.
LAST_NOTE = [""]
