"""Nodal quadrature weights of meshes: ``w_i = integral of vertex i's basis function``.

The weights are the row sums of the consistent mass matrix of the linear
(simplex) or multilinear (quad, hexahedron, wedge, pyramid) Lagrange element. For
an isoparametric element the geometry is interpolated with the same basis, so the
interpolant of a linear field is the field itself and ``sum_i w_i f(x_i)``
integrates every linear ``f`` exactly, on distorted quads and hexes too. On
simplices this reduces to an even split of each cell's measure over its vertices;
on distorted quads it does not, which is why the even split is not used there.

Each reference element is parameterised on the unit cube ``[0, 1]^k`` (wedges
and pyramids through collapsed, Duffy-type coordinates), so one tensor
Gauss-Legendre rule integrates ``N_i |det J|`` for every type. On planar/volume
cells that integrand is a polynomial of degree at most 3 per coordinate, which the
3-point rule (exact to degree 5) integrates exactly.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch

from meshops.errors import MeshError
from meshops.mesh._overlap import check_duplicate_cells, check_facets

# Topological dimension of each supported meshio cell type.
CELL_DIMS = {
    "vertex": 0, "line": 1, "triangle": 2, "quad": 2,
    "tetra": 3, "hexahedron": 3, "wedge": 3, "pyramid": 3,
}
_NODES = {"vertex": 1, "line": 2, "triangle": 3, "quad": 4,
          "tetra": 4, "hexahedron": 8, "wedge": 6, "pyramid": 5}
_SIMPLICES = ("line", "triangle", "tetra")
# Cells per chunk in the vectorised element loop: bounds memory at about
# chunk * 27 quadrature points * 8 nodes * 8 bytes (~90 MB for hexahedra).
_CHUNK = 50_000
# Relative tolerance for zero measure / a vanishing Jacobian, against h^k with h
# the longest edge of the cell.
_DEGENERATE_RTOL = 1e-10

CellsLike = Sequence[tuple[str, "np.ndarray | torch.Tensor"]] | Mapping[str, "np.ndarray"]


def gauss_cube(k: int, n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Tensor Gauss-Legendre rule on ``[0, 1]^k``: points ``[Q, k]`` and weights ``[Q]``."""
    x, w = np.polynomial.legendre.leggauss(n)
    x, w = (x + 1) / 2, w / 2
    grids = np.meshgrid(*([x] * k), indexing="ij")
    wgrids = np.meshgrid(*([w] * k), indexing="ij")
    pts = np.stack([g.ravel() for g in grids], axis=1)
    wts = np.prod(np.stack([g.ravel() for g in wgrids], axis=1), axis=1)
    return pts, wts


def cube_corners(k: int) -> np.ndarray:
    """The ``2^k`` corners ``[2^k, k]`` of the unit cube ``[0, 1]^k`` (C order)."""
    return np.array(np.meshgrid(*([[0.0, 1.0]] * k), indexing="ij")).reshape(k, -1).T


def _extruded(N2: np.ndarray, dNa: np.ndarray, dNb: np.ndarray, c: np.ndarray):
    """A base cell's basis ``N2 [P, n]`` (derivatives ``dNa``, ``dNb``) times the linear
    one in the height ``c``: the ``2n`` nodes of the bottom, then the top face, and the
    derivatives ``[P, 2n, 3]`` along (a, b, c)."""
    lo, hi = (1 - c)[:, None], c[:, None]
    N = np.concatenate([N2 * lo, N2 * hi], axis=1)
    dN = np.stack([
        np.concatenate([dNa * lo, dNa * hi], axis=1),
        np.concatenate([dNb * lo, dNb * hi], axis=1),
        np.concatenate([-N2, N2], axis=1),
    ], axis=2)
    return N, dN


def _bilinear(a, b):
    """Bilinear basis on the unit square in VTK node order (0,0) (1,0) (1,1) (0,1)."""
    N = np.stack([(1 - a) * (1 - b), a * (1 - b), a * b, (1 - a) * b], axis=1)
    dNa = np.stack([-(1 - b), (1 - b), b, -b], axis=1)
    dNb = np.stack([-(1 - a), -a, a, (1 - a)], axis=1)
    return N, dNa, dNb


def cell_basis(cell_type: str, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Basis values ``[Q, n]`` and cube-coordinate derivatives ``[Q, n, k]`` at ``p [Q, k]``.

    Node orders follow VTK/meshio.
    """
    if cell_type == "quad":
        N, dNa, dNb = _bilinear(p[:, 0], p[:, 1])
        return N, np.stack([dNa, dNb], axis=2)
    if cell_type == "hexahedron":
        a, b, c = p.T
        return _extruded(*_bilinear(a, b), c)
    if cell_type == "wedge":
        # Triangle (r, s) = (a, b(1-a)) collapses the edge a = 1; prism height c.
        a, b, c = p.T
        lam = np.stack([(1 - a) * (1 - b), a, b * (1 - a)], axis=1)
        dla = np.stack([-(1 - b), np.ones_like(a), -b], axis=1)
        dlb = np.stack([-(1 - a), np.zeros_like(a), (1 - a)], axis=1)
        return _extruded(lam, dla, dlb, c)
    if cell_type == "pyramid":
        # Collapsed hexahedron: base bilinear in (a, b) shrinks to the apex as c -> 1.
        # In these coordinates the standard (rational) pyramid basis is polynomial.
        a, b, c = p.T
        Nq, dNa, dNb = _bilinear(a, b)
        lo = (1 - c)[:, None]
        N = np.concatenate([Nq * lo, c[:, None]], axis=1)
        z = np.zeros_like(a)[:, None]
        dN = np.stack([
            np.concatenate([dNa * lo, z], axis=1),
            np.concatenate([dNb * lo, z], axis=1),
            np.concatenate([-Nq, np.ones_like(z)], axis=1),
        ], axis=2)
        return N, dN
    raise AssertionError(cell_type)


def _as_blocks(cells: CellsLike) -> list[tuple[str, np.ndarray]]:
    if isinstance(cells, Mapping):
        items: Iterable = cells.items()
    else:
        items = cells
    blocks = []
    for item in items:
        if hasattr(item, "type") and hasattr(item, "data"):  # meshio.CellBlock
            ctype, conn = item.type, item.data
        else:
            ctype, conn = item
        if isinstance(conn, torch.Tensor):
            conn = conn.detach().cpu().numpy()
        blocks.append((str(ctype), np.asarray(conn)))
    return blocks


def check_points(points: np.ndarray, source: str = "points") -> None:
    """Raise :class:`MeshError` naming the first point with a NaN or infinite coordinate."""
    bad = ~np.isfinite(points).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise MeshError(
            f"{source}: point {i} has a non-finite coordinate {points[i].tolist()} "
            f"({int(bad.sum())} such points)")


def check_cells(blocks: list[tuple[str, np.ndarray]], num_points: int,
                source: str = "mesh") -> None:
    """Validate cell types, connectivity shapes and vertex indices."""
    for b, (ctype, conn) in enumerate(blocks):
        if ctype not in CELL_DIMS:
            raise MeshError(
                f"{source}: unsupported cell type {ctype!r} in cell block {b} "
                f"(supported: {', '.join(CELL_DIMS)})")
        if conn.ndim != 2 or conn.shape[1] != _NODES[ctype]:
            raise MeshError(
                f"{source}: cell block {b} ({ctype}) has connectivity of shape "
                f"{tuple(conn.shape)}, expected [M, {_NODES[ctype]}]")
        if not np.issubdtype(conn.dtype, np.integer):
            raise MeshError(f"{source}: cell block {b} ({ctype}) has non-integer vertex "
                            f"indices of dtype {conn.dtype}")
        if conn.size:
            bad = ((conn < 0) | (conn >= num_points)).any(axis=1)
            if bad.any():
                m = int(np.flatnonzero(bad)[0])
                raise MeshError(
                    f"{source}: {ctype} cell {m} (block {b}) has vertex index out of range "
                    f"{conn[m].tolist()}; the mesh has {num_points} points")


def top_dimension(blocks: list[tuple[str, np.ndarray]]) -> int:
    """Highest topological dimension among non-empty cell blocks (0 if none)."""
    return max((CELL_DIMS[t] for t, c in blocks if len(c)), default=0)


def _det(A: np.ndarray) -> np.ndarray:
    """Determinants of ``[..., k, k]`` matrices; closed form for k <= 3, where batched
    LAPACK calls on millions of tiny matrices dominate the cost."""
    k = A.shape[-1]
    if k == 1:
        return A[..., 0, 0]
    if k == 2:
        return A[..., 0, 0] * A[..., 1, 1] - A[..., 0, 1] * A[..., 1, 0]
    if k == 3:
        return (A[..., 0, 0] * (A[..., 1, 1] * A[..., 2, 2] - A[..., 1, 2] * A[..., 2, 1])
                - A[..., 0, 1] * (A[..., 1, 0] * A[..., 2, 2] - A[..., 1, 2] * A[..., 2, 0])
                + A[..., 0, 2] * (A[..., 1, 0] * A[..., 2, 1] - A[..., 1, 1] * A[..., 2, 0]))
    return np.linalg.det(A)


def _jacobian_measure(J: np.ndarray) -> np.ndarray:
    """Measure density ``sqrt(det(J^T J))`` for ``J [..., d, k]``; ``|det J|`` when ``k == d``."""
    d, k = J.shape[-2:]
    if k == d:
        return np.abs(_det(J))
    return np.sqrt(np.clip(_det(np.swapaxes(J, -1, -2) @ J), 0.0, None))


def _signed_density(J: np.ndarray, normal: np.ndarray | None) -> np.ndarray | None:
    """Signed Jacobian used to detect tangling; ``None`` where orientation is undefined."""
    d, k = J.shape[-2:]
    if k == d:
        return _det(J)
    if k == d - 1 and normal is not None:
        # Orientation relative to the cell's centre normal: a folded surface cell
        # flips sign somewhere.
        full = np.concatenate([J, np.broadcast_to(normal[:, None, :, None],
                                                  J.shape[:-1] + (1,))], axis=-1)
        return _det(full)
    return None


def _longest_edge(x: np.ndarray) -> np.ndarray:
    """``[M]`` largest vertex-to-vertex distance of cells ``x [M, n, d]`` (scale for tolerances)."""
    diff = x[:, :, None, :] - x[:, None, :, :]
    return np.sqrt((diff ** 2).sum(-1)).reshape(len(x), -1).max(axis=1)


def _simplex_weights(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-cell measure ``[M]`` and per-vertex weights ``[M, k+1]`` of simplices
    ``x [M, k+1, d]``."""
    k = x.shape[1] - 1
    J = np.swapaxes(x[:, 1:] - x[:, :1], 1, 2)  # [M, d, k]
    vol = _jacobian_measure(J) / math.factorial(k)
    return vol, np.repeat(vol[:, None] / (k + 1), k + 1, axis=1)


def _tensor_weights(ctype: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per-cell measure, per-vertex weights and (min, max) signed Jacobians for non-simplices."""
    k = CELL_DIMS[ctype]
    qp, qw = gauss_cube(k, 3)
    N, dN = cell_basis(ctype, qp)
    J = np.einsum("mnd,qnk->mqdk", x, dN)  # [M, Q, d, k]
    dens = _jacobian_measure(J)  # [M, Q]
    w_node = np.einsum("mq,q,qn->mn", dens, qw, N)
    vol = w_node.sum(axis=1)
    # Orientation checked at quadrature points and at the cube corners, where a
    # non-convex quad first turns its Jacobian negative.
    cp = cube_corners(k)
    _, dNc = cell_basis(ctype, cp)
    Jall = np.concatenate([J, np.einsum("mnd,qnk->mqdk", x, dNc)], axis=1)
    normal = None
    if k == x.shape[2] - 1 == 2:
        # Reference normal of an embedded surface cell: the largest area element
        # (the centre's can vanish, e.g. on a bow-tie).
        nq = np.cross(J[..., 0], J[..., 1])  # [M, Q, 3]
        best = np.linalg.norm(nq, axis=2).argmax(axis=1)
        normal = nq[np.arange(len(x)), best]
    signed = _signed_density(Jall, normal)
    return vol, w_node, signed


def cell_weights(points: np.ndarray, cell_type: str, conn: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Measures and per-vertex integrals of the basis functions of one cell block.

    The rows of the element mass matrices summed per cell: ``node[m, j] =
    integral over cell m of phi_j`` (its j-th vertex's basis function), so that
    ``node.sum(1)`` is the cell's measure and ``node @ x / measure`` its centroid
    (the geometry is interpolated with the same basis). No validity checks: call it
    on cells :func:`quadrature_weights` has accepted.

    Args:
        points: ``[N, d]`` float64 coordinates.
        cell_type: A meshio cell type of :data:`CELL_DIMS` other than ``vertex``.
        conn: ``[M, n]`` vertex indices.

    Returns:
        ``(measure [M], node [M, n])``, float64.
    """
    if not len(conn):
        n = _NODES[cell_type]
        return np.zeros(0), np.zeros((0, n))
    measures, nodes = [], []
    for start in range(0, len(conn), _CHUNK):
        x = points[conn[start:start + _CHUNK]]
        vol, w_node = (_simplex_weights(x) if cell_type in _SIMPLICES
                       else _tensor_weights(cell_type, x)[:2])
        measures.append(vol)
        nodes.append(w_node)
    return np.concatenate(measures), np.concatenate(nodes)


def _nodal_weights(pts: np.ndarray, blocks: list, tdim: int, check: bool,
                   source: str) -> np.ndarray:
    """``[N]``: every ``tdim``-D cell's measure shared among its nodes, chunk by chunk;
    with ``check``, each chunk's cells checked (degenerate or inverted)."""
    weight = np.zeros(len(pts))
    for b, (ctype, conn) in enumerate(blocks):
        if CELL_DIMS[ctype] != tdim:
            continue
        for start in range(0, len(conn), _CHUNK):
            c = conn[start:start + _CHUNK]
            x = pts[c]  # [M, n, d]
            if ctype in _SIMPLICES:
                vol, w_node = _simplex_weights(x)
                signed = None
            else:
                vol, w_node, signed = _tensor_weights(ctype, x)
            if check:
                _check_cells_valid(ctype, b, start, c, x, vol, signed, source)
            np.add.at(weight, c.ravel(), w_node.ravel())
    return weight


def quadrature_weights(points, cells: CellsLike, *, source: str = "mesh",
                       check: bool = True) -> torch.Tensor:
    """Nodal quadrature weights ``w_i = integral of phi_i`` of a mesh.

    Weights come from the cells of the highest topological dimension present
    (e.g. the triangles of a 2-D Gmsh mesh, not its boundary lines); points that no
    such cell uses get weight 0. Surfaces and curves embedded in a higher-dimensional
    space get true areas/lengths, not projected ones.

    Args:
        points: Vertex coordinates ``[N, d]`` (array or tensor), ``d`` in 1..3.
        cells: Cell blocks: a list of ``(cell_type, connectivity [M, k])`` pairs, a
            ``{cell_type: connectivity}`` mapping or meshio ``CellBlock`` objects.
            Types: line, triangle, quad, tetra, hexahedron, wedge, pyramid (VTK node
            order), mixed in any combination; vertex cells are accepted and ignored.
        source: Name used in error messages (usually the file name).
        check: Reject degenerate (zero-measure) and tangled cells, duplicated
            cells and overlapping cells (see :mod:`meshops.mesh._overlap`: facets shared
            by more than two cells or by two cells on the same side of it). Either
            node orientation (clockwise or counter-clockwise) is accepted, also
            mixed within a mesh as long as no cells overlap.

    Returns:
        ``weight [N]`` float64 tensor with ``weight.sum()`` = measure of the mesh.

    Raises:
        MeshError: non-finite coordinates, unsupported cell types, vertex indices out
            of range, zero-measure cells, cells whose Jacobian changes sign,
            duplicated cells and overlapping cells (the message names the first
            offending cell).

    Shapes:
        points ``[N, d]`` -> ``[N]``
    """
    pts = points.detach().cpu().numpy() if isinstance(points, torch.Tensor) else np.asarray(points)
    pts = np.asarray(pts, dtype=np.float64)
    if pts.ndim != 2 or not 1 <= pts.shape[1] <= 3:
        raise MeshError(f"{source}: points must have shape [N, d] with d in 1..3, "
                        f"got {tuple(pts.shape)}")
    check_points(pts, source)
    blocks = _as_blocks(cells)
    check_cells(blocks, len(pts), source)
    tdim = top_dimension(blocks)
    if tdim == 0:
        raise MeshError(f"{source}: no line, surface or volume cells to integrate over")
    if tdim > pts.shape[1]:
        raise MeshError(f"{source}: {tdim}-D cells in a {pts.shape[1]}-D point set")
    weight = _nodal_weights(pts, blocks, tdim, check, source)
    if check:
        top = [(b, t, c) for b, (t, c) in enumerate(blocks) if CELL_DIMS[t] == tdim]
        check_duplicate_cells(top, len(pts), source)
        if tdim == pts.shape[1]:
            check_facets(pts, top, source)
    return torch.from_numpy(weight)


def _check_cells_valid(ctype, b, start, conn, x, vol, signed, source) -> None:
    k = CELL_DIMS[ctype]
    h = _longest_edge(x)
    tol = _DEGENERATE_RTOL * np.maximum(h, np.finfo(float).tiny) ** k
    degenerate = ~(vol > tol)
    if degenerate.any():
        m = int(np.flatnonzero(degenerate)[0])
        raise MeshError(
            f"{source}: {ctype} cell {start + m} (block {b}) with vertices "
            f"{conn[m].tolist()} has zero measure ({vol[m]:.3g}); "
            f"{int(degenerate.sum())} degenerate cells in this block")
    if signed is not None:
        t = tol[:, None]
        tangled = ((signed < -t).any(axis=1) & (signed > t).any(axis=1))
        if tangled.any():
            m = int(np.flatnonzero(tangled)[0])
            raise MeshError(
                f"{source}: {ctype} cell {start + m} (block {b}) with vertices "
                f"{conn[m].tolist()} is tangled: its Jacobian changes sign inside the "
                "cell (a non-convex or self-intersecting cell, or nodes in the wrong order)")


def check_weight_range(weight, source: str = "mesh",
                       dtype: torch.dtype = torch.float32) -> None:
    """Refuse weights that ``dtype`` (the models' float32 by default) cannot hold.

    Weights are computed in float64, but models and training samples use float32,
    where the weights of a mesh with coordinates near 1e30 overflow to ``inf``
    (cells of area 1e60) and those near 1e-30 underflow to 0, with NaN or a
    failed fit as the visible result. A mesh in such units must be rescaled.

    Raises:
        MeshError: naming ``source``, when a positive weight or the total measure
            lies outside ``dtype``'s normal range.
    """
    w = weight.detach().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
    info = torch.finfo(dtype)
    pos = w[w > 0]
    if not len(pos):
        return
    lo, hi, total = float(pos.min()), float(pos.max()), float(pos.sum())
    if hi > info.max or total > info.max:
        raise MeshError(
            f"{source}: quadrature weights up to {hi:.3g} (total measure {total:.3g}) "
            f"overflow {str(dtype).removeprefix('torch.')} (largest {info.max:.3g}); "
            "rescale the coordinates (e.g. to other units)")
    if lo < info.tiny:
        raise MeshError(
            f"{source}: quadrature weights down to {lo:.3g} underflow "
            f"{str(dtype).removeprefix('torch.')} (smallest normal {info.tiny:.3g}); "
            "rescale the coordinates (e.g. to other units)")


def structured_grid_cells(shape: tuple[int, ...]) -> np.ndarray:
    """Quad (2-D) or hexahedron (3-D) connectivity of a structured grid.

    Nodes are numbered in C order of ``shape`` (as ``X.ravel()`` for an array
    ``X`` of that shape). Node order within a cell is counter-clockwise in index
    space, so a right-handed grid gives positive Jacobians (either is accepted).

    Shapes:
        ``(n0, n1)`` -> ``[(n0-1)(n1-1), 4]``; ``(n0, n1, n2)`` -> ``[..., 8]``
    """
    idx = np.arange(int(np.prod(shape))).reshape(shape)
    if len(shape) == 2:
        return np.stack([idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]],
                        axis=-1).reshape(-1, 4)
    if len(shape) == 3:
        q = [idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]]
        bottom = [a[:, :, :-1] for a in q]
        top = [a[:, :, 1:] for a in q]
        return np.stack(bottom + top, axis=-1).reshape(-1, 8)
    raise MeshError(f"structured grids must be 2-D or 3-D, got shape {shape}")


def grid_weights(*coords, source: str = "structured grid") -> torch.Tensor:
    """Quadrature weights of a structured (curvilinear) grid, from its quads/hexes.

    Args:
        *coords: Coordinate arrays of equal shape ``(n0, n1)`` (``X, Y``) or
            ``(n0, n1, n2)`` (``X, Y, Z``), e.g. the 221x51 NACA C-grid.

    Returns:
        ``weight [n0*n1(*n2)]`` in C order of the grid.
    """
    arrays = [c.detach().cpu().numpy() if isinstance(c, torch.Tensor) else np.asarray(c)
              for c in coords]
    shape = arrays[0].shape
    if any(a.shape != shape for a in arrays) or len(arrays) != len(shape):
        raise MeshError(f"{source}: need {len(shape)} coordinate arrays of one shape, got "
                        f"{[a.shape for a in arrays]}")
    pts = np.stack([a.ravel() for a in arrays], axis=1).astype(np.float64)
    return quadrature_weights(pts, [("quad" if len(shape) == 2 else "hexahedron",
                                     structured_grid_cells(shape))], source=source)
