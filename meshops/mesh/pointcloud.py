"""Quadrature weights for bare point clouds (no cells): documented estimates.

Two estimators, both normalised so the weights sum to the domain measure ``|D|``
(given, or the convex-hull measure when not given; pass it for non-convex
domains such as a plate with a hole):

* ``"uniform"``: ``w_i = |D| / N``. The Monte Carlo rule; consistent when the points
  are i.i.d. uniform on ``D`` (Theorem 6 of the continuum-attention paper).
* ``"knn"``: ``w_i`` proportional to ``r_k(i)^d``, the volume of the ball reaching the
  k-th nearest neighbour: a local inverse-density estimate, so clustered points
  (boundary layers, refined regions) get proportionally smaller weights. For
  points sampled with density ``rho`` it converges to ``|D| rho(x)^{-1} / sum``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.spatial import ConvexHull, QhullError, cKDTree

from meshops.errors import MeshError
from meshops.mesh.quadrature import check_points


def hull_measure(points: np.ndarray, source: str = "point cloud") -> float:
    """Length, area or volume of the convex hull of ``points [N, d]``.

    Raises:
        MeshError: fewer than ``d + 1`` points, or points that lie on a line or plane
            (their hull has no ``d``-dimensional measure).
    """
    d = points.shape[1]
    if d == 1:
        return float(points.max() - points.min())
    flat = (f"{source}: a {d}-D point cloud of {len(points)} points that lie on a "
            f"{'line' if d == 2 else 'line or plane'}: their convex hull has no "
            f"{'area' if d == 2 else 'volume'}, so the points carry no quadrature weights; "
            f"store the weights with the points (point field 'meshops:weight'), give the "
            f"cells, or drop the constant coordinate")
    if len(points) <= d or np.linalg.matrix_rank(points - points.mean(0)) < d:
        raise MeshError(flat)
    try:
        return float(ConvexHull(points).volume)
    except QhullError:  # nearly flat: Qhull's own tolerance
        raise MeshError(flat) from None


def point_cloud_weights(pos, method: str = "knn", measure: float | None = None,
                        k: int = 8, batch=None, source: str = "point cloud") -> torch.Tensor:
    """Estimated quadrature weights of a point cloud.

    Args:
        pos: Points ``[N, d]``.
        method: ``"uniform"`` (``|D|/N``) or ``"knn"`` (local volume estimate).
        measure: Domain measure ``|D|`` per sample; defaults to the convex hull's.
        k: Neighbour rank for ``"knn"``.
        batch: PyG batch vector ``[N]``; each sample is normalised separately.
        source: Name used in error messages.

    Returns:
        ``weight [N]`` float64, summing to ``measure`` per sample.

    Shapes:
        pos ``[N, d]``, batch ``[N]`` -> ``[N]``
    """
    p = pos.detach().cpu().numpy() if isinstance(pos, torch.Tensor) else np.asarray(pos)
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2:
        raise MeshError(f"{source}: pos must be [N, d], got shape {tuple(p.shape)}")
    check_points(p, source)
    if method not in ("uniform", "knn"):
        raise MeshError(f"{source}: unknown weight estimate {method!r} (use 'uniform' or 'knn')")
    b = np.zeros(len(p), np.int64) if batch is None else np.asarray(
        batch.cpu() if isinstance(batch, torch.Tensor) else batch)
    out = np.zeros(len(p))
    for s in np.unique(b):
        idx = np.flatnonzero(b == s)
        q = p[idx]
        m = hull_measure(q, source) if measure is None else float(measure)
        if not m > 0:
            raise MeshError(f"{source}: sample {s} has zero measure (all points on a lower-"
                            "dimensional set?); pass measure=")
        if method == "uniform":
            w = np.full(len(q), 1.0)
        else:
            if len(q) <= k:
                raise MeshError(f"{source}: sample {s} has {len(q)} points, need more than "
                                f"k={k} for the knn weight estimate")
            dist, _ = cKDTree(q).query(q, k=k + 1)
            w = dist[:, -1] ** q.shape[1]
            if not (w > 0).all():
                i = idx[int(np.flatnonzero(~(w > 0))[0])]
                raise MeshError(f"{source}: point {i} has more than {k} exact duplicates")
        out[idx] = w * (m / w.sum())
    return torch.from_numpy(out)
