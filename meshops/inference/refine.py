"""Mesh-independence check of a trained model: the same sample on a uniformly refined and
on a coarsened copy of its mesh, and how far the prediction moves.

A discretisation-consistent operator gives (nearly) the same function on any mesh of the
same geometry; a model that has learned the mesh instead moves when the mesh changes.
:func:`mesh_independence` measures this for one sample:

* **refined**: :func:`refine_mesh` splits every cell uniformly (a triangle or quad into
  4, a tetrahedron or hexahedron into 8, a line into 2), adding the edge midpoints (and
  face and cell centres of quads and hexahedra); the point fields are interpolated
  there with the cells' own linear / multilinear basis (the mean of the corners the new
  node lies between), but the geometry features (``geo:distance``, ``geo:direction``,
  functions of the domain and not linear) are computed on the refined mesh as predict
  computes them on any mesh; the quadrature weights are those of the new mesh. The
  original points are the first ``N`` points of the refined mesh, so the two
  predictions are compared there.
* **coarsened**: :func:`coarsen_points` keeps a farthest-point subset of ``N / 2^d``
  points, each carrying the weight of the original points nearest to it (Voronoi
  aggregation, :func:`meshops.models.latent.voronoi_weights`): a coarser quadrature of
  the same domain, with the fields' exact values at the kept points and no cells (a
  point cloud: re-meshing a coarser conforming mesh of any geometry is not attempted).

The change is the relative L2 distance of the predictions at the shared points,
quadrature-weighted with the weights of the coarser of the two: a few per cent or less
for a consistent model, of the order of its error or more for one that is not.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from meshops.errors import MeshError
from meshops.mesh.geometry import GEOMETRY_FIELDS, geometry_channels

__all__ = ["coarsen_points", "mesh_independence", "refine_mesh"]


def _lattice(corners: list[tuple[int, ...]]):
    """New nodes and children of a tensor-product cell (line, quad, hexahedron) split at
    its midpoints: ``corners[k]`` are the 0/1 reference coordinates of corner ``k``.
    Returns (supports: the corners each new node is the mean of, children: local node
    indices, corners first)."""
    d = len(corners[0])
    index = {tuple(2 * c for c in corner): k for k, corner in enumerate(corners)}
    supports = []
    for p in itertools.product(range(3), repeat=d):
        if p in index:
            continue
        index[p] = len(corners) + len(supports)
        supports.append(tuple(k for k, c in enumerate(corners)
                              if all(a == 1 or 2 * ci == a for a, ci in zip(p, c))))
    children = []
    for base in itertools.product(range(2), repeat=d):
        children.append([index[tuple(b + c for b, c in zip(base, corner))]
                         for corner in corners])
    return supports, children


# Simplices: new nodes at the edge midpoints (local node 3.. / 4..), children by hand.
_TRIANGLE = ([(0, 1), (1, 2), (2, 0)],
             [[0, 3, 5], [3, 1, 4], [5, 4, 2], [3, 4, 5]])
# tetra edge midpoints: 4=m01 5=m12 6=m20 7=m03 8=m13 9=m23; the inner octahedron is
# split along m01-m23 into four tetrahedra around it (orientation fixed afterwards)
_TETRA = ([(0, 1), (1, 2), (2, 0), (0, 3), (1, 3), (2, 3)],
          [[0, 4, 6, 7], [4, 1, 5, 8], [6, 5, 2, 9], [7, 8, 9, 3],
           [4, 9, 5, 6], [4, 9, 6, 7], [4, 9, 7, 8], [4, 9, 8, 5]])
_RULES = {
    "line": _lattice([(0,), (1,)]),
    "triangle": _TRIANGLE,
    "quad": _lattice([(0, 0), (1, 0), (1, 1), (0, 1)]),
    "tetra": _TETRA,
    "hexahedron": _lattice([(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0),
                            (0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1)]),
}


def _orient(points: np.ndarray, cell_type: str, conn: np.ndarray) -> np.ndarray:
    """Children of simplices with the parent's orientation (positive measure)."""
    if cell_type == "tetra":
        p = points[conn]
        det = np.einsum("ij,ij->i", np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]),
                        p[:, 3] - p[:, 0])
        flip = det < 0
        conn[flip] = conn[flip][:, [0, 2, 1, 3]]
    return conn


def _check_not_a_cloud(mesh) -> None:
    """Refuse a point cloud: no cells, or (as a cloud read from a file has) one vertex
    cell per point; there is nothing to split."""
    cells = getattr(mesh, "cells", None) or []
    if all(cell_type == "vertex" for cell_type, _ in cells):
        source = str(getattr(mesh, "source", None) or "mesh")
        raise MeshError(f"{source}: no cells to refine (a point cloud, "
                        f"{'vertex cells only' if cells else 'no cells'}); the refinement "
                        f"check needs a mesh with lines, faces or volumes")


def _children(cells, n: int, source: str) -> tuple[list, list[tuple]]:
    """The cells of the uniform refinement, and the corners each new node lies between
    (new nodes numbered from ``n``, one per edge, quad face or tensor-product cell)."""
    keys: dict[tuple, int] = {}
    new_support: list[tuple] = []
    blocks = []
    for cell_type, conn in cells:
        conn = np.asarray(conn, dtype=np.int64)
        if cell_type == "vertex":
            blocks.append((cell_type, conn))
            continue
        if cell_type not in _RULES:
            raise MeshError(f"{source}: cannot refine {cell_type} cells uniformly (supported: "
                            f"{', '.join(_RULES)})")
        supports, children = _RULES[cell_type]
        local = np.empty((conn.shape[0], conn.shape[1] + len(supports)), dtype=np.int64)
        local[:, :conn.shape[1]] = conn
        for j, sup in enumerate(supports):
            for c, row in enumerate(conn[:, list(sup)]):
                key = tuple(sorted(int(v) for v in row))
                if key not in keys:
                    keys[key] = n + len(new_support)
                    new_support.append(key)
                local[c, conn.shape[1] + j] = keys[key]
        child = local[:, np.asarray(children)].reshape(-1, len(children[0]))
        blocks.append((cell_type, child))
    return blocks, new_support


def refine_mesh(mesh):
    """Uniform refinement of a mesh's cells, point fields interpolated linearly.

    Args:
        mesh: A :class:`~meshops.MeshData` with ``cells`` (line, triangle, quad,
            tetra, hexahedron; ``vertex`` cells are kept) and point ``fields``.

    Returns:
        A new :class:`~meshops.MeshData` whose first ``N`` points are the original
        ones, with every field interpolated at the new points (the geometry features
        ``geo:*`` computed there), the quadrature weights of the refined cells and the
        mesh's ``params``.

    Raises:
        MeshError: a mesh without cells other than vertices (a point cloud), or with
            a cell type not listed above.

    Shapes:
        ``pos [N, d]`` -> ``pos [N + E (+ F + C), d]`` (E edges, F quad faces, C cells
        of tensor-product type)
    """
    from meshops.mesh.io import mesh_from_arrays

    source = str(getattr(mesh, "source", None) or "mesh")
    _check_not_a_cloud(mesh)
    cells = mesh.cells
    pos = mesh.pos.to(torch.float64).numpy()
    n = pos.shape[0]
    fields = {k: v.to(torch.float64).numpy().reshape(n, -1) for k, v in mesh.fields.items()}
    blocks, new_support = _children(cells, n, source)
    # a new node is the mean of the corners it lies between (linear / multilinear basis)
    def extend(values: np.ndarray) -> np.ndarray:
        extra = np.stack([values[list(s)].mean(0) for s in new_support]) if new_support \
            else values[:0]
        return np.concatenate([values, extra])

    points = extend(pos)
    blocks = [(t, _orient(points, t, c)) for t, c in blocks]
    data = {k: extend(v).reshape(-1, *mesh.fields[k].shape[1:]) for k, v in fields.items()
            if k not in GEOMETRY_FIELDS}
    fine = mesh_from_arrays(points, blocks, data, source=f"{source} (refined)")
    geo = [k for k in fields if k in GEOMETRY_FIELDS]
    if geo:
        channels = geometry_channels(fine)
        fine.fields.update({k: channels[k].to(mesh.fields[k].dtype) for k in geo})
    return _keep_params(mesh, fine)


def _keep_params(mesh, copy):
    """``copy`` with the parameters of ``mesh`` (``params [1, K]``, a property of the
    sample, not of its mesh), when it has them."""
    params = getattr(mesh, "params", None)
    if params is not None:
        copy.params = params
    return copy


def coarsen_points(mesh, factor: int | None = None):
    """A farthest-point subset of the mesh's points with Voronoi-aggregated weights.

    Args:
        mesh: A :class:`~meshops.MeshData` (``pos``, ``weight``, ``fields``).
        factor: Keep ``N / factor`` points (default ``2^d``, the inverse of one
            uniform refinement).

    Returns:
        ``(coarse, index)``: a point-cloud :class:`~meshops.MeshData` (no cells) with
        the fields' values at the kept points and weights that sum to the mesh's
        measure, and the kept points' indices ``[Nc]`` into the mesh.
    """
    from meshops.mesh.data import MeshData
    from meshops.models.latent import fps_latent, voronoi_weights

    pos = mesh.pos.to(torch.float64)
    n, d = pos.shape
    factor = 2 ** d if factor is None else int(factor)
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    keep = max(2, math.ceil(n / factor))
    idx = fps_latent(pos, None, keep)
    weight = voronoi_weights(pos, mesh.weight.to(torch.float64), None, pos[idx], None)
    coarse = MeshData(pos=pos[idx], weight=weight,
                      fields={k: v[idx] for k, v in mesh.fields.items()})
    coarse.source = f"{getattr(mesh, 'source', None) or 'mesh'} (coarsened)"
    return _keep_params(mesh, coarse), idx


def _rel(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> float:
    """``||a - b||_w / ||b||_w`` over all channels (NaN when ``b`` is zero)."""
    a, b, w = a.to(torch.float64), b.to(torch.float64), w.to(torch.float64)
    a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    num = float((w[:, None] * (a - b) ** 2).sum().sqrt())
    den = float((w[:, None] * b ** 2).sum().sqrt())
    return num / den if den > 0 else math.nan


def mesh_independence(model, spec, mesh) -> dict:
    """How far ``model``'s prediction moves on refined and coarsened copies of ``mesh``.

    Args:
        model: A trained model.
        spec: Its :class:`~meshops.inference.predict.RunSpec` (field names and shapes).
        mesh: The sample: a mesh with cells and the input (and optionally target)
            fields.

    Returns:
        ``{"points": N, "error": e0, "refined": {...}, "coarsened": {...}}`` where
        each copy has ``points``, ``change`` (relative L2 distance of its prediction
        from the original one at their shared points) and ``error`` (its relative L2
        error against the targets there; ``None`` without targets). ``e0`` is the
        original mesh's error. Parameters (``params``) are the sample's, on every copy.
        A mesh with a cell type that has no uniform split (wedges, pyramids) has
        ``{"note": why}`` for its refined copy.

    Raises:
        MeshError: a point cloud (no cells, or vertex cells only), naming it: nothing
            can be refined, and a refined copy equal to the mesh would report a change
            of 0, perfect mesh independence, for a check that was never made.
    """
    from meshops.inference.predict import predict_mesh

    _check_not_a_cloud(mesh)
    n = int(mesh.pos.shape[0])
    base = predict_mesh(model, spec, mesh)
    has_y = all(k in mesh.fields for k in spec.targets)

    def target(m, idx=None):
        if not has_y:
            return None
        cols = [m.fields[k].reshape(m.pos.shape[0], -1) for k in spec.targets]
        y = torch.cat(cols, 1)
        return y if idx is None else y[idx]

    y0 = target(mesh)
    out = {"points": n, "error": None if y0 is None else _rel(base, y0, mesh.weight)}
    try:
        fine = refine_mesh(mesh)
        pred = predict_mesh(model, spec, fine)
        yf = target(fine)
        out["refined"] = {"points": int(fine.pos.shape[0]),
                          "change": _rel(pred[:n], base, mesh.weight),
                          "error": None if yf is None else _rel(pred, yf, fine.weight)}
    except MeshError as e:  # a cell type without a uniform split: the coarsened copy runs
        out["refined"] = {"note": str(e)}
    coarse, idx = coarsen_points(mesh)
    pred = predict_mesh(model, spec, coarse)
    yc = target(coarse)
    out["coarsened"] = {"points": int(coarse.pos.shape[0]),
                        "change": _rel(pred, base[idx], coarse.weight),
                        "error": None if yc is None else _rel(pred, yc, coarse.weight)}
    return out
