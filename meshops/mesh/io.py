"""Reading meshes as functions (:func:`read_mesh`) and writing fields back (:func:`write_mesh`)."""

from __future__ import annotations

import contextvars
import os
import warnings
from pathlib import Path
from typing import Callable, Mapping, Sequence

import meshio
import numpy as np
import torch

from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.pointcloud import point_cloud_weights
from meshops.mesh.quadrature import (
    CELL_DIMS,
    check_points,
    check_weight_range,
    quadrature_weights,
    top_dimension,
)
from meshops.utils.atomic import atomic_write

# Formats whose meshio writer keeps point and cell data of every name we write
# (checked by a write/read round trip: STL, OBJ, OFF, Abaqus, Nastran, Medit,
# DOLFIN XML, ... write none; PLY and Tecplot keep only scalars).
FIELD_FORMATS = {"vtu": ".vtu", "vtk": ".vtk", "xdmf": ".xdmf", "gmsh22": ".msh",
                 "gmsh": ".msh"}

# The components per point (or cell) that each of them reads back as written, from a
# write/read round trip of 1..12 components through meshio 5.3 (tests/mesh/test_field_formats.py
# repeats it): legacy VTK pads 2 components to 3; XDMF's attribute types are scalar,
# 2- and 3-vectors and 6- and 9-component tensors; Gmsh stores 1, 3 or 9. A field of
# several dimensions per point (a 3x3 tensor) is written as its flattened components,
# the way VTK stores tensors (row-major: xx, xy, xz, yx, ...), and reads back flat.
_COMPONENTS: dict[str, Callable[[int], bool]] = {
    "vtu": lambda c: True,
    "vtk": lambda c: c != 2,
    "xdmf": lambda c: c in (1, 2, 3, 6, 9),
    "gmsh22": lambda c: c in (1, 3, 9),
    "gmsh": lambda c: c in (1, 3, 9),
}

# Point field that carries the quadrature weights of a point cloud (a mesh without
# cells) through a file, so that a written cloud reads back with the same weights.
WEIGHT_FIELD = "meshops:weight"


# meshio's VTU reader skips an array whose size does not fit its NumberOfComponents,
# with a message on the console only (meshio.vtu._vtu.warn, not the warnings
# module). While read_mesh reads, that message becomes a MeshError naming the file.
_STRICT_VTU: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "meshops_strict_vtu", default=None)


def _install_strict_vtu() -> None:
    import meshio.vtu._vtu as vtu

    original = vtu.warn
    if getattr(original, "_meshops", False):
        return

    def warn(message, *args, **kwargs):
        source = _STRICT_VTU.get()
        if source is not None and str(message).endswith("Skipping."):
            raise MeshError(f"{source}: {str(message)[:-len(' Skipping.')]} Not read, "
                            "so as not to drop the array; fix or remove it")
        original(message, *args, **kwargs)

    warn._meshops = True
    vtu.warn = warn


_install_strict_vtu()


def _to_tensor(a: np.ndarray) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if not a.dtype.isnative:  # legacy VTK stores big-endian arrays
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype == np.float16 or a.dtype.kind == "b":
        a = a.astype(np.float32 if a.dtype.kind == "f" else np.uint8)
    return torch.from_numpy(a.copy())


def _spatial_dim(points: np.ndarray, tdim: int) -> int:
    """Drop trailing all-zero coordinate columns (2-D meshes stored with z = 0)."""
    d = points.shape[1]
    while d > max(tdim, 1) and not points[:, d - 1].any():
        d -= 1
    return d


def _check_duplicates(points: np.ndarray, used: np.ndarray, source: str,
                      lower: dict[str, np.ndarray] | None = None, tdim: int = 0) -> None:
    """Unreferenced points that coincide with another point are a broken mesh
    (typically a file with merged-but-not-removed nodes), not a harmless extra.

    ``used`` marks the points of cells of the top dimension ``tdim``; ``lower`` maps
    the lower-dimensional cell types to the points they use (a tagged boundary
    face), which carry no measure: the warning says so rather than "used by no cell".
    """
    unused = np.flatnonzero(~used)
    if not len(unused):
        return
    order = np.lexsort(points.T[::-1])
    sp = points[order]
    same_as_prev = np.r_[False, (sp[1:] == sp[:-1]).all(axis=1)]
    dup = np.zeros(len(points), bool)
    dup[order[same_as_prev]] = True
    dup[order[np.r_[same_as_prev[1:], False]]] = True
    bad = unused[dup[unused]]
    if len(bad):
        i = int(bad[0])
        raise MeshError(
            f"{source}: point {i} at {points[i].tolist()} is used by no cell and duplicates "
            f"another point ({len(bad)} such points); merge or remove duplicate nodes")
    in_lower = {t: int(np.isin(unused, p).sum()) for t, p in (lower or {}).items()}
    in_lower = {t: n for t, n in in_lower.items() if n}
    if not in_lower:
        warnings.warn(f"{source}: {len(unused)} points are used by no cell; they get weight 0",
                      stacklevel=3)
        return
    warnings.warn(f"{source}: {len(unused)} points are in no {tdim}-D cell, only in "
                  f"{', '.join(f'{t} ({n} points)' for t, n in in_lower.items())} cells or in "
                  f"none; lower-dimensional cells have no {tdim}-D measure, so these points "
                  f"get weight 0", stacklevel=3)


def _point_cloud_weight(points: np.ndarray, stored, source: str) -> torch.Tensor:
    """Weights of a mesh without cells: the stored ones, else the kNN estimate."""
    if stored is not None:
        w = np.asarray(stored, dtype=np.float64).reshape(-1)
        bad = ~(np.isfinite(w) & (w >= 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise MeshError(f"{source}: point field {WEIGHT_FIELD!r} must be finite and "
                            f"non-negative; point {i} has {w[i]}")
        check_measure(w, source, f"point field {WEIGHT_FIELD!r}")
        return torch.from_numpy(w.copy())
    warnings.warn(f"{source}: a point cloud without cells or stored weights; using the "
                  "kNN volume estimate (meshops.point_cloud_weights)", stacklevel=3)
    return point_cloud_weights(points, "knn", source=source)


def check_measure(weight, source: str, what: str) -> None:
    """Refuse weights that are 0 at every point: such a mesh has no measure, so its
    integrals, and the models' inputs (normalised by them), are undefined.

    Raises:
        MeshError: naming ``source`` and ``what`` holds the weights (``"MeshData.weight"``).
    """
    w = weight.detach().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
    if len(w) and not (w > 0).any():
        raise MeshError(f"{source}: the weights ({what}) are 0 at every point: the mesh has no "
                        f"measure, so its integrals (and a model's input) are undefined; give "
                        f"the points their volumes (or areas), or the mesh its cells")


def in_memory_mesh(mesh: MeshData, source: str = "the mesh") -> MeshData:
    """A :class:`MeshData` built in Python, made and checked as :func:`read_mesh`
    makes a file's: numpy fields become tensors, every field has one row per point, a
    missing ``weight`` is computed from the cells (the kNN estimate of a point cloud,
    with a warning), and the weights are finite, non-negative and not all 0.

    Returns:
        A shallow copy with those fields and weights (``mesh`` is unchanged).

    Raises:
        MeshError: naming ``source`` and the field, or the weights.

    Shapes:
        pos ``[N, d]``, fields ``[N]`` or ``[N, ...]`` -> weight ``[N]``
    """
    import copy

    pos = mesh.pos if isinstance(mesh.pos, torch.Tensor) else _to_tensor(np.asarray(mesh.pos))
    n = int(pos.shape[0])
    fields = {}
    for name, v in (getattr(mesh, "fields", None) or {}).items():
        v = v if isinstance(v, torch.Tensor) else _to_tensor(np.asarray(v))
        if v.dim() == 0 or v.shape[0] != n:
            rows = "one value" if v.dim() == 0 else f"{v.shape[0]} values"
            raise MeshError(f"{source}: point field {name!r} has {rows} but the mesh has "
                            f"{n} points")
        fields[name] = v
    weight = getattr(mesh, "weight", None)
    if weight is None:
        blocks = [(t, np.asarray(c.cpu() if isinstance(c, torch.Tensor) else c))
                  for t, c in (getattr(mesh, "cells", None) or [])]
        weight = mesh_from_arrays(pos.detach().cpu().numpy(), blocks, source=source).weight
    weight = torch.as_tensor(weight)
    if weight.shape != (n,):
        raise MeshError(f"{source}: weight has shape {tuple(weight.shape)} but the mesh has "
                        f"{n} points (quadrature weights [N])")
    if not (torch.isfinite(weight).all() and (weight >= 0).all()):
        raise MeshError(f"{source}: the quadrature weights must be finite and non-negative")
    check_measure(weight, source, "MeshData.weight")
    out = copy.copy(mesh)
    out.pos, out.weight, out.fields = pos, weight, fields
    return out


def mesh_from_arrays(points, cells, point_data: Mapping | None = None,
                     cell_data: Mapping | None = None, *, fields: Sequence[str] | None = None,
                     source: str = "mesh", field_data: Mapping | None = None) -> MeshData:
    """Build a :class:`MeshData` from points, cell blocks and point data (and the cell
    and field data kept with it).

    Same checks and conventions as :func:`read_mesh` (which calls it), for meshes
    that live in memory (generators, adapters).
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or not 1 <= points.shape[1] <= 3:
        raise MeshError(f"{source}: points must have shape [N, d], d in 1..3, "
                        f"got {tuple(points.shape)}")
    check_points(points, source)
    blocks = [(b.type, b.data) if hasattr(b, "type") else (str(b[0]), np.asarray(b[1]))
              for b in (cells.items() if isinstance(cells, Mapping) else cells)]
    n = len(points)
    point_data = dict(point_data or {})
    for name, arr in point_data.items():
        if len(arr) != n:
            raise MeshError(f"{source}: point field {name!r} has {len(arr)} values but the "
                            f"mesh has {n} points")
    tdim = top_dimension(blocks) if all(t in CELL_DIMS for t, _ in blocks) else 0
    # Drop a zero z column first: a 2-D mesh is checked and integrated as 2-D.
    points = points[:, :_spatial_dim(points, tdim)]
    stored_weight = point_data.pop(WEIGHT_FIELD, None)
    if tdim == 0 and all(t in CELL_DIMS for t, _ in blocks):
        weight = _point_cloud_weight(points, stored_weight, source)
    else:
        weight = quadrature_weights(points, blocks, source=source)
        used = np.zeros(n, bool)
        lower: dict[str, list] = {}
        for t, c in blocks:
            if CELL_DIMS[t] == tdim:
                used[np.asarray(c).ravel()] = True
            else:
                lower.setdefault(t, []).append(np.asarray(c).ravel())
        _check_duplicates(points, used, source,
                          {t: np.concatenate(v) for t, v in lower.items()}, tdim)
    check_weight_range(weight, source)

    if fields is not None:
        missing = [f for f in fields if f not in point_data]
        if missing:
            raise MeshError(f"{source}: point field(s) {missing} not found; available: "
                            f"{sorted(point_data) or 'none'}")
        point_data = {f: point_data[f] for f in fields}
    mesh = MeshData(
        pos=torch.from_numpy(np.ascontiguousarray(points)),
        weight=weight,
        fields={k: _to_tensor(np.asarray(v)) for k, v in point_data.items()},
        cells=[(t, torch.from_numpy(np.ascontiguousarray(c, dtype=np.int64)))
               for t, c in blocks],
        cell_data={k: [_to_tensor(np.asarray(a)) for a in v] for k, v in (cell_data or {}).items()},
        source=source,
    )
    mesh.field_data = {k: np.asarray(v) for k, v in (field_data or {}).items()}
    return mesh


def _meshio_read(path: Path) -> meshio.Mesh:
    """``meshio.read``, but quiet and bounded: the file is sniffed first (a 1 GB file of
    junk is refused from its first bytes, see :mod:`meshops.mesh._sniff`), and each reader
    its suffix allows is tried here, so that a failure is one MeshError with meshio's
    reasons, not meshio's console output and ``sys.exit(1)``."""
    from meshio._helpers import _filetypes_from_path, reader_map

    from meshops.mesh._sniff import check_mesh_file

    try:
        formats = _filetypes_from_path(path)
    except meshio.ReadError:
        raise MeshError(f"{path}: cannot read mesh: unknown format {path.suffix!r}; meshio "
                        f"reads {', '.join(sorted(meshio.extension_to_filetypes))}") from None
    check_mesh_file(path, formats)
    reasons = []
    for fmt in formats:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return reader_map[fmt](str(path))
        except MeshError:
            raise
        except (Exception, SystemExit) as e:  # meshio raises assorted errors on corrupt files
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if isinstance(e, meshio.ReadError):
                reasons.append(f"{fmt}: {text or f'not a valid {fmt} file'}")
            else:
                reasons.append(f"{fmt}: {type(e).__name__}" + (f": {text}" if text else ""))
    raise MeshError(f"{path}: cannot read mesh ({'; '.join(reasons)})")


def read_mesh(path: str | os.PathLike, fields: Sequence[str] | None = None) -> MeshData:
    """Read a mesh file (any format meshio reads: .vtu, .vtk, .msh, .xdmf, .stl, ...)
    as a function with quadrature weights.

    Args:
        path: Mesh file.
        fields: Point-data arrays to keep, a list of names (default: all). A name that
            is not in the file raises :class:`MeshError` listing the available ones.

    Returns:
        :class:`MeshData` with ``pos [N, d]`` (float64; a 2-D mesh stored with a zero
        z column comes back with ``d = 2``), ``weight [N]``, ``fields``, ``cells``,
        ``cell_data`` and ``field_data`` as in the file, and ``source``.

    Raises:
        MeshError: missing or unreadable file, unknown format, and every mesh
            defect listed in :func:`meshops.quadrature_weights`, plus point fields
            whose length is not N, weights that float32 cannot hold (coordinates
            near 1e30 or 1e-30: see :func:`meshops.mesh.quadrature.check_weight_range`),
            VTU arrays whose size does not fit their
            number of components, and unused duplicate points. A file that does not
            begin like its format, or is larger than the free memory, is refused
            before it is read.
        TypeError: ``fields`` given as a string.
    """
    path = Path(path)
    if not path.is_file():
        raise MeshError(f"{path}: no such file")
    if isinstance(fields, str):
        # a bare string would be taken letter by letter ("uf" as fields u and f)
        raise TypeError(f"read_mesh: fields is a list of field names, e.g. [{fields!r}], "
                        f"not a string")
    m = read_meshio(path)
    return mesh_from_arrays(m.points, m.cells, m.point_data, m.cell_data, fields=fields,
                            source=str(path), field_data=m.field_data)


def read_meshio(path: str | os.PathLike) -> "meshio.Mesh":
    """The raw :class:`meshio.Mesh` of a file, with :func:`read_mesh`'s read errors (a
    missing, unreadable or empty file, a VTU array that does not fit its components)
    but none of its mesh checks: for the later steps of a time series, whose mesh is
    compared with the checked first step's instead."""
    path = Path(path)
    if not path.is_file():
        raise MeshError(f"{path}: no such file")
    token = _STRICT_VTU.set(str(path))
    try:
        m = _meshio_read(path)
    finally:
        _STRICT_VTU.reset(token)
    if len(m.points) == 0:
        raise MeshError(f"{path}: holds no points")
    return m


def _numpy(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def _reader_tag(name: str) -> bool:
    """Format bookkeeping that meshio readers add (``gmsh:dim_tags``, ``medit:ref``,
    ...): not a field of the user's, so a format that cannot hold it just drops it."""
    prefix, _, rest = name.partition(":")
    return bool(rest) and prefix in _READER_PREFIXES


_READER_PREFIXES = {"gmsh", "medit", "obj", "ansys", "abaqus", "flac3d", "nastran", "permas",
                    "su2", "tetgen", "ugrid", "avsucd", "med", "mdpa"}


def _check_format_holds_fields(path: Path, fmt: str, point_data: Mapping,
                               cell_data: Mapping) -> None:
    """Refuse to write fields into a format that silently drops them."""
    if fmt in FIELD_FORMATS:
        fits = _COMPONENTS[fmt]
        arrays = [("point", k, v) for k, v in point_data.items()]
        arrays += [("cell", k, a) for k, v in cell_data.items() for a in v[:1]]
        for where, k, v in arrays:
            c = int(np.prod(v.shape[1:], dtype=np.int64))
            if not fits(c):
                ok = [f for f, test in _COMPONENTS.items() if test(c)]
                shape = f" ({'x'.join(map(str, v.shape[1:]))})" if v.ndim > 2 else ""
                raise MeshError(
                    f"{path}: the {fmt} format cannot hold the {where} field {k!r} of "
                    f"{c} components per {where}{shape}: it would read back as another "
                    f"field; write "
                    f"{', '.join(sorted({FIELD_FORMATS[f] for f in ok}))} instead")
        return
    lost = [f"point field {k!r}" for k in point_data if not _reader_tag(k)]
    lost += [f"cell field {k!r}" for k in cell_data if not _reader_tag(k)]
    if lost:
        raise MeshError(
            f"{path}: the {fmt} format cannot hold fields, so {', '.join(lost)} would be "
            f"lost; write {', '.join(sorted(set(FIELD_FORMATS.values())))} instead")


def _meshio_mesh(path: Path, mesh: MeshData, point_data) -> "meshio.Mesh":
    """``mesh`` with its fields and ``point_data`` as a :class:`meshio.Mesh`: points in
    3-D, a cloud as vertex cells with its weights, tensors as their components."""
    pos = _numpy(mesh.pos).astype(np.float64, copy=False)
    n = len(pos)
    cells = getattr(mesh, "cells", None)
    if not cells:  # a point cloud: one vertex cell per point, so ParaView shows it
        cells = [("vertex", np.arange(n)[:, None])]
    data = {k: _numpy(v) for k, v in (getattr(mesh, "fields", None) or {}).items()}
    for k, v in (point_data or {}).items():
        v = _numpy(v)
        if len(v) != n:
            raise MeshError(f"{path}: point_data {k!r} has {len(v)} values but the mesh has "
                            f"{n} points")
        data[k] = v
    if all(t == "vertex" for t, _ in cells):  # keep a cloud's weights in the file
        data[WEIGHT_FIELD] = _numpy(mesh.weight)
    if pos.shape[1] < 3:  # most formats store 3-D points
        pos = np.hstack([pos, np.zeros((n, 3 - pos.shape[1]))])
    cell_data = {k: [_numpy(a) for a in v]
                 for k, v in (getattr(mesh, "cell_data", None) or {}).items()}
    # Tensors as their components (no format keeps more than one axis per point).
    data = {k: v.reshape(len(v), -1) if v.ndim > 2 else v for k, v in data.items()}
    cell_data = {k: [a.reshape(len(a), -1) if a.ndim > 2 else a for a in v]
                 for k, v in cell_data.items()}
    return meshio.Mesh(pos, [(t, _numpy(c)) for t, c in cells], point_data=data,
                       cell_data=cell_data)


def _format_of(path: Path) -> str:
    """meshio's format name for ``path``'s suffix."""
    types = meshio.extension_to_filetypes.get(path.suffix.lower())
    if not types:
        raise MeshError(f"{path}: cannot tell the mesh format from the suffix "
                        f"{path.suffix!r}; pass file_format")
    # ".msh" is both ANSYS and Gmsh to meshio; Gmsh is what this field means by
    # it. Gmsh 2.2 (read by every Gmsh and FEniCS tool) stores mixed cell types
    # without the entity tags that meshio's 4.1 writer demands.
    return "gmsh22" if "gmsh" in types else types[0]


def write_mesh(path: str | os.PathLike, mesh: MeshData,
               point_data: Mapping[str, "torch.Tensor | np.ndarray"] | None = None,
               file_format: str | None = None) -> Path:
    """Write a mesh with its fields (plus ``point_data``) through meshio, atomically.

    The file is written to a temporary file in the target folder and renamed over
    ``path`` only once complete, so a failure never leaves a half-written file.
    XDMF is written with inline XML data so that it is a single file.

    Args:
        path: Output file; the format follows the suffix (.vtu, .vtk, .xdmf, .msh, ...).
        mesh: Mesh with ``pos`` and ``cells`` (e.g. from :func:`read_mesh`).
        point_data: Extra point fields ``[N]``, ``[N, c]`` or ``[N, a, b]``, e.g.
            predictions; they override fields of the same name. A field of more than
            one axis per point (a 3x3 tensor) is written as its ``a * b`` components,
            row-major, as VTK stores tensors, and reads back as ``[N, a * b]``.
        file_format: meshio format name when the suffix is ambiguous.

    Returns:
        The written path.

    Raises:
        MeshError: a format that cannot hold the mesh's fields or ``point_data``
            (STL, OBJ, OFF, PLY, ...; see :data:`FIELD_FORMATS`), or not with their
            number of components (legacy .vtk: not 2; .xdmf: 1, 2, 3, 6 or 9; Gmsh
            .msh: 1, 3 or 9; .vtu holds any), a ``point_data`` array of the wrong
            length, or a failed write. Nothing is written then.
    """
    path = Path(path)
    out = _meshio_mesh(path, mesh, point_data)
    data, cell_data = out.point_data, out.cell_data
    fmt = file_format or _format_of(path)
    _check_format_holds_fields(path, fmt, data, cell_data)
    # Inline XML keeps XDMF a single file, so the rename below is atomic for it too.
    kwargs = {"data_format": "XML"} if fmt == "xdmf" else {}

    def write(tmp: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meshio.write(tmp, out, file_format=fmt, **kwargs)

    try:
        atomic_write(path, write)
    except MeshError:
        raise
    except Exception as e:
        raise MeshError(f"{path}: writing failed ({type(e).__name__}: {e})") from e
    return path
