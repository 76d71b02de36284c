"""A first-order panel method for 3-D potential flow past a closed body.

The total potential ``phi`` of a uniform stream ``U`` past a closed body with the
Neumann condition ``dphi/dn = 0`` satisfies on the body's surface ``S`` (Green's third
identity in the exterior, outward normals ``n``, the single-layer term gone with the
normal derivative)

    phi(x) / 2 = U . x + (1 / 4 pi) integral_S phi(y) (x - y) . n_y / |x - y|^3 dA_y.

With ``phi`` constant on each flat triangle and the equation collocated at the
centroids, the integral over triangle ``j`` seen from centroid ``i`` is ``-Omega_ij``,
``Omega_ij`` the signed solid angle of the triangle (positive seen from behind its
normal), computed exactly by the Van Oosterom-Strackee formula (zero for ``i = j``):

    (I / 2 + Omega / 4 pi) phi = U . x_centroid.

The double-layer operator has the eigenvalue ``-1/2`` on constants and, on a sphere,
``-1 / (2 (2l + 1))`` on the degree-``l`` harmonics, so ``I/2 + Omega/4pi`` has its
spectrum in about ``(1/2, 1]``: no null space, and GMRES converges in a few
iterations. The dense matrix is assembled in row blocks and stored in float32 (an
entry's rounding, ``1e-7``, is far below the discretisation error), ``4 T^2`` bytes for
``T`` triangles.

The surface velocity is the tangential gradient of ``phi``: at each vertex, a quadratic
in the coordinates of the tangent plane fitted by least squares to the centroid values
of the triangles round its one-ring (its "two-ring" of triangles), whose constant is
the vertex potential and whose slope the velocity. The pressure coefficient is ``cp =
1 - |v|^2 / |U|^2``. On spheres and ellipsoids (``tests/data_adapters/
test_standin_body3d.py``) the potential converges at second order and the velocity and
``cp`` at about second order in the area-weighted L2 norm (first order in the max).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshops.errors import MeshError

#: Matrix entries per block of rows during assembly: small enough for the
#: temporaries to stay in cache (measured fastest at 20k-80k).
_BLOCK = 65536


def solid_angles(points, corners) -> np.ndarray:
    """Signed solid angles of triangles seen from points (Van Oosterom-Strackee):
    ``2 atan2(a . (b x c), |a||b||c| + (a.b)|c| + (a.c)|b| + (b.c)|a|)`` with ``a, b,
    c`` the corners less the point; positive when the point is behind the triangle's
    normal ``(b - a) x (c - a)``.

    Args:
        points: ``[P, 3]``.
        corners: ``[3, 3, T]``: corner, coordinate, triangle.

    Shapes:
        points ``[P, 3]``, corners ``[3, 3, T]`` -> ``[P, T]``
    """
    x = np.asarray(points, np.float64)[:, :, None]
    ax, ay, az = (corners[0, k][None] - x[:, k] for k in range(3))
    bx, by, bz = (corners[1, k][None] - x[:, k] for k in range(3))
    cx, cy, cz = (corners[2, k][None] - x[:, k] for k in range(3))
    la = np.sqrt(ax * ax + ay * ay + az * az)
    lb = np.sqrt(bx * bx + by * by + bz * bz)
    lc = np.sqrt(cx * cx + cy * cy + cz * cz)
    num = ax * (by * cz - bz * cy) + ay * (bz * cx - bx * cz) + az * (bx * cy - by * cx)
    den = (la * lb * lc + (ax * bx + ay * by + az * bz) * lc
           + (ax * cx + ay * cy + az * cz) * lb + (bx * cx + by * cy + bz * cz) * la)
    return 2.0 * np.arctan2(num, den)


def check_closed_surface(vertices, triangles, source: str = "panel method") -> None:
    """Raise :class:`MeshError` unless the triangles form closed, consistently oriented
    surfaces with outward normals: every directed edge once, its reverse once, and a
    positive enclosed volume.

    Shapes:
        vertices ``[N, 3]``, triangles ``[T, 3]``
    """
    p, t = np.asarray(vertices, np.float64), np.asarray(triangles, np.int64)
    if p.ndim != 2 or p.shape[1] != 3 or t.ndim != 2 or t.shape[1] != 3 or not len(t):
        raise MeshError(f"{source}: need vertices [N, 3] and triangles [T, 3], got "
                        f"{p.shape} and {t.shape}")
    if t.min() < 0 or t.max() >= len(p):
        raise MeshError(f"{source}: triangle indices out of range 0..{len(p) - 1}")
    edges = np.concatenate([t[:, [0, 1]], t[:, [1, 2]], t[:, [2, 0]]])
    code = edges[:, 0] * len(p) + edges[:, 1]
    if len(np.unique(code)) != len(code):
        raise MeshError(f"{source}: an edge is used twice in the same direction: the "
                        f"triangles are not consistently oriented (or not manifold)")
    if not np.isin(edges[:, 1] * len(p) + edges[:, 0], code).all():
        raise MeshError(f"{source}: the surface is not closed (an edge has one triangle)")
    c = p[t]
    volume = np.einsum("ij,ij->", c[:, 0], np.cross(c[:, 1], c[:, 2])) / 6
    if not volume > 0:
        raise MeshError(f"{source}: the enclosed volume is {volume:.3g}: the normals "
                        f"point inward; reverse the triangles' orientation")


def influence_matrix(vertices, triangles) -> np.ndarray:
    """``I / 2 + Omega / 4 pi`` (module docstring), float32, assembled in row blocks.

    Shapes:
        vertices ``[N, 3]``, triangles ``[T, 3]`` -> ``[T, T]``
    """
    c = np.asarray(vertices, np.float64)[np.asarray(triangles, np.int64)]    # [T, 3, 3]
    corners = np.ascontiguousarray(c.transpose(1, 2, 0))
    centroids = c.mean(1)
    n = len(c)
    out = np.empty((n, n), np.float32)
    rows = max(1, _BLOCK // n)
    for s in range(0, n, rows):
        block = solid_angles(centroids[s:s + rows], corners) / (4 * np.pi)
        k = np.arange(len(block))
        block[k, s + k] = 0.5           # the own triangle's solid angle is 0
        out[s:s + rows] = block
    return out


def solve_potential(vertices, triangles, streams, rtol: float = 1e-10) -> np.ndarray:
    """The total potential at the triangles' centroids for each stream (GMRES).

    Raises:
        MeshError: not a closed outward-oriented surface (:func:`check_closed_surface`).
        RuntimeError: GMRES did not converge.

    Shapes:
        vertices ``[N, 3]``, triangles ``[T, 3]``, streams ``[K, 3]`` -> ``[T, K]``
    """
    from scipy.sparse.linalg import LinearOperator, gmres

    check_closed_surface(vertices, triangles)
    streams = np.asarray(streams, np.float64).reshape(-1, 3)
    a = influence_matrix(vertices, triangles)
    rhs = np.asarray(vertices, np.float64)[np.asarray(triangles)].mean(1) @ streams.T
    rows = max(1, 16 * _BLOCK // len(a))

    def matvec(v):
        # a float64 product, block by block: a float32 one would stall GMRES at 1e-7,
        # and a float64 copy of the matrix would double the memory
        v = np.asarray(v, np.float64).ravel()
        return np.concatenate([a[s:s + rows].astype(np.float64) @ v
                               for s in range(0, len(a), rows)])

    op = LinearOperator(a.shape, matvec=matvec, dtype=np.float64)
    out = np.empty_like(rhs)
    for k in range(len(streams)):
        out[:, k], info = gmres(op, rhs[:, k], rtol=rtol, atol=0.0, restart=50, maxiter=20)
        if info != 0:
            raise RuntimeError(f"panel method: GMRES did not reach rtol {rtol:g} "
                               f"(info {info}) on {len(a)} panels")
    return out


def vertex_normals(vertices, triangles) -> np.ndarray:
    """Unit vertex normals, the area-weighted mean of the triangles' normals.

    Shapes:
        vertices ``[N, 3]``, triangles ``[T, 3]`` -> ``[N, 3]``
    """
    p, t = np.asarray(vertices, np.float64), np.asarray(triangles, np.int64)
    cross = np.cross(p[t[:, 1]] - p[t[:, 0]], p[t[:, 2]] - p[t[:, 0]])
    n = np.stack([np.bincount(t.ravel(), np.repeat(cross[:, k], 3), len(p))
                  for k in range(3)], 1)
    return n / np.linalg.norm(n, axis=1, keepdims=True)


def _two_rings(triangles, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per vertex the triangles with a corner in its one-ring, padded: ``(index [N,
    K], mask [N, K])``."""
    import scipy.sparse as sp

    t = np.asarray(triangles, np.int64)
    v2t = sp.csr_matrix((np.ones(t.size), (t.ravel(), np.repeat(np.arange(len(t)), 3))),
                        shape=(n, len(t)))
    ring = (v2t @ v2t.T @ v2t).tocsr()
    ring.sort_indices()
    count = np.diff(ring.indptr)
    mask = np.arange(count.max())[None] < count[:, None]
    index = np.zeros(mask.shape, np.int64)
    index[mask] = ring.indices
    return index, mask


def tangential_fit(vertices, triangles, values, normals) -> tuple[np.ndarray, np.ndarray]:
    """Vertex values and tangential gradients of fields given at the centroids: at each
    vertex, the least-squares quadratic in tangent-plane coordinates through the
    centroid values of its two-ring of triangles (module docstring).

    Shapes:
        vertices ``[N, 3]``, triangles ``[T, 3]``, values ``[T, C]``, normals ``[N, 3]``
        -> ``([N, C], [N, 3, C])``
    """
    p = np.asarray(vertices, np.float64)
    t = np.asarray(triangles, np.int64)
    n = np.asarray(normals, np.float64)
    index, mask = _two_rings(t, len(p))
    helper = np.where(np.abs(n[:, :1]) < 0.9, [[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]])
    e1 = np.cross(n, helper)
    e1 /= np.linalg.norm(e1, axis=1, keepdims=True)
    e2 = np.cross(n, e1)
    d = p[t].mean(1)[index] - p[:, None]                                  # [N, K, 3]
    # coordinates in units of the patch's size keep the normal equations conditioned
    size = np.sqrt((mask * (d * d).sum(-1)).sum(1) / mask.sum(1))[:, None]
    u, w = (np.einsum("nkd,nd->nk", d, e) / size for e in (e1, e2))
    x = np.stack([np.ones_like(u), u, w, u * u, u * w, w * w], -1) * mask[..., None]
    y = np.asarray(values, np.float64)[index] * mask[..., None]           # [N, K, C]
    coef = np.linalg.solve(np.einsum("nki,nkj->nij", x, x), np.einsum("nki,nkc->nic", x, y))
    grad = (coef[:, 1, None] * e1[..., None] + coef[:, 2, None] * e2[..., None]) / size[..., None]
    return coef[:, 0], grad


@dataclass
class SurfaceFlow:
    """The solution of :func:`surface_flow` at the vertices.

    Attributes:
        phi: Total potential ``[N]``.
        velocity: Surface velocity ``[N, 3]``, tangent to ``normals``.
        cp: Pressure coefficient ``1 - |v|^2 / |U|^2`` ``[N]``.
        normals: The unit normals ``[N, 3]`` the velocity is tangent to.
    """

    phi: np.ndarray
    velocity: np.ndarray
    cp: np.ndarray
    normals: np.ndarray


def surface_flow(vertices, triangles, stream, normals=None) -> SurfaceFlow:
    """Potential flow of the uniform ``stream`` past the closed surface, at its vertices.

    Args:
        vertices, triangles: The surface (closed, normals outward by the right-hand
            rule).
        stream: The free-stream velocity ``[3]`` (any non-zero size).
        normals: Unit normals at the vertices ``[N, 3]`` (those of the exact surface when
            known); ``None``: :func:`vertex_normals`.

    Raises:
        ValueError: a zero or malformed stream, or normals of the wrong shape.
        MeshError: not a closed outward-oriented surface.

    Shapes:
        vertices ``[N, 3]``, triangles ``[T, 3]``, stream ``[3]`` -> fields ``[N]``/``[N, 3]``
    """
    u = np.asarray(stream, np.float64)
    if u.shape != (3,) or not np.isfinite(u).all() or not np.linalg.norm(u) > 0:
        raise ValueError(f"surface_flow: the stream must be a non-zero vector [3], got {u!r}")
    n = vertex_normals(vertices, triangles) if normals is None else np.asarray(normals,
                                                                              np.float64)
    if n.shape != np.shape(vertices):
        raise ValueError(f"surface_flow: normals must be [N, 3] like the vertices "
                         f"{np.shape(vertices)}, got {n.shape}")
    phi_c = solve_potential(vertices, triangles, u[None])
    phi, grad = tangential_fit(vertices, triangles, phi_c, n)
    v = grad[..., 0]
    v = v - n * np.einsum("nd,nd->n", n, v)[:, None]
    return SurfaceFlow(phi[:, 0], v, 1.0 - (v * v).sum(1) / (u @ u), n)
