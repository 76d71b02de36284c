"""What the trust report compares: the parameters and the geometry of one sample.

:func:`describe` gives a sample's parameters (``params``, or the weighted means of its
input fields) and its geometry (measure, centroid, extent, RMS radius about the
centroid); :func:`tolerance` how far the discretisation alone may move each of them
(:func:`params_tolerance`, :func:`geometry_tolerance`). :mod:`meshops.inference.trust`
measures a new mesh against the training set with them; :mod:`meshops.datasets.cache`
records them of every cached sample.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["describe", "geometry_tolerance", "mesh_key", "params_tolerance", "tolerance"]

#: Points whose spacing :func:`geometry_tolerance` and whose fit :func:`params_tolerance`
#: measure at a time.
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


def _near(pos: torch.Tensor) -> torch.Tensor:
    """``[N, k]``: each point's ``k = 3^d`` nearest points (itself first)."""
    from meshops.search import knn

    n, d = pos.shape
    k = min(3 ** d, n)
    return knn(pos, pos, k)[1].reshape(n, k)


def geometry_tolerance(sample, near: torch.Tensor | None = None) -> np.ndarray:
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
        sample ``pos [N, d]``, ``weight [N]`` -> ``[1 + 3d]``; ``near [N, k]`` the
        points' nearest ones (computed when not given)
    """
    pos, w = sample.pos.to(torch.float64), sample.weight.to(torch.float64)
    n, d = pos.shape
    measure = float(w.sum())
    rms = _geometry(sample)[1 + 2 * d:]
    tol = np.zeros(1 + 3 * d)
    if n < 2:
        return tol
    # h_ia: the spacing along axis a around point i, the largest offset to its 3^d
    # nearest points (its own cell's corners on a grid: the axis and diagonal neighbours)
    near = _near(pos) if near is None else near
    # part by part: the offsets [N, k, d] at once are 0.6 kB a point in 3-D (3 GB for
    # a mesh of 5M points)
    h = torch.cat([(pos[near[s:s + _PART]] - pos[s:s + _PART, None]).abs().amax(1)
                   for s in range(0, n, _PART)])                          # [N, d]
    e = ((w[:, None] * h ** 2).sum(0) / 3.0 / max(measure, 1e-300)).numpy()  # E_a / |Omega|
    tol[1 + 2 * d:] = np.minimum(e / (2 * np.maximum(rms, 1e-300)), np.sqrt(e))
    return tol


def params_tolerance(sample, near: torch.Tensor | None = None) -> np.ndarray:
    """``[K]``: how far the discretisation may move each parameter of :func:`describe`
    from the exact value of the sample's domain.

    Parameters given as ``params`` and the means of inputs constant over the mesh (a
    parametric study's) are exact: 0. The quadrature mean of a varying input ``f``
    integrates it exactly where ``f`` is linear on each cell (the vertex rule of linear
    cells, the midpoint rule); its error is that of the linear interpolant, at most the
    remainder of a linear fit near each point. Here ``r_i``, the largest residual of the
    least-squares linear fit of ``f`` to point ``i``'s ``3^d`` nearest points (about
    ``f'' h^2 / 2``, 4x the interpolation error of a cell on a quadratic), and the bound
    is its weighted mean ``sum_i w_i r_i / sum_i w_i``: ``O(h^2)``, and for linear fields
    1e-10 of their variation (the ridge of the fit).

    Not covered, as for the geometry: what re-meshing a curved boundary or surface
    changes of the domain itself (on a surface the fit runs in the ambient coordinates,
    which follow a field linear in them, such as a sphere's exact normal, exactly), and
    cells stretched beyond about 4:1, whose ``3^d`` nearest points all lie across them.
    The trust check adds a margin of the training range for those
    (:class:`meshops.inference.trust.TrainingSet`).

    Shapes:
        sample ``pos [N, d]``, ``weight [N]``, ``x [N, C]`` or ``params [1, K]`` ->
        ``[K]``; ``near [N, k]`` as for :func:`geometry_tolerance`
    """
    p = _params(sample)
    if getattr(sample, "params", None) is not None or p.size == 0:
        return np.zeros_like(p)
    x = sample.x.to(torch.float64).reshape(sample.x.shape[0], -1)
    varying = (x.amax(0) > x.amin(0)).nonzero().flatten()
    tol = np.zeros(p.size)
    if len(varying) == 0 or x.shape[0] < 2:
        return tol
    pos, w = sample.pos.to(torch.float64), sample.weight.to(torch.float64).numpy()
    near = (_near(pos) if near is None else near).numpy()
    f, pos = x[:, varying].numpy(), pos.numpy()
    r = np.concatenate([_fit_residual(pos, f, near[s:s + _PART], s)
                        for s in range(0, pos.shape[0], _PART)])              # [N, C']
    tol[varying.numpy()] = (w[:, None] * r).sum(0) / w.sum()
    return tol


def _fit_residual(pos: np.ndarray, f: np.ndarray, near: np.ndarray, start: int) -> np.ndarray:
    """``[n, C]``: the largest residual of the least-squares linear fit of ``f`` at points
    ``start..start + n`` to their nearest points ``near [n, k]`` (a ridge of 1e-10 of
    the offsets' scale keeps the fit least-norm on surfaces). In NumPy: torch's batched
    products hang in a process forked from one whose thread pool ran (a data loader's
    worker, the cache's builders)."""
    i = np.arange(start, start + near.shape[0])
    dx = pos[near] - pos[i, None]                                   # [n, k, d]
    df = f[near] - f[i, None]                                       # [n, k, C]
    a = np.einsum("nka,nkb->nab", dx, dx)                            # [n, d, d]
    ridge = 1e-10 * np.maximum(np.trace(a, axis1=1, axis2=2), 1e-300)
    a = a + ridge[:, None, None] * np.eye(dx.shape[2])
    grad = np.linalg.solve(a, np.einsum("nka,nkc->nac", dx, df))    # [n, d, C]
    return np.abs(df - np.einsum("nka,nac->nkc", dx, grad)).max(1)


def tolerance(sample) -> np.ndarray:
    """:func:`params_tolerance` and :func:`geometry_tolerance` of a sample, in the order
    of :func:`describe`'s two vectors (one neighbour search).

    Shapes:
        sample ``pos [N, d]``, ``weight [N]``, ``x [N, K]`` or ``params [1, K]`` ->
        ``[K + 1 + 3d]``
    """
    if sample.pos.shape[0] < 2:
        return np.concatenate([np.zeros_like(_params(sample)), geometry_tolerance(sample)])
    near = _near(sample.pos.to(torch.float64))
    return np.concatenate([params_tolerance(sample, near), geometry_tolerance(sample, near)])


def mesh_key(sample) -> str:
    """A short digest of the sample's points (in float64): samples of one mesh share it,
    and their quadrature errors are the same, so that a difference of their input means
    is a difference of the inputs, which no discretisation bound may excuse."""
    from meshops.mesh.digest import mesh_digest

    # + 0.0: -0.0 and 0.0 are one coordinate, not two digests
    return mesh_digest(sample.pos.to(torch.float64) + 0.0)[:16]


def describe(sample) -> tuple[np.ndarray, np.ndarray]:
    """``(parameters [K], geometry [1 + 3d])`` of one sample (see the module).

    Shapes:
        sample ``pos [N, d]``, ``weight [N]``, ``x [N, C]`` or ``params [1, K]``
    """
    return _params(sample), _geometry(sample)
