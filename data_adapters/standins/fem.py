"""Plane-strain linear elasticity with P1 (linear triangle) finite elements.

Assembly and solution use scikit-fem; the stress post-processing is plain numpy.

* Material: isotropic, Young's modulus ``E``, Poisson ratio ``nu``, plane strain
  (``eps_zz = 0``, so ``sigma_zz = nu (sigma_xx + sigma_yy)``); the Lame parameters
  are the 3-D ones.
* Boundary conditions on an axis-aligned outer box: the bottom edge ``y = y_min`` is
  either clamped (``u = 0``) or on rollers (``u_y = 0``, plus ``u_x = 0`` at its
  leftmost node to remove the rigid translation); the top edge ``y = y_max`` carries
  a uniform traction ``(0, traction)``; every other boundary is traction free.
* Nodal stress: the element stresses (constant on each P1 triangle) are
  L2-projected onto the continuous P1 space with the consistent mass matrix,
  component by component, and the von Mises stress is taken of the projected
  components. P1 stresses converge only at first order in ``h``; the consistent
  projection is markedly more accurate at the boundary than the area-weighted
  average (lumped projection), which matters for stress concentrations.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from meshops.errors import MeshError


def lame(E: float, nu: float) -> tuple[float, float]:
    """3-D Lame parameters ``(lambda, mu)`` (what plane strain uses)."""
    return E * nu / ((1 + nu) * (1 - 2 * nu)), E / (2 * (1 + nu))


def solve_plane_strain(points, triangles, E: float = 1.0, nu: float = 0.3,
                       traction: float = 1.0, support: str = "clamped") -> np.ndarray:
    """Displacement of a body pulled at its top edge, held at its bottom edge.

    Args:
        points: Nodes ``[N, 2]``.
        triangles: ``[M, 3]`` node indices (either orientation).
        E, nu: Young's modulus and Poisson ratio.
        traction: Normal traction on the top edge (positive = tension).
        support: ``"clamped"`` (``u = 0`` on the bottom edge) or ``"roller"``
            (``u_y = 0`` there and ``u_x = 0`` at its leftmost node).

    Returns:
        Displacement ``[N, 2]``.

    Shapes:
        points ``[N, 2]``, triangles ``[M, 3]`` -> ``[N, 2]``
    """
    try:
        from skfem import Basis, ElementTriP1, ElementVector, MeshTri, asm, condense, solve
        from skfem.models.elasticity import linear_elasticity
    except ImportError as e:  # pragma: no cover - dependency hint
        raise ImportError("the elasticity stand-in needs scikit-fem: pip install scikit-fem") from e
    if support not in ("clamped", "roller"):
        raise MeshError(f"support must be 'clamped' or 'roller', got {support!r}")
    p = np.ascontiguousarray(np.asarray(points, dtype=np.float64).T)
    t = np.ascontiguousarray(np.asarray(triangles, dtype=np.int64).T)
    mesh = MeshTri(p, t)
    basis = Basis(mesh, ElementVector(ElementTriP1()))
    K = asm(linear_elasticity(*lame(E, nu)), basis)
    dofs = basis.nodal_dofs  # [2, N]: x and y dof of each node
    ymin, ymax = p[1].min(), p[1].max()
    tol = 1e-9 * (ymax - ymin)
    # Uniform traction on the top edge: for P1 the consistent load puts half of
    # traction * length of each boundary edge on its two end nodes.
    edges = mesh.facets[:, mesh.boundary_facets()]
    top = edges[:, (np.abs(p[1, edges] - ymax) <= tol).all(axis=0)]
    if top.shape[1] == 0:
        raise MeshError("solve_plane_strain: no boundary edges on the top edge")
    length = np.abs(p[0, top[1]] - p[0, top[0]])
    f = np.zeros(basis.N)
    np.add.at(f, dofs[1, top[0]], 0.5 * traction * length)
    np.add.at(f, dofs[1, top[1]], 0.5 * traction * length)
    bottom = np.flatnonzero(np.abs(p[1] - ymin) <= tol)
    if support == "clamped":
        fixed = dofs[:, bottom].ravel()
    else:
        corner = bottom[np.argmin(p[0, bottom])]
        fixed = np.r_[dofs[1, bottom], dofs[0, corner]]
    u = solve(*condense(K, f, D=fixed))
    return np.stack([u[dofs[0]], u[dofs[1]]], axis=1)


def element_stress(points, triangles, displacement, E: float = 1.0,
                   nu: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """Constant stress of each P1 triangle and the triangle areas.

    Returns:
        ``(stress [M, 3], area [M])`` with components ``(s_xx, s_yy, s_xy)``.

    Shapes:
        points ``[N, 2]``, triangles ``[M, 3]``, displacement ``[N, 2]`` -> ``[M, 3]``, ``[M]``
    """
    x = np.asarray(points, dtype=np.float64)[triangles]  # [M, 3, 2]
    X, Y = x[..., 0], x[..., 1]
    det = (X[:, 1] - X[:, 0]) * (Y[:, 2] - Y[:, 0]) - (X[:, 2] - X[:, 0]) * (Y[:, 1] - Y[:, 0])
    gx = np.stack([Y[:, 1] - Y[:, 2], Y[:, 2] - Y[:, 0], Y[:, 0] - Y[:, 1]], 1) / det[:, None]
    gy = np.stack([X[:, 2] - X[:, 1], X[:, 0] - X[:, 2], X[:, 1] - X[:, 0]], 1) / det[:, None]
    U = np.asarray(displacement)[triangles]  # [M, 3, 2]
    exx = (gx * U[..., 0]).sum(1)
    eyy = (gy * U[..., 1]).sum(1)
    exy = 0.5 * ((gy * U[..., 0]).sum(1) + (gx * U[..., 1]).sum(1))
    lam, mu = lame(E, nu)
    tr = exx + eyy
    return np.stack([lam * tr + 2 * mu * exx, lam * tr + 2 * mu * eyy, 2 * mu * exy], 1), \
        0.5 * np.abs(det)


def l2_project(num_points: int, triangles, values, area) -> np.ndarray:
    """L2 projection of piecewise-constant values onto continuous P1 (consistent mass).

    Shapes:
        triangles ``[M, 3]``, values ``[M, c]``, area ``[M]`` -> ``[N, c]``
    """
    tri = np.asarray(triangles)
    local = (np.ones((3, 3)) + np.eye(3)) / 12.0
    rows = np.repeat(tri, 3, axis=1).ravel()
    cols = np.tile(tri, (1, 3)).ravel()
    vals = (area[:, None, None] * local).reshape(len(tri), 9).ravel()
    mass = sp.csc_matrix((vals, (rows, cols)), shape=(num_points, num_points))
    rhs = np.zeros((num_points, values.shape[1]))
    for k in range(3):
        np.add.at(rhs, tri[:, k], values * (area / 3.0)[:, None])
    return spla.splu(mass).solve(rhs)


def von_mises_plane_strain(stress, nu: float) -> np.ndarray:
    """Von Mises stress of in-plane components ``(s_xx, s_yy, s_xy)`` under plane strain
    (``s_zz = nu (s_xx + s_yy)``).

    Shapes:
        stress ``[..., 3]`` -> ``[...]``
    """
    sxx, syy, sxy = stress[..., 0], stress[..., 1], stress[..., 2]
    szz = nu * (sxx + syy)
    return np.sqrt(0.5 * ((sxx - syy) ** 2 + (syy - szz) ** 2 + (szz - sxx) ** 2) + 3 * sxy ** 2)


def nodal_stress(points, triangles, displacement, E: float = 1.0, nu: float = 0.3) -> np.ndarray:
    """Nodal stress ``[N, 3]`` ``(s_xx, s_yy, s_xy)`` by consistent L2 projection."""
    s, area = element_stress(points, triangles, displacement, E, nu)
    return l2_project(len(points), triangles, s, area)
