"""Duplicated and overlapping cells: checks that every read runs, in O(N log N).

A cell listed twice, or a node pushed across its neighbours, gives every cell a
valid (positive) measure but a wrong total: the per-cell checks in
:mod:`meshops.mesh.quadrature` cannot see it. Two mesh-level rules can, both by
sorting:

* **No duplicated cells.** Two cells of one type with the same vertex set (in
  any order) are refused, in every dimension.
* **Shared facets separate their cells.** For cells that fill their space
  (lines in 1-D; triangles and quads in 2-D; tetrahedra, hexahedra, wedges and
  pyramids in 3-D, mixed freely), each facet (point, edge or face) is shared by
  at most 2 cells, and 2 cells that share one lie on opposite sides of it. A
  cell that is inverted relative to its neighbour (a node pushed across them)
  lies on the same side as that neighbour. The rule does not look at the node
  order, so both orientations and a mesh with some cells listed in reversed
  order pass as long as nothing overlaps.

Not detected: overlapping cells that share no facet (e.g. two copies of a mesh
with separate nodes, or a cell folded over a non-adjacent part of the mesh) and
non-conforming meshes (hanging nodes: such facets count as boundary). Surfaces
and curves embedded in a higher dimension are checked for duplicated cells only:
a side of an edge of a surface in 3-D is not defined, and an edge shared by more
than two triangles is legitimate there (surfaces that meet).
"""

from __future__ import annotations

import numpy as np

from meshops.errors import MeshError

# Facets of the non-simplex cell types in local node numbers (VTK order). Quad faces
# are listed cyclically, so that a face normal can be computed from them.
FACETS = {
    "quad": [(0, 1), (1, 2), (2, 3), (3, 0)],
    "hexahedron": [(0, 3, 2, 1), (4, 5, 6, 7), (0, 1, 5, 4), (1, 2, 6, 5), (2, 3, 7, 6),
                   (3, 0, 4, 7)],
    "wedge": [(0, 1, 2), (3, 4, 5), (0, 1, 4, 3), (1, 2, 5, 4), (2, 0, 3, 5)],
    "pyramid": [(0, 1, 2, 3), (0, 1, 4), (1, 2, 4), (2, 3, 4), (3, 0, 4)],
}
# Simplices: facets as increasing local node tuples (see check_facets).
SIMPLEX_FACETS = {
    "line": [(0,), (1,)],
    "triangle": [(0, 1), (0, 2), (1, 2)],
    "tetra": [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)],
}
_FACET_NAME = {1: "point", 2: "edge", 3: "face", 4: "face"}
# A cell counts as lying on a side of a facet when the cosine between the facet's
# normal and the direction to the cell's centroid exceeds this (noise level for
# valid cells, which the degeneracy check keeps away from 0).
_SIDE_COS = 1e-8


def _row_keys(rows: np.ndarray, num_points: int) -> list[np.ndarray]:
    """``rows [F, s]`` of vertex ids packed into as few int64 keys as fit: rows are
    equal iff their keys are, and sorting by keys sorts the rows."""
    per_key = max(1, int(62 // max(np.log2(max(num_points, 2)), 1.0)))
    keys = []
    for j0 in range(0, rows.shape[1], per_key):
        key = rows[:, j0].astype(np.int64)
        for j in range(j0 + 1, min(j0 + per_key, rows.shape[1])):
            key = key * num_points + rows[:, j]
        keys.append(key)
    return keys


def _equal_runs(rows: np.ndarray, num_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort ``rows`` and mark which sorted row equals the next: ``(order, same [F-1])``."""
    keys = _row_keys(rows, num_points)
    order = (np.argsort(keys[0], kind="stable") if len(keys) == 1
             else np.lexsort(keys[::-1]))
    same = np.ones(max(len(rows) - 1, 0), bool)
    for key in keys:
        k = key[order]
        same &= k[1:] == k[:-1]
    return order, same


class _Cells:
    """The cells of one dimension of a mesh, numbered globally across blocks."""

    def __init__(self, blocks: list[tuple[int, str, np.ndarray]]):
        self.blocks = blocks
        self.starts = np.cumsum([0] + [len(c) for _, _, c in blocks])

    def name(self, g: int) -> str:
        i = int(np.searchsorted(self.starts, g, side="right") - 1)
        b, ctype, conn = self.blocks[i]
        m = g - int(self.starts[i])
        return f"{ctype} cell {m} (block {b}) with vertices {conn[m].tolist()}"


def first_duplicate(cells: np.ndarray, num_points: int) -> tuple[int, int, int] | None:
    """The first cell of ``cells [M, n]`` (vertex ids) whose vertex set repeats an
    earlier one's: ``(earlier, later, number of repeats)``, or ``None``."""
    if len(cells) < 2:
        return None
    order, same = _equal_runs(np.sort(cells, axis=1), num_points)
    if not same.any():
        return None
    # Name the first repeat in file order (a stable sort keeps copies in order).
    later = np.flatnonzero(same)
    i = int(later[np.argmin(order[later + 1])])
    return int(order[i]), int(order[i + 1]), int(same.sum())


def check_duplicate_cells(blocks: list[tuple[int, str, np.ndarray]], num_points: int,
                          source: str) -> None:
    """Refuse two cells of one type with the same vertex set.

    Args:
        blocks: ``(block index, cell type, connectivity [M, n])`` of the checked cells.
    """
    by_type: dict[str, list[tuple[int, str, np.ndarray]]] = {}
    for item in blocks:
        by_type.setdefault(item[1], []).append(item)
    for group in by_type.values():
        dup = first_duplicate(np.concatenate([c for _, _, c in group]), num_points)
        if dup is not None:
            cells = _Cells(group)
            a, b, n = dup
            raise MeshError(
                f"{source}: {cells.name(b)} duplicates {cells.name(a)} (same vertices; "
                f"{n} duplicated cells in all); remove the repeated cells")


def _same_side(points: np.ndarray, facets: np.ndarray, g1: np.ndarray,
               g2: np.ndarray) -> np.ndarray:
    """Whether centroids ``g1`` and ``g2 [P, d]`` lie strictly on one side of their
    shared facet ``facets [P, s]`` (as one of the two cells lists it, so that one
    normal serves both)."""
    d = points.shape[1]
    x0 = points[facets[:, 0]]
    if d == 1:
        normal = np.ones((len(facets), 1))
    elif d == 2:
        e = points[facets[:, 1]] - x0
        normal = np.stack([-e[:, 1], e[:, 0]], axis=1)
    elif facets.shape[1] == 3:
        normal = np.cross(points[facets[:, 1]] - x0, points[facets[:, 2]] - x0)
    else:  # a possibly non-planar quad face: the normal of its diagonals, through
        # its centre
        x1, x2, x3 = (points[facets[:, j]] for j in (1, 2, 3))
        normal = np.cross(x2 - x0, x3 - x1)
        x0 = (x0 + x1 + x2 + x3) / 4
    r1, r2 = g1 - x0, g2 - x0
    dot1 = np.einsum("pd,pd->p", normal, r1)
    dot2 = np.einsum("pd,pd->p", normal, r2)
    # Strictly: both cosines between the normal and the direction to the centroid
    # above noise level, with the same sign.
    nn = np.einsum("pd,pd->p", normal, normal) * _SIDE_COS ** 2
    strict1 = dot1 ** 2 > nn * np.einsum("pd,pd->p", r1, r1)
    strict2 = dot2 ** 2 > nn * np.einsum("pd,pd->p", r2, r2)
    return strict1 & strict2 & ((dot1 > 0) == (dot2 > 0))


def _facets_by_size(blocks: list, cells: "_Cells", sorted_conn: list, lo: int, hi: int):
    """The cells' facets whose smallest vertex id is in ``[lo, hi)``, by vertex count:
    ``{count: [(facets as listed, their sorted vertex ids (the key), their cells), ...]}``;
    ``sorted_conn``: each block's connectivity with every cell's vertex ids sorted
    (simplex blocks; ``None`` for the others)."""
    # Facets by vertex count; triangle faces of tetrahedra, wedges and pyramids
    # (and quad faces of hexahedra, wedges and pyramids) meet each other.
    # Each facet as listed, with its vertex ids sorted (the key), and its cell.
    by_size: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for (_, ctype, conn), start, sc in zip(blocks, cells.starts, sorted_conn):
        if not len(conn):
            continue
        ids = start + np.arange(len(conn))
        if ctype in SIMPLEX_FACETS:
            # Facets of a cell with sorted vertices, taken in increasing local order,
            # are sorted: one sort per cell instead of one per facet.
            for local in SIMPLEX_FACETS[ctype]:
                here = (sc[:, local[0]] >= lo) & (sc[:, local[0]] < hi)
                f = sc[here][:, list(local)]
                by_size.setdefault(len(local), []).append((f, f, ids[here]))
            continue
        for local in FACETS[ctype]:  # quad faces stay cyclic, for their normal
            f = conn[:, list(local)]
            key = np.sort(f, axis=1)
            # A collapsed side (a quad or hex with a repeated node, as at the trailing
            # edge of a C-grid) has no side to be on: leave it out.
            real = (key[:, 1:] != key[:, :-1]).all(axis=1) & (key[:, 0] >= lo) & (key[:, 0] < hi)
            by_size.setdefault(len(local), []).append((f[real], key[real], ids[real]))
    return by_size


#: Facets compared in one pass of :func:`check_facets` (about): equal facets share their
#: smallest vertex, so the facets are checked range of smallest vertex by range, in a
#: memory bounded by a pass (about 200 bytes a facet) rather than by the mesh.
FACETS_PER_PASS = 4_000_000


def _vertex_ranges(blocks: list, num_points: int) -> list[tuple[int, int]]:
    """Ranges ``[lo, hi)`` of vertex ids that are the smallest vertex of about
    :data:`FACETS_PER_PASS` facets each, covering all the vertices."""
    counts = np.zeros(num_points, np.int64)
    for _, ctype, conn in blocks:
        for local in (SIMPLEX_FACETS.get(ctype) or FACETS[ctype]) if len(conn) else ():
            counts += np.bincount(conn[:, list(local)].min(axis=1), minlength=num_points)
    total = int(counts.sum())
    passes = max(1, -(-total // FACETS_PER_PASS))
    cuts = np.searchsorted(np.cumsum(counts), np.arange(1, passes) * total / passes) + 1
    edges = [0] + sorted(set(int(c) for c in cuts if 0 < c < num_points)) + [num_points]
    return list(zip(edges[:-1], edges[1:]))


def check_facets(points: np.ndarray, blocks: list[tuple[int, str, np.ndarray]],
                 source: str) -> None:
    """Refuse facets shared by more than 2 cells, or by 2 cells on one side of it.

    Only for cells whose dimension is the space's (see the module docstring).

    Args:
        points: ``[N, d]`` coordinates.
        blocks: ``(block index, cell type, connectivity [M, n])`` of the cells, all of
            dimension ``d``.
    """
    cells = _Cells(blocks)
    centroid = np.concatenate([points[conn].mean(axis=1) if len(conn) else points[:0]
                               for _, _, conn in blocks])
    sorted_conn = [np.sort(conn, axis=1) if ctype in SIMPLEX_FACETS else None
                   for _, ctype, conn in blocks]
    ranges = _vertex_ranges(blocks, len(points))
    for lo, hi in ranges:
        by_size = _facets_by_size(blocks, cells, sorted_conn, lo, hi)
        _check_facet_pass(points, by_size, cells, centroid, source, len(ranges) > 1)


def _check_facet_pass(points: np.ndarray, by_size: dict, cells: "_Cells",
                      centroid: np.ndarray, source: str, partial: bool) -> None:
    """:func:`check_facets` on the facets of one pass (``partial``: one of several, so
    the count of faulty facets in a message is a lower bound)."""
    for s, parts in by_size.items():
        facets = np.concatenate([p[0] for p in parts])
        owner = np.concatenate([p[2] for p in parts])
        order, same = _equal_runs(np.concatenate([p[1] for p in parts]), len(points))
        if not same.any():
            continue
        name = _FACET_NAME[s]
        triple = same[1:] & same[:-1]
        if triple.any():
            i = int(np.flatnonzero(triple)[0])
            users = ", ".join(cells.name(int(owner[order[t]])) for t in (i, i + 1, i + 2))
            raise MeshError(
                f"{source}: {name} {facets[order[i]].tolist()} is shared by more than 2 "
                f"cells ({users}): the cells overlap")
        pair = np.flatnonzero(same)
        o1, o2 = owner[order[pair]], owner[order[pair + 1]]
        bad = _same_side(points, facets[order[pair]], centroid[o1], centroid[o2])
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            c1, c2 = sorted((int(o1[k]), int(o2[k])))
            raise MeshError(
                f"{source}: {cells.name(c2)} overlaps {cells.name(c1)}: both lie on the same "
                f"side of their shared {name} {facets[order[pair[k]]].tolist()} (an inverted "
                f"cell, e.g. a node moved across its neighbours; "
                f"{'at least ' if partial else ''}{int(bad.sum())} such {name}s)")
