"""Boundary tags: tagged facets of a mesh as input channels and as domains of integrals.

A Gmsh mesh names parts of its boundary with *physical groups*: meshio reads their
names into ``field_data`` (``{"wall": [tag, dim]}``) and the tag of every cell into the
cell data ``gmsh:physical``, the boundary itself being cells of one dimension less
than the mesh (lines of a triangle mesh, triangles or quads of a volume mesh). VTK
files carry such tags as an integer cell array without names (e.g. ``CellEntityIds``).
A tag is named here either way:

* ``wall``: a Gmsh physical name (the file's ``field_data`` and ``gmsh:physical``);
* ``ARRAY=VALUE``: the facets whose integer cell array ``ARRAY`` equals ``VALUE``,
  e.g. ``CellEntityIds=3`` or ``gmsh:physical=2``.

:func:`boundary` gives the tagged facets with their outward unit normals (pointing
away from the cell each facet bounds), measures and the integrals of the vertices'
basis functions over each facet: the boundary's quadrature rule, exact for linear
fields on straight facets (:meth:`Boundary.integrate`: ``integral f ds``, the force
``integral p n ds`` and the flux ``integral u . n ds``). :func:`tag_channels` turns tags
into input channels: an indicator per tag (1 on the tagged facets' vertices, or on the
cells that own a tagged facet for cell samples) and the outward normal where any of
them is (zero elsewhere). These are nodal features, nonzero in a band one cell wide:
they tell the model where each boundary is, as node types do in graph networks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from meshops.errors import MeshError
from meshops.mesh._overlap import FACETS, SIMPLEX_FACETS
from meshops.mesh.quadrature import CELL_DIMS, cell_weights, top_dimension

__all__ = ["GMSH_TAGS", "NORMAL_FIELD", "TAG_PREFIX", "Boundary", "boundary", "tag_channels",
           "tag_field_names"]

#: The cell data holding Gmsh's physical-group tags, looked up by the names in
#: ``field_data``.
GMSH_TAGS = "gmsh:physical"
#: Input fields made from tags: ``tag:<tag>`` (indicator) and ``tag:normal``.
TAG_PREFIX = "tag:"
NORMAL_FIELD = TAG_PREFIX + "normal"
# Facet types of a mesh of each dimension.
_FACET_TYPES = {1: ("vertex",), 2: ("line",), 3: ("triangle", "quad")}


def tag_field_names(tags: Sequence[str]) -> list[str]:
    """The input fields :func:`tag_channels` makes: an indicator per tag, then the
    normal (none without tags)."""
    return [TAG_PREFIX + t for t in tags] + ([NORMAL_FIELD] if tags else [])


def _numpy(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def _blocks(mesh) -> list[tuple[str, np.ndarray]]:
    return [(str(t), _numpy(c)) for t, c in (getattr(mesh, "cells", None) or [])]


def _tag_names(mesh) -> list[str]:
    """Gmsh physical names of ``mesh`` usable as tags."""
    fd = getattr(mesh, "field_data", None) or {}
    return sorted(k for k, v in fd.items() if np.asarray(v).size == 2)


def _int_arrays(mesh) -> list[str]:
    """Integer cell-data arrays of ``mesh`` (candidates for ``ARRAY=VALUE``)."""
    out = []
    for k, arrays in (getattr(mesh, "cell_data", None) or {}).items():
        a = [_numpy(x) for x in arrays]
        if a and all(np.issubdtype(x.dtype, np.integer) and x.ndim == 1 for x in a):
            out.append(k)
    return sorted(out)


def _available(mesh) -> str:
    names = _tag_names(mesh) if GMSH_TAGS in (getattr(mesh, "cell_data", None) or {}) else []
    arrays = _int_arrays(mesh)
    parts = [f"names {', '.join(names)}" if names else "no Gmsh physical names"]
    parts.append(f"ARRAY=VALUE with the integer cell arrays {', '.join(arrays)}" if arrays
                 else "no integer cell arrays for ARRAY=VALUE")
    return "; ".join(parts)


def _resolve(mesh, tag: str, tdim: int, source: str) -> tuple[str, int, str]:
    """``(cell array, value, description)`` of a tag (see the module docstring)."""
    cell_data = getattr(mesh, "cell_data", None) or {}
    field_data = getattr(mesh, "field_data", None) or {}
    if "=" in tag:
        array, _, value = tag.rpartition("=")
        try:
            v = int(value)
        except ValueError:
            raise MeshError(f"{source}: tag {tag!r}: the value after '=' must be an integer "
                            f"cell tag, got {value!r}") from None
        if array not in cell_data:
            raise MeshError(f"{source}: unknown tag {tag!r}: no cell array {array!r}; tags in "
                            f"this file: {_available(mesh)}")
        if array not in _int_arrays(mesh):
            raise MeshError(f"{source}: tag {tag!r}: cell array {array!r} does not hold integer "
                            f"tags (one integer per cell)")
        return array, v, f"{array} = {v}"
    if tag in field_data and GMSH_TAGS in cell_data and np.asarray(field_data[tag]).size == 2:
        value, dim = (int(x) for x in np.asarray(field_data[tag]).ravel())
        if dim != tdim - 1:
            raise MeshError(f"{source}: tag {tag!r} is a {dim}-D physical group; boundary tags "
                            f"are groups of {tdim - 1}-D facets of this {tdim}-D mesh")
        return GMSH_TAGS, value, f"physical group {tag!r} ({GMSH_TAGS} = {value})"
    raise MeshError(f"{source}: unknown tag {tag!r}; tags in this file: {_available(mesh)}")


@dataclass
class Boundary:
    """The facets of a tag, with what integrals over them need.

    Attributes:
        tag: The tag as given.
        facets: ``[(cell type, conn [F_b, s_b])]`` per facet type (vertex ids).
        node: ``[F_b, s_b]`` per block: integral over each facet of its vertices' basis
            functions (for a vertex facet of a 1-D mesh, 1).
        normal: ``[F, d]`` outward unit normals, the blocks concatenated (0 for a
            facet of zero measure, which has none).
        measure: ``[F]`` facet measures (length, area; 1 for a vertex).
        owner: ``[F]`` the cell each facet bounds, numbered as the top-dimensional
            cells of :func:`meshops.mesh.cells.cell_points`.
    """

    tag: str
    facets: list
    node: list
    normal: np.ndarray
    measure: np.ndarray
    owner: np.ndarray

    def node_weights(self, num_points: int) -> torch.Tensor:
        """``[N]``: the integral of every vertex's basis function over the boundary
        (``sum`` = its length or area)."""
        w = np.zeros(num_points)
        for (_, conn), node in zip(self.facets, self.node):
            np.add.at(w, conn.ravel(), node.ravel())
        return torch.from_numpy(w)

    def _facet_integrals(self, values, at: str) -> np.ndarray:
        """``[F, c]``: the integral of the field over each facet."""
        v = _numpy(values).astype(np.float64)
        v = v.reshape(v.shape[0], -1)
        if at == "cells":
            return self.measure[:, None] * v[self.owner]
        return np.concatenate([np.einsum("fs,fsc->fc", node, v[conn])
                               for (_, conn), node in zip(self.facets, self.node)])

    def integrate(self, values, at: str = "points", mode: str = "value") -> torch.Tensor:
        """An integral over the tagged boundary.

        Args:
            values: Point values ``[N]``/``[N, c]`` (integrated with the facets'
                linear/multilinear interpolant: exact for linear fields), or cell values
                ``[Nc]``/``[Nc, c]`` with ``at="cells"`` (each facet takes its cell's value).
            at: ``"points"`` or ``"cells"``.
            mode: ``"value"``: ``integral f ds`` (``[c]``, a scalar for ``[N]``);
                ``"normal"``: ``integral f n ds`` for a scalar ``f`` (``[d]``: e.g. the
                pressure force); ``"flux"``: ``integral f . n ds`` for ``f`` with ``d``
                components (a scalar).

        Shapes:
            ``[N]`` or ``[N, c]`` -> ``[]``, ``[c]`` or ``[d]`` (float64)
        """
        if at not in ("points", "cells"):
            raise ValueError(f"at must be 'points' or 'cells', got {at!r}")
        scalar = _numpy(values).ndim == 1
        per = self._facet_integrals(values, at)
        d = self.normal.shape[1]
        if mode == "value":
            out = per.sum(0)
            return torch.from_numpy(np.asarray(out[0] if scalar else out))
        if mode == "normal":
            if per.shape[1] != 1:
                raise MeshError(f"tag {self.tag!r}: the integral of f n needs a scalar field, "
                                f"got {per.shape[1]} components")
            return torch.from_numpy((per * self.normal).sum(0))
        if mode == "flux":
            if per.shape[1] != d:
                raise MeshError(f"tag {self.tag!r}: the flux integral of f . n needs a field "
                                f"with {d} components, got {per.shape[1]}")
            return torch.tensor(float((per * self.normal).sum()), dtype=torch.float64)
        raise ValueError(f"mode must be 'value', 'normal' or 'flux', got {mode!r}")


def _cell_facets(pos: np.ndarray, blocks: list, tdim: int):
    """Every facet of every top-dimensional cell: sorted vertex rows by facet size,
    ``{s: (rows [F, s], owner [F])}``, and the cells' vertex means ``[Nc, d]``."""
    rows: dict[int, list] = {}
    owners: dict[int, list] = {}
    centres = []
    first = 0
    for ctype, conn in blocks:
        if CELL_DIMS.get(ctype, -1) != tdim:
            continue
        local = SIMPLEX_FACETS.get(ctype) or FACETS[ctype]
        for f in local:
            r = np.sort(conn[:, list(f)], axis=1)
            rows.setdefault(len(f), []).append(r)
            owners.setdefault(len(f), []).append(np.arange(first, first + len(conn)))
        centres.append(pos[conn].mean(1))
        first += len(conn)
    out = {s: (np.concatenate(rows[s]), np.concatenate(owners[s])) for s in rows}
    return out, np.concatenate(centres)


def _owners(tagged: np.ndarray, cell_rows: np.ndarray, cell_owner: np.ndarray):
    """For each tagged facet (rows ``[F, s]``, sorted), the number of cells it bounds and
    one of them."""
    allrows = np.concatenate([tagged, cell_rows])
    _, inv = np.unique(allrows, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    inv_t, inv_c = inv[:len(tagged)], inv[len(tagged):]
    count = np.bincount(inv_c, minlength=inv.max() + 1)[inv_t]
    owner = np.full(inv.max() + 1, -1)
    owner[inv_c] = cell_owner
    return count, owner[inv_t]


def _facet_normals(x: np.ndarray) -> np.ndarray:
    """Unnormalised normals of facets ``x [F, s, d]`` (a vertex, a line in 2-D, a
    triangle or a quad in 3-D)."""
    s = x.shape[1]
    if s == 1:
        return np.ones((len(x), 1))
    if s == 2:
        t = x[:, 1] - x[:, 0]
        return np.stack([t[:, 1], -t[:, 0]], 1)
    if s == 3:
        return np.cross(x[:, 1] - x[:, 0], x[:, 2] - x[:, 0])
    return np.cross(x[:, 2] - x[:, 0], x[:, 3] - x[:, 1])


def _outward_normals(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Outward unit normals ``[F, d]`` of facets ``x [F, s, d]`` whose cells have the
    vertex means ``centres [F, d]``. A facet of zero measure (a collapsed edge or face:
    two of its vertices coincide) has no normal: it gets 0, which its zero measure
    would multiply anyway, instead of the 0/0 that would turn every vertex's averaged
    normal into NaN."""
    n = _facet_normals(x)
    length = np.linalg.norm(n, axis=1, keepdims=True)
    n = np.divide(n, length, out=np.zeros_like(n),
                  where=length > 1e-12 * (length.max() if length.size else 1.0))
    outward = np.einsum("fd,fd->f", n, x.mean(1) - centres)
    n[outward < 0] *= -1
    return n


def _tagged_facets(mesh, blocks: list, tag: str, tdim: int, source: str) -> list:
    """``[(cell type, connectivity), ...]`` of the facets ``tag`` marks; refused when it
    marks cells of the mesh's own dimension, or nothing."""
    array, value, what = _resolve(mesh, tag, tdim, source)
    arrays = mesh.cell_data[array]
    facets = []
    for b, (ctype, conn) in enumerate(blocks):
        tags = _numpy(arrays[b]).reshape(-1)
        if ctype in _FACET_TYPES[tdim]:
            sel = tags == value
            if sel.any():
                facets.append((ctype, conn[sel]))
        elif CELL_DIMS.get(ctype) == tdim and (tags == value).any():
            raise MeshError(f"{source}: tag {tag!r} ({what}) marks {ctype} cells, a "
                            f"{tdim}-D region; boundary tags mark {tdim - 1}-D facets")
    if not facets:
        raise MeshError(f"{source}: tag {tag!r} ({what}) marks no {tdim - 1}-D facets "
                        f"({' or '.join(_FACET_TYPES[tdim])} cells)")
    return facets


def boundary(mesh, tag: str, source: str | None = None) -> Boundary:
    """The facets of ``tag`` with outward normals and the boundary's quadrature.

    Args:
        mesh: A :class:`~meshops.MeshData` read with its cells, cell data and field
            data (:func:`meshops.read_mesh`), whose cells fill its space (a triangle or
            quad mesh in 2-D, a volume mesh in 3-D, lines in 1-D).
        tag: A Gmsh physical name or ``ARRAY=VALUE`` (see the module docstring).
        source: Name for messages (default ``mesh.source``).

    Raises:
        MeshError: an unknown tag (listing the file's names and integer cell arrays),
            a tag of another dimension than the facets, a tag with no facets, a tagged
            facet that bounds no cell or lies between two cells (inside the mesh), or
            a mesh that does not fill its space (a surface in 3-D).
    """
    source = source or getattr(mesh, "source", None) or "mesh"
    pos = _numpy(mesh.pos).astype(np.float64)
    d = pos.shape[1]
    blocks = _blocks(mesh)
    tdim = top_dimension([(t, c) for t, c in blocks if t in CELL_DIMS])
    if tdim == 0:
        raise MeshError(f"{source}: boundary tags need a mesh with cells; this one has none")
    if tdim != d:
        raise MeshError(f"{source}: boundary tags need a mesh that fills its space; this is a "
                        f"{tdim}-D mesh in {d}-D (outward normals are not defined)")
    facets = _tagged_facets(mesh, blocks, tag, tdim, source)
    by_size, centres = _cell_facets(pos, blocks, tdim)
    normals, measures, owners, nodes = [], [], [], []
    for ctype, conn in facets:
        rows = np.sort(conn, axis=1)
        cell_rows, cell_owner = by_size.get(conn.shape[1], (np.zeros((0, conn.shape[1]), int),
                                                            np.zeros(0, int)))
        count, owner = _owners(rows, cell_rows, cell_owner)
        if (count != 1).any():
            k = int(np.flatnonzero(count != 1)[0])
            where = ("bounds no cell of the mesh" if count[k] == 0 else
                     "lies inside the mesh, between two cells")
            raise MeshError(f"{source}: tag {tag!r}: {ctype} facet {k} with vertices "
                            f"{conn[k].tolist()} {where}; boundary tags mark facets on the "
                            f"boundary")
        n = _outward_normals(pos[conn], centres[owner])
        if ctype == "vertex":
            measure, node = np.ones(len(conn)), np.ones((len(conn), 1))
        else:
            measure, node = cell_weights(pos, ctype, conn)
        normals.append(n)
        measures.append(measure)
        owners.append(owner)
        nodes.append(node)
    return Boundary(tag, facets, nodes, np.concatenate(normals), np.concatenate(measures),
                    np.concatenate(owners))


def tag_channels(mesh, tags: Sequence[str], at: str = "points", num_cells: int | None = None,
                 source: str | None = None) -> dict[str, torch.Tensor]:
    """Input channels of boundary tags: an indicator per tag and the outward normal.

    At the points (``at="points"``): ``tag:<tag> [N]`` is 1 on the vertices of the
    tag's facets and 0 elsewhere; ``tag:normal [N, d]`` is the outward unit normal at
    the vertices of any of the tags' facets (the facets around a vertex averaged with
    their basis-function integrals, then normalised), 0 elsewhere. At the cells
    (``at="cells"``, with ``num_cells`` top-dimensional cells): the same for the cells
    that own a tagged facet.

    Returns:
        ``{name: tensor}`` in the order of :func:`tag_field_names` (float64).

    Raises:
        MeshError: as :func:`boundary`, for the first bad tag.

    Shapes:
        ``tag:<tag> [N]`` (or ``[Nc]``), ``tag:normal [N, d]`` (or ``[Nc, d]``)
    """
    if not tags:
        return {}
    pos = _numpy(mesh.pos)
    n, d = (len(pos) if at == "points" else int(num_cells)), pos.shape[1]
    out = {}
    normal = np.zeros((n, d))
    for tag in tags:
        b = boundary(mesh, tag, source)
        ind = np.zeros(n)
        if at == "points":
            first = 0
            for (_, conn), node in zip(b.facets, b.node):
                nf = b.normal[first:first + len(conn)]
                ind[conn.ravel()] = 1.0
                np.add.at(normal, conn.ravel(), (node[:, :, None] * nf[:, None, :]).reshape(-1, d))
                first += len(conn)
        else:
            ind[b.owner] = 1.0
            np.add.at(normal, b.owner, b.measure[:, None] * b.normal)
        out[TAG_PREFIX + tag] = torch.from_numpy(ind)
    length = np.linalg.norm(normal, axis=1, keepdims=True)
    # a vertex between facets whose normals cancel (a zero-thickness wall) keeps 0
    normal = np.divide(normal, length, out=np.zeros_like(normal), where=length > 1e-12 * (
        length.max() if length.size else 1.0))
    out[NORMAL_FIELD] = torch.from_numpy(normal)
    return out
