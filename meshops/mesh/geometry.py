"""Geometry features of a mesh: where each point is relative to the domain's boundary.

A family of geometries (a plate with a hole that moves, flow past a body that changes
shape) gives a model the geometry only through the positions of the points; a field
whose values live near a boundary (a boundary layer, a stress concentration, a cooled
hole) then has to be located from the point density. The distance of each point to the
boundary of the meshed domain, and the direction to it, tell the model directly, as the
signed distance to the body does in the peers' airfoil and car benchmarks. They are
computed from the mesh itself (its cells), so any mesh file has them:

* the boundary: the facets of the top-dimensional cells that belong to one cell only
  (edges of a 2-D mesh, triangles and quads of a 3-D one; a quad is split into two
  triangles for the distance). Facets are matched by position, not node number: nodes
  closer than :data:`MERGE_TOLERANCE` of the shortest cell edge are one, so the seam
  of blocks meshed apart and glued (duplicated nodes, a common export) is inside the
  domain. A crack meshed as two coincident faces is therefore inside too: mesh it
  with a gap to make it boundary;
* ``geo:distance [N]``: the Euclidean distance of each point to the nearest boundary
  facet (0 on the boundary);
* ``geo:direction [N, d]``: the unit vector from the point to that nearest boundary
  point (0 on the boundary).

Both are properties of the domain, not of its mesh: on a finer mesh of the same domain
they converge to the same functions (exactly for straight-sided boundaries), so a model
reading them stays discretisation-consistent.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from meshops.errors import MeshError

__all__ = ["GEOMETRY_FIELDS", "GEOMETRY_PREFIX", "boundary_facets", "geometry_channels"]

#: The prefix of the geometry channels and their names, in order.
GEOMETRY_PREFIX = "geo:"
GEOMETRY_FIELDS = ("geo:distance", "geo:direction")


#: Nodes closer than this fraction of the mesh's shortest cell edge are one node when
#: the boundary is found: a glued seam's duplicates (their coordinates written to 8
#: digits or so), never two nodes of a valid mesh.
MERGE_TOLERANCE = 1e-4


def _blocks(mesh) -> list[tuple[str, np.ndarray]]:
    return [(ctype, np.asarray(conn.cpu() if isinstance(conn, torch.Tensor) else conn,
                               dtype=np.int64))
            for ctype, conn in (getattr(mesh, "cells", None) or [])]


def boundary_facets(pos: np.ndarray, blocks: Sequence[tuple[str, np.ndarray]]) -> np.ndarray:
    """The boundary facets of a mesh as simplices: ``[F, d]`` vertex rows (segments in
    2-D, triangles in 3-D; quads split in two), the facets of its top-dimensional cells
    that bound one cell only.

    Raises:
        MeshError: No cells of the mesh's dimension, or no boundary facet (a closed
            surface).
    """
    from meshops.mesh._overlap import FACETS, SIMPLEX_FACETS
    from meshops.mesh.quadrature import CELL_DIMS

    d = pos.shape[1]
    rows: list[np.ndarray] = []
    for ctype, conn in blocks:
        if CELL_DIMS.get(ctype, -1) != d:
            continue
        for f in SIMPLEX_FACETS.get(ctype) or FACETS[ctype]:
            rows.append(np.sort(conn[:, list(f)], axis=1) if len(f) == d
                        else conn[:, list(f)])
    if not rows:
        raise MeshError(f"no {d}-D cells: the boundary of a mesh is found from its cells "
                        f"(a point cloud has none)")
    by_size: dict[int, list] = {}
    for r in rows:
        by_size.setdefault(r.shape[1], []).append(r)
    same = _coincident(pos, [conn for ctype, conn in blocks if CELL_DIMS.get(ctype, -1) == d])
    out = []
    for size, group in by_size.items():
        facets = np.concatenate(group)
        key = np.sort(same[facets], axis=1)
        _, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        once = facets[counts[inverse.reshape(-1)] == 1]
        if size == 4:  # a quad facet: two triangles
            once = np.concatenate([once[:, [0, 1, 2]], once[:, [0, 2, 3]]])
        out.append(once)
    facets = np.concatenate(out) if out else np.zeros((0, d), np.int64)
    if not len(facets):
        raise MeshError("the mesh has no boundary facet (every facet bounds two cells)")
    return facets


def _coincident(pos: np.ndarray, cells: Sequence[np.ndarray]) -> np.ndarray:
    """One label per point ``[N]``, shared by the points closer than
    :data:`MERGE_TOLERANCE` of the shortest edge of ``cells`` (``[M, k]`` vertex rows,
    consecutive vertices taken as edges)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    n = len(pos)
    lengths = [np.sqrt(((pos[c] - pos[np.roll(c, -1, axis=1)]) ** 2).sum(-1)).ravel()
               for c in cells if len(c)]
    lengths = np.concatenate(lengths) if lengths else np.zeros(0)
    lengths = lengths[lengths > 0]
    if not len(lengths):
        return np.arange(n)
    pairs = cKDTree(pos).query_pairs(MERGE_TOLERANCE * float(lengths.min()),
                                     output_type="ndarray")
    if not len(pairs):
        return np.arange(n)
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def _closest_on_segments(p: np.ndarray, a: np.ndarray, b: np.ndarray,
                         chunk: int = 2048) -> np.ndarray:
    """The closest point to each of ``p [N, 2]`` on the segments ``a -> b [F, 2]``."""
    ab = b - a
    ab2 = np.maximum((ab * ab).sum(1), np.finfo(np.float64).tiny)
    out = np.empty_like(p)
    for s in range(0, len(p), chunk):
        ap = p[s:s + chunk, None, :] - a[None]
        t = np.clip((ap * ab).sum(-1) / ab2, 0.0, 1.0)
        near = a[None] + t[..., None] * ab[None]                 # [n, F, 2]
        k = ((p[s:s + chunk, None, :] - near) ** 2).sum(-1).argmin(1)
        out[s:s + chunk] = near[np.arange(len(k)), k]
    return out


def geometry_channels(mesh) -> dict[str, torch.Tensor]:
    """The geometry channels of a mesh (see the module docstring), float64.

    Args:
        mesh: A :class:`~meshops.MeshData` with ``pos [N, d]`` (``d`` 2 or 3) and
            ``cells``.

    Returns:
        ``{"geo:distance": [N], "geo:direction": [N, d]}``.

    Raises:
        MeshError: A mesh without cells of its dimension, a closed surface, or a
            dimension other than 2 and 3.
    """
    pos = np.asarray(mesh.pos.detach().cpu() if isinstance(mesh.pos, torch.Tensor)
                     else mesh.pos, np.float64)
    d = pos.shape[1]
    if d not in (2, 3):
        raise MeshError(f"geometry features need a 2-D or 3-D mesh, got {d}-D points")
    facets = boundary_facets(pos, _blocks(mesh))
    if d == 2:
        closest = _closest_on_segments(pos, pos[facets[:, 0]], pos[facets[:, 1]])
    else:
        import trimesh

        surface = trimesh.Trimesh(pos, facets, process=False)
        closest = np.asarray(trimesh.proximity.closest_point(surface, pos)[0], np.float64)
    offset = closest - pos
    distance = np.sqrt((offset ** 2).sum(1))
    # on the boundary (to rounding): no direction
    tiny = 1e-12 * max(float(np.ptp(pos, axis=0).max()), 1e-300)
    direction = np.where(distance[:, None] > tiny,
                         offset / np.maximum(distance, tiny)[:, None], 0.0)
    distance = np.where(distance > tiny, distance, 0.0)
    return {"geo:distance": torch.from_numpy(distance),
            "geo:direction": torch.from_numpy(direction)}
