"""Cell-centred fields: the cells of a mesh as the sample points of the midpoint rule.

OpenFOAM, Fluent and many VTK exports store a field per cell (one value per finite
volume), not per vertex. meshops trains on such fields **where they live**: a sample
whose targets are cell data has one point per cell of the mesh's highest dimension, at
the cell's centroid, with the cell's measure (length, area, volume) as its quadrature
weight. ``sum_c |K_c| f(x_c)`` is the midpoint rule: exact for linear ``f`` on every
cell type (the centroid is the true one, not the mean of the vertices, also on
distorted quads and hexahedra) and second order for smooth ``f`` (the error falls as
``h^2`` under refinement; ``tests/mesh/test_cells.py`` measures it). Mixed meshes (triangles
and quads, tetrahedra, hexahedra, wedges and pyramids) are one set of cells; boundary
cells of lower dimension (the lines of a 2-D Gmsh mesh) are not sample points.

Why not transfer the cell values to the vertices instead: a cell -> point transfer
(ParaView's averaging of the cells around a vertex) smooths the data, is only first
order near boundaries and jumps, and the model would then be trained and judged
against values that are not in the file; predictions could not be written back as
the per-cell values the solver's tools expect. On the cells, the model sees and
predicts exactly the file's values and every layer integrates with the midpoint rule.

The transfer the other way is well defined and used for point-data *inputs* of a cell
sample: the cell average of the field's linear/multilinear interpolant,
``f_c = sum_j (integral_K phi_j) f_j / |K|`` (:func:`point_to_cells`), which is the
field's value at the centroid for every linear field. A cell-data input with
point-data targets is refused (a piecewise-constant field has no value at a vertex
shared by cells with different values).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from meshops.errors import MeshError
from meshops.mesh.quadrature import CELL_DIMS, cell_weights, top_dimension

__all__ = ["CellPoints", "cell_field", "cell_points", "cells_to_blocks", "point_to_cells"]


@dataclass
class CellPoints:
    """The top-dimensional cells of a mesh as quadrature points.

    Attributes:
        centroid: ``[Nc, d]`` float64 centroids, the cells in the order of the mesh's
            cell blocks (of the top dimension), then of their rows.
        measure: ``[Nc]`` float64 cell measures (midpoint-rule weights).
        blocks: ``(block index in mesh.cells, cell type, first, stop)`` of each
            top-dimensional block: its cells are ``centroid[first:stop]``.
        block_sizes: Number of cells of every cell block of the mesh (all dimensions).
        transfer: ``[Nc, N]`` sparse matrix of the cell averages of the vertices'
            basis functions (rows sum to 1): ``transfer @ f`` is
            :func:`point_to_cells`.
    """

    centroid: np.ndarray
    measure: np.ndarray
    blocks: list
    block_sizes: list
    transfer: "object"

    @property
    def num_cells(self) -> int:
        return int(len(self.measure))

    @property
    def num_blocks(self) -> int:
        return len(self.block_sizes)


def cell_points(mesh, source: str | None = None) -> CellPoints:
    """Centroids and measures of the cells of the highest dimension of ``mesh``.

    Args:
        mesh: A :class:`~meshops.MeshData` with ``pos [N, d]`` and ``cells`` (e.g. from
            :func:`meshops.read_mesh`, which has checked the cells).
        source: Name for messages (default ``mesh.source``).

    Returns:
        :class:`CellPoints`.

    Raises:
        MeshError: a mesh without cells (a point cloud).

    Shapes:
        ``pos [N, d]`` -> ``centroid [Nc, d]``, ``measure [Nc]``, ``transfer [Nc, N]``
    """
    import scipy.sparse as sp

    source = source or getattr(mesh, "source", None) or "mesh"
    pos = mesh.pos.detach().cpu().numpy().astype(np.float64)
    blocks = [(str(t), c.detach().cpu().numpy() if isinstance(c, torch.Tensor) else np.asarray(c))
              for t, c in (getattr(mesh, "cells", None) or [])]
    known = [(t, c) for t, c in blocks if t in CELL_DIMS]
    tdim = top_dimension(known) if known else 0
    if tdim == 0:
        raise MeshError(f"{source}: cell data needs a mesh with cells; this one has "
                        f"{'only vertex cells' if blocks else 'none'} (a point cloud)")
    centroids, measures, rows, cols, vals, spans = [], [], [], [], [], []
    first = 0
    for b, (ctype, conn) in enumerate(blocks):
        if CELL_DIMS.get(ctype, -1) != tdim:
            continue
        vol, node = cell_weights(pos, ctype, conn)
        # the geometry is interpolated with the basis: integral of x = sum_j (int phi_j) x_j
        centroids.append(np.einsum("mn,mnd->md", node, pos[conn]) / vol[:, None])
        measures.append(vol)
        m = len(conn)
        rows.append(np.repeat(np.arange(first, first + m), conn.shape[1]))
        cols.append(conn.ravel())
        vals.append((node / vol[:, None]).ravel())
        spans.append((b, ctype, first, first + m))
        first += m
    transfer = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(first, len(pos)))
    return CellPoints(np.concatenate(centroids), np.concatenate(measures), spans,
                      [len(c) for _, c in blocks], transfer)


def point_to_cells(values, cp: CellPoints, name: str = "values",
                   source: str = "mesh") -> torch.Tensor:
    """Cell averages of a point field's interpolant: the value at each centroid for a
    linear field, the exact mean over the cell for a (multi)linear one.

    Raises:
        MeshError: a NaN or infinite value, naming ``source``, the field ``name`` and
            the point (after the transfer only the cell would be known).

    Shapes:
        ``[N]`` or ``[N, ...]`` -> ``[Nc]`` or ``[Nc, ...]`` (float64)
    """
    v = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    flat = v.reshape(v.shape[0], -1).astype(np.float64)
    bad = ~np.isfinite(flat).all(1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise MeshError(f"{source}: point field {name!r} has a non-finite value at point {i} "
                        f"({int(bad.sum())} such points)")
    out = np.asarray(cp.transfer @ flat)
    return torch.from_numpy(out.reshape((cp.num_cells,) + v.shape[1:]))


def cell_field(mesh, name: str, cp: CellPoints, source: str | None = None) -> torch.Tensor:
    """The cell-data array ``name`` of ``mesh`` on its top-dimensional cells, in the
    order of :class:`CellPoints`.

    Raises:
        MeshError: an array whose length is not its block's cell count, shapes that
            differ between blocks, or a NaN/inf value (naming the block and cell).

    Shapes:
        per block ``[M_b]`` or ``[M_b, ...]`` -> ``[Nc]`` or ``[Nc, ...]``
    """
    source = source or getattr(mesh, "source", None) or "mesh"
    arrays = mesh.cell_data[name]
    if len(arrays) != cp.num_blocks:
        raise MeshError(f"{source}: cell field {name!r} has {len(arrays)} arrays for "
                        f"{cp.num_blocks} cell blocks")
    parts = []
    for b, ctype, first, stop in cp.blocks:
        a = torch.as_tensor(np.asarray(arrays[b]) if not isinstance(arrays[b], torch.Tensor)
                            else arrays[b])
        if a.dim() == 0 or a.shape[0] != stop - first:
            raise MeshError(f"{source}: cell field {name!r} has {a.shape[0] if a.dim() else 1} "
                            f"values in cell block {b} ({ctype}), which has {stop - first} cells")
        if parts and a.shape[1:] != parts[0].shape[1:]:
            raise MeshError(f"{source}: cell field {name!r} has per-cell shape "
                            f"{list(a.shape[1:])} in cell block {b} but {list(parts[0].shape[1:])} "
                            f"in the first block")
        if a.is_floating_point():
            bad = ~torch.isfinite(a.reshape(a.shape[0], -1)).all(1)
            if bool(bad.any()):
                m = int(bad.nonzero()[0, 0])
                raise MeshError(f"{source}: cell field {name!r} has a non-finite value at "
                                f"{ctype} cell {m} (block {b}; {int(bad.sum())} such cells)")
        parts.append(a)
    return torch.cat(parts, 0)


def cells_to_blocks(values, cp: CellPoints) -> list[np.ndarray]:
    """Per-cell values ``[Nc, ...]`` as meshio cell data: one array per cell block of the
    mesh, NaN on the blocks of lower dimension (boundary lines, vertices), which are
    not sample points.

    Shapes:
        ``[Nc]`` or ``[Nc, ...]`` -> list of ``[M_b]`` or ``[M_b, ...]``
    """
    v = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if v.shape[0] != cp.num_cells:
        raise MeshError(f"{v.shape[0]} values for {cp.num_cells} cells")
    out = [np.full((n,) + v.shape[1:], np.nan) for n in cp.block_sizes]
    for b, _, first, stop in cp.blocks:
        out[b] = v[first:stop]
    return out
