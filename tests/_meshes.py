"""Small mesh generators for the tests (structured, so refinements are nested)."""

from __future__ import annotations

import numpy as np


def grid_points(n: int, dim: int) -> np.ndarray:
    """Nodes of the uniform ``n^dim`` cell grid on the unit cube, C order, ``[(n+1)^dim, dim]``."""
    axes = [np.linspace(0.0, 1.0, n + 1)] * dim
    return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, dim)


def perturb_interior(points: np.ndarray, n: int, amount: float, seed: int = 0) -> np.ndarray:
    """Move nodes not on the cube's boundary by up to ``amount * h`` in each coordinate.

    The union of the cells stays the unit cube, so integrals over it are known exactly.
    """
    rng = np.random.default_rng(seed)
    inner = ((points > 1e-12) & (points < 1 - 1e-12)).all(axis=1)
    out = points.copy()
    out[inner] += rng.uniform(-amount, amount, (inner.sum(), points.shape[1])) / n
    return out


def square_mesh(n: int, kind: str = "quad", amount: float = 0.0, seed: int = 0):
    """Unit square with ``n x n`` cells: ``kind`` in quad, triangle, mixed.

    Returns ``(points [N, 2], cells list[(type, conn)])``.
    """
    pts = perturb_interior(grid_points(n, 2), n, amount, seed) if amount else grid_points(n, 2)
    idx = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    q = np.stack([idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]], -1).reshape(-1, 4)
    if kind == "quad":
        return pts, [("quad", q)]
    tri = np.concatenate([q[:, [0, 1, 2]], q[:, [0, 2, 3]]])
    if kind == "triangle":
        return pts, [("triangle", tri)]
    split = np.arange(len(q)) % 2 == 1
    tri = np.concatenate([q[split][:, [0, 1, 2]], q[split][:, [0, 2, 3]]])
    return pts, [("quad", q[~split]), ("triangle", tri)]


def cube_mesh(n: int, amount: float = 0.0, seed: int = 0):
    """Mixed, conforming unit-cube mesh of hexahedra, pyramids and wedges.

    Columns of cubes (fixed i, j) are, by ``(i + j) % 3``: hexahedra; cubes split
    into 6 pyramids around a (perturbed) centre node; cubes split into 2 wedges
    along a vertical diagonal plane. Neighbours share bilinear quad faces, so the
    union of the cells is the unit cube even with perturbed interior nodes.
    """
    pts = grid_points(n, 3)
    pts = perturb_interior(pts, n, amount, seed) if amount else pts
    idx = np.arange((n + 1) ** 3).reshape(n + 1, n + 1, n + 1)
    rng = np.random.default_rng(seed + 1)
    hexes, pyrs, wedges, extra = [], [], [], []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                v = [idx[i, j, k], idx[i + 1, j, k], idx[i + 1, j + 1, k], idx[i, j + 1, k],
                     idx[i, j, k + 1], idx[i + 1, j, k + 1], idx[i + 1, j + 1, k + 1],
                     idx[i, j + 1, k + 1]]
                kind = (i + j) % 3
                if kind == 0:
                    hexes.append(v)
                elif kind == 1:
                    c = len(pts) + len(extra)
                    centre = pts[v].mean(0) + (rng.uniform(-1, 1, 3) * amount / n / 2)
                    extra.append(centre)
                    for f in ([0, 3, 2, 1], [4, 5, 6, 7], [0, 1, 5, 4], [1, 2, 6, 5],
                              [2, 3, 7, 6], [3, 0, 4, 7]):
                        pyrs.append([v[a] for a in f] + [c])
                else:
                    wedges.append([v[0], v[1], v[2], v[4], v[5], v[6]])
                    wedges.append([v[0], v[2], v[3], v[4], v[6], v[7]])
    pts = np.concatenate([pts, np.array(extra).reshape(-1, 3)])
    cells = [("hexahedron", np.array(hexes)), ("pyramid", np.array(pyrs)),
             ("wedge", np.array(wedges))]
    return pts, [(t, c) for t, c in cells if len(c)]


def tetra_cube(n: int, amount: float = 0.0, seed: int = 0):
    """Unit cube split into 6 tetrahedra per cell (Kuhn triangulation), conforming."""
    pts = grid_points(n, 3)
    pts = perturb_interior(pts, n, amount, seed) if amount else pts
    idx = np.arange((n + 1) ** 3).reshape(n + 1, n + 1, n + 1)
    tets = []
    paths = [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
    for i in range(n):
        for j in range(n):
            for k in range(n):
                for p in paths:
                    c = [i, j, k]
                    t = [idx[tuple(c)]]
                    for axis in p:
                        c[axis] += 1
                        t.append(idx[tuple(c)])
                    tets.append(t)
    return pts, [("tetra", np.array(tets))]


def annulus_quads(nr: int, nt: int, r0: float = 0.5, r1: float = 1.0):
    """Polar quad mesh of the annulus ``r0 < r < r1``: ``nr`` radial by ``nt`` angular cells."""
    r = np.linspace(r0, r1, nr + 1)
    t = np.linspace(0, 2 * np.pi, nt, endpoint=False)
    R, T = np.meshgrid(r, t, indexing="ij")
    pts = np.stack([R * np.cos(T), R * np.sin(T)], -1).reshape(-1, 2)
    idx = np.arange((nr + 1) * nt).reshape(nr + 1, nt)
    nxt = np.roll(idx, -1, axis=1)
    q = np.stack([idx[:-1], idx[1:], nxt[1:], nxt[:-1]], -1).reshape(-1, 4)
    return pts, [("quad", q)]


def cube_sphere(n: int, radius: float = 1.0):
    """Quad surface mesh of a sphere: each cube face an ``n x n`` grid projected radially."""
    g = np.linspace(-1, 1, n + 1)
    A, B = np.meshgrid(g, g, indexing="ij")
    faces_pts, quads, offset = [], [], 0
    idx = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    q = np.stack([idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]], -1).reshape(-1, 4)
    one = np.ones_like(A)
    for axis in range(3):
        for sign in (-1, 1):
            cols = [A, B]
            cols.insert(axis, sign * one)
            p = np.stack(cols, -1).reshape(-1, 3)
            faces_pts.append(p)
            quads.append(q + offset if sign > 0 else q[:, ::-1] + offset)
            offset += len(p)
    pts = np.concatenate(faces_pts)
    # Merge the duplicated nodes on cube edges so the surface is closed.
    uniq, inv = np.unique(np.round(pts, 12), axis=0, return_inverse=True)
    uniq = uniq / np.linalg.norm(uniq, axis=1, keepdims=True) * radius
    return uniq, [("quad", inv.ravel()[np.concatenate(quads)])]
