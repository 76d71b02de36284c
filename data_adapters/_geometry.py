"""Distance to a star-shaped void: the geometry input of the elasticity data.

The Elasticity problem maps a geometry to a stress field whose peaks sit on the
void's boundary. Point positions alone tell a model where the material is only
through the density of the points; the distance to the void's boundary tells it
directly, and is cheap to compute from the void's radius function (the
stand-in's Fourier series, or the Geo-FNO ``rr`` file).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.interpolate import CubicSpline

#: vertices of the polygon that stands for a smooth void boundary; a chord of
#: length L deviates from a curve of curvature kappa by about L^2 kappa / 8
#: (2e-6 for a circle of radius 0.4)
POLYGON_VERTICES = 1024


def star_polygon(radius_fn, center=(0.5, 0.5), vertices: int = POLYGON_VERTICES) -> np.ndarray:
    """Vertices of the star-shaped curve ``center + r(theta) (cos theta, sin theta)``.

    Args:
        radius_fn: ``theta [M] -> r [M]``.
        center: The star's centre.
        vertices: Number of vertices, at equally spaced angles.

    Returns:
        ``[M, 2]`` float64, counter-clockwise, not closed (last != first).
    """
    theta = np.linspace(0.0, 2 * np.pi, vertices, endpoint=False)
    r = np.asarray(radius_fn(theta), dtype=np.float64)
    return np.stack([center[0] + r * np.cos(theta), center[1] + r * np.sin(theta)], 1)


def periodic_radius(rr: np.ndarray):
    """A smooth ``r(theta)`` through radii sampled at equally spaced angles.

    ``rr [R]`` holds ``r(2 pi k / (R - 1))`` when closed (``rr[0] == rr[-1]`` to 1e-9
    relative, as in the Geo-FNO file) and ``r(2 pi k / R)`` otherwise (the same
    convention as :func:`data_adapters.elasticity.void_area_from_rr`); the curve is
    the periodic cubic spline through them.
    """
    r = np.asarray(rr, dtype=np.float64).ravel()
    if abs(r[0] - r[-1]) <= 1e-9 * max(np.abs(r).max(), 1e-300):
        r = np.r_[r[:-1], r[0]]     # exactly periodic, as the spline requires
    else:
        r = np.r_[r, r[0]]
    theta = np.linspace(0.0, 2 * np.pi, len(r))
    spline = CubicSpline(theta, r, bc_type="periodic")
    return lambda t: spline(np.mod(t, 2 * np.pi))


def polygon_distance(points: np.ndarray, polygon: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """Euclidean distance from each point to a closed polygon (its edges).

    Args:
        points: ``[N, 2]``.
        polygon: ``[M, 2]`` vertices in order; the edge from the last vertex back
            to the first is included.
        chunk: Points per block (memory ``chunk * M`` floats).

    Returns:
        ``[N]`` float64, unsigned.
    """
    p = np.asarray(points, dtype=np.float64)
    a = np.asarray(polygon, dtype=np.float64)
    ab = np.roll(a, -1, axis=0) - a
    ab2 = np.maximum((ab * ab).sum(1), np.finfo(np.float64).tiny)
    out = np.empty(len(p))
    for s in range(0, len(p), chunk):
        ap = p[s:s + chunk, None, :] - a[None]
        t = np.clip((ap * ab).sum(-1) / ab2, 0.0, 1.0)
        d = ap - t[..., None] * ab
        out[s:s + chunk] = np.sqrt((d * d).sum(-1).min(1))
    return out


def closed_polygon(radius_fn, center, spacing: float, least: int = 16) -> np.ndarray:
    """The star-shaped curve ``center + r(theta) (cos theta, sin theta)`` as a polygon
    with edges of about ``spacing`` (at least ``least`` vertices, at equal angles; the
    perimeter measured on 2,048 vertices).

    Shapes:
        -> ``[M, 2]`` (counter-clockwise, not closed)
    """
    dense = star_polygon(radius_fn, center, 2048)
    perimeter = np.hypot(*np.diff(np.vstack([dense, dense[:1]]), axis=0).T).sum()
    return star_polygon(radius_fn, center, max(least, math.ceil(perimeter / spacing)))


def band_around(radius_fn, center, band: float, spacing: float):
    """The band ``r(theta) <= rho <= r(theta) + band`` around a star-shaped body, as a
    graded re-mesh refines it: its outer edge (a polygon with edges of about
    ``spacing``) and a point inside it (the region's seed for ``triangle``).

    Shapes:
        -> ``([M, 2], [2])``
    """
    def outer(t):
        return np.asarray(radius_fn(t), np.float64) + band

    inside = np.asarray(center, np.float64) + (outer(np.zeros(1))[0] - band / 2) * np.r_[1.0, 0]
    return closed_polygon(outer, center, spacing), inside


def triangulate_loops(loops, holes, max_area: float, min_angle: float = 30.0,
                      regions=()) -> tuple[np.ndarray, np.ndarray]:
    """Quality triangle mesh (``triangle``) of the domain bounded by closed polygons.

    Args:
        loops: Closed polygons ``[P_k, 2]`` (not repeating their first vertex); their
            edges are kept as mesh edges.
        holes: A point inside each hole ``[H, 2]``.
        max_area: The largest triangle area.
        min_angle: The smallest triangle angle (degrees).
        regions: ``(seed point [2], max area)`` of regions with a smaller bound of their
            own (bounded by loops; a graded re-mesh's band).

    Returns:
        ``(points [N, 2], triangles [M, 3])``.
    """
    import triangle

    start = np.cumsum([0] + [len(loop) for loop in loops])
    segments = np.concatenate([a + np.stack([np.arange(n), (np.arange(n) + 1) % n], 1)
                               for a, n in zip(start, map(len, loops))])
    geometry = {"vertices": np.concatenate(loops), "segments": segments,
                "holes": np.asarray(holes, np.float64)}
    switches = f"pq{min_angle:g}"
    if regions:  # 'A' reads the regions, 'a' without a number their bounds
        geometry["regions"] = np.asarray([[*seed, 1, area] for seed, area in regions])
        switches += "Aa"
    out = triangle.triangulate(geometry, f"{switches}a{max_area:.10f}")
    return np.asarray(out["vertices"], np.float64), np.asarray(out["triangles"], np.int64)
