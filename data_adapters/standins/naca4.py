"""NACA 4-digit airfoil coordinates (closed trailing edge).

Thickness ``y_t = 5 t (0.2969 sqrt(x) - 0.1260 x - 0.3516 x^2 + 0.2843 x^3 - 0.1036 x^4)``
(the closed-trailing-edge variant of the last coefficient, so ``y_t(1) = 0``), mean
camber line with maximum camber ``m`` at chord position ``p``; thickness is applied
perpendicular to the camber line. Chord 1, leading edge at the origin, trailing edge
at ``(1, 0)``. Points are cosine-spaced in ``x`` (clustered at both edges).
"""

from __future__ import annotations

import numpy as np

from meshops.errors import MeshError


def naca4_name(m: float, p: float, t: float) -> str:
    """The 4-digit designation, e.g. ``(0.02, 0.4, 0.12) -> "NACA 2412"`` (rounded)."""
    mm = round(100 * m)
    return f"NACA {mm:d}{round(10 * p) if mm > 0 else 0:d}{round(100 * t):02d}"


def naca4(m: float, p: float, t: float, n_side: int) -> np.ndarray:
    """Closed airfoil contour from the trailing edge along the lower surface to the
    leading edge and back along the upper surface to the trailing edge.

    The ordering is clockwise, as a panel method and a C-grid's ``j = 0`` line want
    it. The trailing edge is exactly ``(1, 0)`` (first and last point), the leading
    edge exactly ``(0, 0)``; for ``m = 0`` the lower surface is the exact mirror
    image of the upper one.

    Args:
        m: Maximum camber (fraction of chord), ``0 <= m < 0.1``.
        p: Position of maximum camber, ``0 < p < 1`` (ignored when ``m = 0``).
        t: Maximum thickness, ``0 < t < 0.4``.
        n_side: Points per surface including both edges (``>= 3``).

    Returns:
        ``[2 * n_side - 1, 2]`` points.

    Shapes:
        -> ``[2 n_side - 1, 2]``
    """
    if n_side < 3:
        raise MeshError(f"naca4: n_side must be >= 3, got {n_side}")
    if not (0 <= m < 0.1 and 0 < t < 0.4 and (m == 0 or 0 < p < 1)):
        raise MeshError("naca4: need 0 <= m < 0.1, 0 < p < 1, 0 < t < 0.4; "
                        f"got m={m}, p={p}, t={t}")
    beta = np.linspace(0.0, np.pi, n_side)
    x = 0.5 * (1.0 - np.cos(beta))
    x[0], x[-1] = 0.0, 1.0
    yt = 5 * t * (0.2969 * np.sqrt(x) - 0.1260 * x - 0.3516 * x ** 2 + 0.2843 * x ** 3
                  - 0.1036 * x ** 4)
    if m > 0:
        front = x < p
        yc = np.where(front, m / p ** 2 * (2 * p * x - x ** 2),
                      m / (1 - p) ** 2 * ((1 - 2 * p) + 2 * p * x - x ** 2))
        dyc = np.where(front, 2 * m / p ** 2 * (p - x), 2 * m / (1 - p) ** 2 * (p - x))
        theta = np.arctan(dyc)
        upper = np.stack([x - yt * np.sin(theta), yc + yt * np.cos(theta)], axis=1)
        lower = np.stack([x + yt * np.sin(theta), yc - yt * np.cos(theta)], axis=1)
    else:
        upper = np.stack([x, yt], axis=1)
        lower = np.stack([x, -yt], axis=1)
    for s in (upper, lower):
        s[0] = (0.0, 0.0)
        s[-1] = (1.0, 0.0)
    return np.concatenate([lower[::-1], upper[1:]], axis=0)
