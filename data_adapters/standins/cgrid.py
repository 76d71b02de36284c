"""Algebraic C-grid around an airfoil, laid out like the Geo-FNO NACA grid.

Index ``i`` runs along the C: from the outflow boundary along the lower side of the
wake cut to the trailing edge, clockwise round the airfoil (lower surface, leading
edge, upper surface) and back along the upper side of the wake cut; index ``j``
runs from that line (``j = 0``) to the far field (``j = n1 - 1``). So the
wake-cut nodes and the trailing-edge node exist twice at ``j = 0`` (the two grid
lines coincide), as in the benchmark's 221 x 51 grid.

Construction (transfinite in ``j`` only, i.e. straight grid lines in ``j``):

* inner line ``j = 0``: the wake (``y = 0``, geometric spacing starting with the
  trailing-edge panel length and reaching ``x = 1 + wake_length``), the airfoil
  contour, the wake again;
* outer line ``j = n1 - 1``: a half circle of radius ``radius`` centred at the
  trailing edge ``(1, 0)`` joined to straight lines ``y = -+radius`` above/below the
  wake; an airfoil point at normalised arc length ``s`` (0 at the lower trailing
  edge, 1 at the upper) maps to the angle ``-pi/2 - pi s``, a wake point at ``x``
  to ``(x, -+radius)``;
* node ``(i, j)`` = ``(1 - eta_j) inner_i + eta_j outer_i`` with a geometric
  stretching ``eta`` whose first step is ``first_height / radius``.
"""

from __future__ import annotations

import numpy as np

from meshops.errors import MeshError


def _bisect(f, lo: float, hi: float, iters: int = 200) -> float:
    flo = f(lo)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return 0.5 * (lo + hi)


def geometric_steps(first: float, total: float, n: int) -> np.ndarray:
    """``n`` cumulative positions ``(0, total]`` of steps growing geometrically from ``first``."""
    if n < 1:
        return np.zeros(0)
    if first * n >= total:  # uniform is already coarse enough
        return np.linspace(total / n, total, n)
    ratio = _bisect(lambda r: first * (r ** n - 1) / (r - 1) - total, 1.0 + 1e-12, 10.0)
    steps = first * ratio ** np.arange(n)
    x = np.cumsum(steps)
    return x * (total / x[-1])


def stretching(n1: int, first: float) -> np.ndarray:
    """``eta [n1]`` from 0 to 1 with ``eta[1] ~= first`` (exponential stretching)."""
    zeta = np.linspace(0.0, 1.0, n1)
    if n1 < 3 or first >= 1.0 / (n1 - 1):
        return zeta
    kappa = _bisect(lambda k: np.expm1(k / (n1 - 1)) / np.expm1(k) - first, 1e-9, 200.0)
    eta = np.expm1(kappa * zeta) / np.expm1(kappa)
    eta[-1] = 1.0
    return eta


def c_grid(contour, n_wake: int, n1: int, radius: float = 5.0, wake_length: float = 5.0,
           first_height: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """C-grid around a closed airfoil contour with the trailing edge at ``(1, 0)``.

    Args:
        contour: Airfoil points ``[n_a, 2]`` from the trailing edge along the lower
            surface to the upper trailing edge (first = last = ``(1, 0)``), e.g.
            :func:`data_adapters.standins.naca4.naca4`.
        n_wake: Wake points per side, trailing edge excluded.
        n1: Grid points in ``j`` (surface to far field).
        radius: Far-field radius (chords) around the trailing edge.
        wake_length: Length of the wake cut behind the trailing edge (chords).
        first_height: Height of the first cell row at the far-field distance scale
            (``eta[1] = first_height / radius``).

    Returns:
        ``(X, Y)``, each ``[n0, n1]`` with ``n0 = n_a + 2 n_wake``.

    Shapes:
        contour ``[n_a, 2]`` -> ``[n0, n1]``, ``[n0, n1]``
    """
    c = np.asarray(contour, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != 2 or len(c) < 5:
        raise MeshError(f"c_grid: contour must be [n_a, 2] with n_a >= 5, got {c.shape}")
    if not (np.array_equal(c[0], [1.0, 0.0]) and np.array_equal(c[-1], [1.0, 0.0])):
        raise MeshError("c_grid: the contour must start and end at the trailing edge (1, 0)")
    if n1 < 2 or n_wake < 1:
        raise MeshError(f"c_grid: need n1 >= 2 and n_wake >= 1, got {n1}, {n_wake}")
    te_step = min(np.hypot(*(c[1] - c[0])), np.hypot(*(c[-1] - c[-2])))
    xw = 1.0 + geometric_steps(te_step, wake_length, n_wake)  # [n_wake], increasing
    wake = np.stack([xw, np.zeros_like(xw)], axis=1)
    inner = np.concatenate([wake[::-1], c, wake], axis=0)

    seg = np.hypot(*np.diff(c, axis=0).T)
    s = np.r_[0.0, np.cumsum(seg)] / seg.sum()
    phi = -0.5 * np.pi - np.pi * s
    arc = np.stack([1.0 + radius * np.cos(phi), radius * np.sin(phi)], axis=1)
    arc[0], arc[-1] = (1.0, -radius), (1.0, radius)
    lower = np.stack([xw[::-1], np.full(n_wake, -radius)], axis=1)
    upper = np.stack([xw, np.full(n_wake, radius)], axis=1)
    outer = np.concatenate([lower, arc, upper], axis=0)

    eta = stretching(n1, first_height / radius)
    grid = (1.0 - eta)[None, :, None] * inner[:, None, :] + eta[None, :, None] * outer[:, None, :]
    grid[:, 0] = inner  # keep the j = 0 line (wake-cut copies) bit-identical
    return grid[..., 0].copy(), grid[..., 1].copy()
