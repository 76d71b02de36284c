"""Surface meshes (STL/OBJ/PLY/OFF/GLB) for geometry-as-input problems.

A closed triangulated surface (a car body, an airfoil section extruded to 3-D, a
bone) is the *input* of many operator-learning problems: the network predicts a
field around or on the body. This module turns such a surface into the pieces the
rest of meshops consumes:

* :func:`read_surface` loads the file with trimesh and checks it;
* :func:`surface_to_meshdata` / :func:`surface_weights` give the surface as a
  :class:`~meshops.mesh.data.MeshData` with a nodal quadrature rule on the surface;
* :func:`sample_surface` gives a Monte Carlo point cloud of the surface;
* :func:`signed_distance` / :func:`geometry_features` describe volume query
  points relative to the body (negative inside, positive outside).

Everything is computed in float64 on the CPU (trimesh is a numpy library); results
are torch tensors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import numpy as np
import torch
import trimesh

from meshops.errors import MeshError
from meshops.mesh._overlap import first_duplicate
from meshops.mesh.data import MeshData

__all__ = [
    "SURFACE_FORMATS",
    "GEOMETRY_FEATURE_NAMES",
    "read_surface",
    "surface_weights",
    "surface_to_meshdata",
    "sample_surface",
    "signed_distance",
    "geometry_features",
]

#: File extensions :func:`read_surface` accepts. trimesh reads more (volume formats
#: through meshio, 2-D paths, point clouds), but none of those is a triangulated
#: surface, so they are refused up front with a clear message instead of failing
#: later as "no triangles".
SURFACE_FORMATS: tuple[str, ...] = ("stl", "obj", "ply", "off", "glb", "gltf")

#: Column names of :func:`geometry_features`, in order.
GEOMETRY_FEATURE_NAMES: tuple[str, ...] = ("signed_distance", "inside", "dir_x", "dir_y", "dir_z")

# A face counts as degenerate when twice its area is below this many machine
# epsilons times its longest edge squared: the cross product of its edges is then
# pure rounding noise, so its normal (and any sign derived from it) is meaningless.
# The test is per face and scale-free, so millimetre and kilometre models behave alike.
_DEGENERATE_EPS_FACTOR = 8.0

# Query points closer than this fraction of the surface's scale count as lying on
# the surface: their sign from ray parity is unreliable and their direction to the
# closest point is rounding noise, so both are set to zero.
_ON_SURFACE_RTOL = 1e-12

PathLike = Union[str, os.PathLike]
ArrayLike = Union[torch.Tensor, np.ndarray]


# --------------------------------------------------------------------------- checks
def _surface_name(surface: trimesh.Trimesh) -> str:
    """Name used in error messages: the file the surface came from, if known."""
    meta = getattr(surface, "metadata", None) or {}
    return str(meta.get("file_path") or "<trimesh.Trimesh>")


def _check_arrays(vertices: np.ndarray, faces: np.ndarray, name: str) -> None:
    """Raise :class:`MeshError` for a surface that cannot carry a quadrature rule."""
    if faces.ndim != 2 or faces.shape[0] == 0:
        raise MeshError(f"{name}: the surface has no triangles")
    if faces.shape[1] != 3:
        raise MeshError(f"{name}: faces must be triangles, got {faces.shape[1]} vertices per face")
    if faces.min() < 0 or faces.max() >= len(vertices):
        raise MeshError(f"{name}: face indices out of range for {len(vertices)} vertices")
    bad = ~np.isfinite(vertices).all(axis=1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise MeshError(
            f"{name}: {int(bad.sum())} vertices have NaN/inf coordinates "
            f"(first: vertex {first} = {vertices[first].tolist()})")
    tri = vertices[faces]
    edges = np.stack([tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 1], tri[:, 0] - tri[:, 2]], axis=1)
    longest_sq = (edges ** 2).sum(-1).max(axis=1)
    twice_area = np.linalg.norm(np.cross(edges[:, 0], -edges[:, 2]), axis=1)
    degenerate = twice_area <= _DEGENERATE_EPS_FACTOR * np.finfo(np.float64).eps * longest_sq
    if degenerate.any():
        first = int(np.flatnonzero(degenerate)[0])
        raise MeshError(
            f"{name}: face {first} is degenerate (zero area; vertices "
            f"{faces[first].tolist()} are coincident or collinear), "
            f"{int(degenerate.sum())} degenerate faces in all; remove them, e.g. with "
            f"mesh.update_faces(mesh.nondegenerate_faces())")


def _check_repeated_faces(vertices: np.ndarray, faces: np.ndarray, name: str) -> None:
    """A face listed twice (any vertex order) counts its area twice."""
    dup = first_duplicate(faces, len(vertices))
    if dup is not None:
        a, b, n = dup
        raise MeshError(
            f"{name}: face {b} (vertices {faces[b].tolist()}) repeats face {a}, "
            f"{n} repeated faces in all; remove them, e.g. with "
            f"mesh.update_faces(mesh.unique_faces())")


def _as_surface_arrays(surface: trimesh.Trimesh) -> tuple[np.ndarray, np.ndarray, str]:
    """Validated ``(vertices float64 [V,3], faces int64 [F,3], name)`` of a trimesh."""
    if not isinstance(surface, trimesh.Trimesh):
        raise TypeError(f"expected a trimesh.Trimesh, got {type(surface).__name__}")
    name = _surface_name(surface)
    vertices = np.asarray(surface.vertices, dtype=np.float64)
    faces = np.asarray(surface.faces, dtype=np.int64).reshape(-1, 3)
    _check_arrays(vertices, faces, name)
    _check_repeated_faces(vertices, faces, name)
    return vertices, faces, name


def _merge_exact(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge bit-identical vertices and drop unreferenced ones, keeping file order.

    STL stores every triangle with its own copy of its corners, so without merging
    no two triangles share a vertex: weights would be per corner and the surface
    would never be watertight. Only *exact* duplicates are merged (trimesh's own
    merge rounds to an absolute 1e-8, which fuses distinct vertices of a model
    whose features are below 1e-8 units, e.g. nanometres written as metres);
    well-formed files repeat shared corners bit for bit. Order of first use is kept so that
    OBJ/PLY vertex indices survive when there is nothing to merge.
    """
    used = np.unique(faces)
    # +0.0 turns -0.0 into 0.0, which np.unique would otherwise keep apart.
    pts = vertices[used] + 0.0
    _, first, inverse = np.unique(pts, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    # Renumber unique rows by their first appearance instead of lexicographic order.
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    old_to_used = np.full(len(vertices), -1, dtype=np.int64)
    old_to_used[used] = np.arange(len(used))
    new_faces = rank[inverse[old_to_used[faces]]]
    new_vertices = pts[first[order]]
    return new_vertices, new_faces.astype(np.int64)


# ----------------------------------------------------------------------------- read
def _triangles(loaded, name: str, ext: str) -> tuple[np.ndarray, np.ndarray]:
    """``(vertices [V, 3], faces [F, 3])`` of what trimesh loaded: one mesh, or every
    mesh of a scene; a file without triangles is refused."""
    if isinstance(loaded, trimesh.Scene):
        meshes = ([g for g in loaded.dump() if isinstance(g, trimesh.Trimesh)]
                  if loaded.geometry else [])
        if not meshes:
            raise MeshError(f"{name}: the file holds no triangles (empty, or not a valid "
                            f".{ext} file)")
        vertices = np.concatenate([np.asarray(m.vertices, dtype=np.float64) for m in meshes])
        offsets = np.cumsum([0] + [len(m.vertices) for m in meshes[:-1]])
        faces = np.concatenate([np.asarray(m.faces, dtype=np.int64).reshape(-1, 3) + o
                                for m, o in zip(meshes, offsets)])
        return vertices, faces
    if isinstance(loaded, trimesh.Trimesh):
        return (np.asarray(loaded.vertices, dtype=np.float64),
                np.asarray(loaded.faces, dtype=np.int64).reshape(-1, 3))
    # PointCloud, Path2D/3D: a valid file, but not a triangulated surface
    raise MeshError(f"{name}: the file holds no triangles (got a {type(loaded).__name__})")


def read_surface(path: PathLike) -> trimesh.Trimesh:
    """Load a triangulated surface from an STL, OBJ, PLY, OFF, GLB or glTF file.

    Only the geometry is kept (no colours, textures or file normals): bit-identical
    vertices are merged (STL stores each triangle's corners separately) and
    vertices used by no face are dropped, otherwise vertex order follows the file.
    A file with several geometries (a GLB/glTF scene, an OBJ with several objects)
    is **concatenated into one mesh**, with each node's scene transform applied;
    face indices in error messages count faces in that concatenated order. Face
    winding is kept as in the file (see :func:`surface_to_meshdata` on normals).

    Args:
        path: File to read; the format is taken from the extension.

    Returns:
        The surface; ``surface.metadata["file_path"]`` is ``str(path)`` and is used
        as the ``source`` of :func:`surface_to_meshdata` and in error messages.

    Raises:
        MeshError: If the file is missing, its extension is not a surface format,
            it cannot be parsed, it holds no triangles, a vertex is NaN/inf, a
            face has zero area or repeats another face (the message names the
            first such face).

    Shapes:
        - returned ``vertices``: ``[V, 3]`` float64
        - returned ``faces``: ``[F, 3]`` int64

    Example:
        >>> body = read_surface("car.stl")
        >>> body.is_watertight
        True
    """
    name = str(path)
    p = Path(path)
    if not p.is_file():
        raise MeshError(f"{name}: no such file")
    ext = p.suffix.lower().lstrip(".")
    if ext not in SURFACE_FORMATS:
        raise MeshError(
            f"{name}: unknown surface format '.{ext}' (supported: "
            f"{', '.join('.' + e for e in SURFACE_FORMATS)}); volume meshes are read with meshio")
    try:
        # process=False: trimesh's processing silently drops faces touching NaN
        # vertices and merges at an absolute tolerance; we check first, then merge.
        loaded = trimesh.load(str(p), file_type=ext, process=False)
    except Exception as exc:  # trimesh's loaders raise anything from KeyError to struct.error
        raise MeshError(f"{name}: could not be read as .{ext}: {type(exc).__name__}: "
                        f"{exc}") from exc

    vertices, faces = _triangles(loaded, name, ext)
    _check_arrays(vertices, faces, name)
    vertices, faces = _merge_exact(vertices, faces)
    _check_repeated_faces(vertices, faces, name)  # STL repeats only show once merged
    surface = trimesh.Trimesh(vertices=vertices, faces=faces, process=False)
    surface.metadata["file_path"] = name
    return surface


# ------------------------------------------------------------------------ quadrature
def surface_weights(surface: trimesh.Trimesh) -> torch.Tensor:
    """Nodal quadrature weights on a triangulated surface.

    ``weight[v]`` is one third of the summed (true 3-D, not projected) area of the
    triangles incident to ``v``: the integral of the piecewise-linear hat function
    of ``v``. The rule therefore integrates every function that is linear on each
    triangle exactly over the *triangulated* surface, and is second-order accurate
    for smooth functions on a smooth surface. ``weight.sum()`` is the total area.

    Args:
        surface: A triangulated surface (e.g. from :func:`read_surface`).

    Returns:
        Weights, float64.

    Raises:
        MeshError: If the surface has no triangles, NaN/inf vertices,
            zero-area faces or repeated faces.

    Shapes:
        - ``surface.vertices``: ``[V, 3]``
        - return: ``[V]``
    """
    vertices, faces, _ = _as_surface_arrays(surface)
    return torch.from_numpy(_nodal_weights(vertices, faces))


def _nodal_weights(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    tri = vertices[faces]
    area = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    return np.bincount(faces.reshape(-1), weights=np.repeat(area / 3.0, 3), minlength=len(vertices))


def surface_to_meshdata(surface: trimesh.Trimesh, source: str | None = None) -> MeshData:
    """The surface's vertices as a :class:`MeshData` with nodal weights and normals.

    Args:
        surface: A triangulated surface (e.g. from :func:`read_surface`).
        source: Recorded as ``MeshData.source``; defaults to the file the surface was
            read from (``surface.metadata["file_path"]``), if any.

    Returns:
        ``MeshData`` with ``pos`` the vertices, ``weight`` from
        :func:`surface_weights`, ``cells=[("triangle", faces)]`` and
        ``fields={"normal": vertex normals}``. Vertex normals are trimesh's
        area/angle-weighted averages of the incident face normals, so they point
        the way the faces are wound: outward only if the file winds its faces
        counter-clockwise seen from outside (fix with ``trimesh.repair.fix_normals``).

    Raises:
        MeshError: If the surface has no triangles, NaN/inf vertices,
            zero-area faces or repeated faces.

    Shapes:
        - ``pos``: ``[V, 3]`` float64
        - ``weight``: ``[V]`` float64
        - ``fields["normal"]``: ``[V, 3]`` float64, unit length
        - ``cells[0][1]``: ``[F, 3]`` int64
    """
    vertices, faces, _ = _as_surface_arrays(surface)
    if source is None:
        source = (surface.metadata or {}).get("file_path")
    normals = np.asarray(surface.vertex_normals, dtype=np.float64)
    return MeshData(
        pos=torch.from_numpy(vertices.copy()),
        weight=torch.from_numpy(_nodal_weights(vertices, faces)),
        fields={"normal": torch.from_numpy(normals.copy())},
        cells=[("triangle", torch.from_numpy(faces.copy()))],
        source=source,
    )


def sample_surface(surface: trimesh.Trimesh, num_points: int, seed: int = 0) -> MeshData:
    """Monte Carlo point cloud of the surface, area-uniform, with its quadrature rule.

    Points are drawn independently and uniformly with respect to area using
    ``trimesh.sample.sample_surface`` (a face chosen with probability proportional
    to its area, then a uniform point in it). ``trimesh.sample.sample_surface_even``
    is *not* used: its rejection step may return fewer points than requested and
    biases the density away from area-uniform, which would break the weights.
    Each point gets weight ``area / num_points``, so ``integrate(f)`` is an
    unbiased estimate of the surface integral with standard error
    ``area * std(f) / sqrt(num_points)``.

    Args:
        surface: A triangulated surface.
        num_points: Number of points; exactly this many are returned.
        seed: Seed of the random generator; the same seed gives the same points.

    Returns:
        ``MeshData`` with ``pos``, ``weight``, ``fields={"normal": normal of the
        face each point lies on}`` and ``source``; no cells (a point cloud).

    Raises:
        MeshError: If the surface has no triangles, NaN/inf vertices,
            zero-area faces or repeated faces.
        ValueError: If ``num_points`` is not a positive integer.

    Shapes:
        - ``pos``: ``[num_points, 3]`` float64
        - ``weight``: ``[num_points]`` float64
        - ``fields["normal"]``: ``[num_points, 3]`` float64
    """
    if isinstance(num_points, bool) or not isinstance(num_points, (int, np.integer)) \
            or num_points < 1:
        raise ValueError(f"num_points must be a positive integer, got {num_points!r}")
    vertices, faces, _ = _as_surface_arrays(surface)
    points, face_index = trimesh.sample.sample_surface(surface, int(num_points), seed=seed)
    if len(points) != num_points:  # guards a future trimesh change of contract
        raise RuntimeError(f"trimesh returned {len(points)} samples, expected {num_points}")
    area = float(_nodal_weights(vertices, faces).sum())
    normals = np.asarray(surface.face_normals, dtype=np.float64)[face_index]
    return MeshData(
        pos=torch.from_numpy(np.asarray(points, dtype=np.float64)),
        weight=torch.full((int(num_points),), area / num_points, dtype=torch.float64),
        fields={"normal": torch.from_numpy(np.ascontiguousarray(normals))},
        source=(surface.metadata or {}).get("file_path"),
    )


# ------------------------------------------------------------------- signed distance
def _check_query(query: ArrayLike, name: str) -> tuple[np.ndarray, torch.device]:
    if isinstance(query, torch.Tensor):
        device = query.device
        arr = query.detach().cpu().to(torch.float64).numpy()
    else:
        device = torch.device("cpu")
        arr = np.asarray(query, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise MeshError(f"{name}: query points must have shape [M, 3], got {list(arr.shape)}")
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        raise MeshError(
            f"{name}: {int(bad.sum())} query points are NaN/inf (first: row "
            f"{int(np.flatnonzero(bad)[0])})")
    return arr, device


def _closest_and_inside(surface: trimesh.Trimesh, query: ArrayLike):
    """Closest surface points, unsigned distances and inside flags of query points.

    The sign comes from ray parity (``surface.contains``), not from face normals as
    in trimesh's ``proximity.signed_distance``, so it is right whatever the
    winding of the faces. Needs only ``rtree`` (trimesh falls back to its pure
    numpy ray tracer without ``embreex``).
    """
    _, _, name = _as_surface_arrays(surface)
    points, device = _check_query(query, name)
    if not surface.is_watertight:
        raise MeshError(
            f"{name}: signed distance needs a closed surface but the mesh is not watertight "
            f"(it has boundary or non-manifold edges); close it first, e.g. with "
            f"trimesh.repair.fill_holes(mesh)")
    if len(points) == 0:
        empty = np.zeros((0, 3))
        return points, empty, np.zeros(0), np.zeros(0, dtype=bool), device
    closest, distance, _ = trimesh.proximity.closest_point(surface, points)
    distance = np.asarray(distance, dtype=np.float64)
    off_surface = distance > _ON_SURFACE_RTOL * float(surface.scale)
    inside = np.zeros(len(points), dtype=bool)
    if off_surface.any():
        inside[off_surface] = surface.contains(points[off_surface])
    distance = np.where(off_surface, distance, 0.0)
    return points, np.asarray(closest, dtype=np.float64), distance, inside, device


def signed_distance(surface: trimesh.Trimesh, query: ArrayLike) -> torch.Tensor:
    """Signed distance from query points to a closed surface.

    Convention: **negative inside, positive outside** (the level-set convention;
    trimesh's ``proximity.signed_distance`` returns the opposite sign). The
    magnitude is the exact distance to the triangulated surface; points within
    ``1e-12 * surface.scale`` of it get exactly 0.

    Args:
        surface: A watertight triangulated surface.
        query: Query points (tensor or array, any float dtype).

    Returns:
        Signed distances, float64, on ``query``'s device if it is a tensor.

    Raises:
        MeshError: If the surface is not watertight, is invalid (see
            :func:`surface_weights`), or ``query`` is not ``[M, 3]`` or has NaN/inf.

    Shapes:
        - ``query``: ``[M, 3]``
        - return: ``[M]``
    """
    _, _, distance, inside, device = _closest_and_inside(surface, query)
    sd = np.where(inside, -distance, distance)
    return torch.from_numpy(sd).to(device)


def geometry_features(surface: trimesh.Trimesh, query: ArrayLike) -> torch.Tensor:
    """Per-point features of query points around a closed body.

    Columns (also in :data:`GEOMETRY_FEATURE_NAMES`):

    - 0, ``signed_distance``: as :func:`signed_distance` (negative inside);
    - 1, ``inside``: 1.0 inside the body, 0.0 outside or on the surface
      (equivalently ``signed_distance < 0``);
    - 2-4, ``dir_x, dir_y, dir_z``: unit vector from the query point towards its
      closest surface point, so ``query + |sd| * dir`` is that point; all zero
      where the distance is zero.

    Args:
        surface: A watertight triangulated surface.
        query: Query points (tensor or array).

    Returns:
        Features, float64, on ``query``'s device if it is a tensor.

    Raises:
        MeshError: As :func:`signed_distance`.

    Shapes:
        - ``query``: ``[M, 3]``
        - return: ``[M, 5]``
    """
    points, closest, distance, inside, device = _closest_and_inside(surface, query)
    sd = np.where(inside, -distance, distance)
    direction = np.zeros_like(points)
    nonzero = distance > 0
    # Divide by the norm of the actual offset, not by `distance`, so the vector is
    # unit to rounding even where trimesh's distance and offset differ in the last bit.
    offset = closest[nonzero] - points[nonzero]
    direction[nonzero] = offset / np.linalg.norm(offset, axis=1, keepdims=True)
    feats = np.concatenate([sd[:, None], inside[:, None].astype(np.float64), direction], axis=1)
    return torch.from_numpy(feats).to(device)
