"""What the trust report compares: the parameters and the geometry of one sample.

:func:`describe` gives a sample's parameters (``params``, or the weighted means of its
input fields) and its geometry (measure, centroid, extent, RMS radius about the
centroid); :func:`geometry_tolerance` how far the discretisation alone may move the
geometry. :mod:`meshops.inference.trust` measures a new mesh against the training set
with them; :mod:`meshops.datasets.cache` records them of every cached sample.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["describe", "geometry_tolerance"]

#: Points whose spacing :func:`geometry_tolerance` measures at a time.
_PART = 65536


def _params(sample) -> np.ndarray:
    p = getattr(sample, "params", None)
    if p is not None:
        return torch.as_tensor(p, dtype=torch.float64).reshape(-1).numpy()
    x = getattr(sample, "x", None)
    if x is None or x.numel() == 0:
        return np.zeros(0)
    w = sample.weight.to(torch.float64)
    x = x.to(torch.float64).reshape(x.shape[0], -1)
    return ((w[:, None] * x).sum(0) / w.sum()).numpy()


def _geometry(sample) -> np.ndarray:
    pos, w = sample.pos.to(torch.float64), sample.weight.to(torch.float64)
    measure = w.sum()
    centroid = (w[:, None] * pos).sum(0) / measure
    extent = pos.amax(0) - pos.amin(0)
    rms = ((w[:, None] * (pos - centroid) ** 2).sum(0) / measure).sqrt()
    return torch.cat([measure[None], centroid, extent, rms]).numpy()


def geometry_tolerance(sample) -> np.ndarray:
    """``[1 + 3d]``: how far the discretisation may move each geometry component of
    :func:`describe` from the exact value of the sample's domain (see below).

    The measure and the centroid integrate constants and linear functions, which the
    nodal (vertex) quadrature of linear and multilinear cells and the midpoint rule
    integrate exactly; the extent is the points' own. They get 0. The RMS radius
    integrates a quadratic, ``M_a = sum_i w_i (x_ia - c_a)^2``, which these rules do
    not: on a cell ``K`` the vertex rule of a simplex overestimates it by
    ``|K| sum_edges dx_a^2 / ((d + 1)(d + 2))`` (the interpolant of a convex function
    lies above it), the trapezoidal rule of a quad or hexahedron by ``|K| h_a^2 / 6``
    (``h_a`` its side along axis ``a``) and the midpoint rule underestimates it by
    half that. On uniform meshes of intervals, right triangles, rectangles and boxes
    the error is ``|Omega| h_a^2 / 6 = sum_i w_i h_ia^2 / 6``, ``h_ia`` the spacing
    along axis ``a`` at point ``i`` (here: the largest offset along ``a`` to its
    ``3^d`` nearest points, its cells' corners on a grid, so stretched cells count
    along each axis). Twice that, ``E_a = sum_i w_i h_ia^2 / 3``, covers irregular
    cells (``tests/inference/test_trust.py`` checks it against the exact error on perturbed
    meshes: at least the error, at most 8x it). The RMS radius
    ``r_a = sqrt(M_a / |Omega|)`` then moves by at most
    ``min(E_a / (2 |Omega| r_a), sqrt(E_a / |Omega|))``.

    A finer mesh of the same shape lies between this one's value and the exact one,
    so two meshes of one shape differ by at most the sum of their bounds. Curved
    boundaries are not covered: their polygonal approximation moves the measure, the
    centroid and the extent too, which the trust check leaves to a margin of the
    training range (``meshops.inference.trust.MARGIN``).

    Shapes:
        sample ``pos [N, d]``, ``weight [N]`` -> ``[1 + 3d]``
    """
    from meshops.search import knn

    pos, w = sample.pos.to(torch.float64), sample.weight.to(torch.float64)
    n, d = pos.shape
    measure = float(w.sum())
    rms = _geometry(sample)[1 + 2 * d:]
    tol = np.zeros(1 + 3 * d)
    if n < 2:
        return tol
    # h_ia: the spacing along axis a around point i, the largest offset to its 3^d
    # nearest points (its own cell's corners on a grid: the axis and diagonal neighbours)
    k = min(3 ** d, n)
    near = knn(pos, pos, k)[1].reshape(n, k)
    # part by part: the offsets [N, k, d] at once are 0.6 kB a point in 3-D (3 GB for
    # a mesh of 5M points)
    h = torch.cat([(pos[near[s:s + _PART]] - pos[s:s + _PART, None]).abs().amax(1)
                   for s in range(0, n, _PART)])                          # [N, d]
    e = ((w[:, None] * h ** 2).sum(0) / 3.0 / max(measure, 1e-300)).numpy()  # E_a / |Omega|
    tol[1 + 2 * d:] = np.minimum(e / (2 * np.maximum(rms, 1e-300)), np.sqrt(e))
    return tol


def describe(sample) -> tuple[np.ndarray, np.ndarray]:
    """``(parameters [K], geometry [1 + 3d])`` of one sample (see the module).

    Shapes:
        sample ``pos [N, d]``, ``weight [N]``, ``x [N, C]`` or ``params [1, K]``
    """
    return _params(sample), _geometry(sample)
