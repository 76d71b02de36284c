"""**Stand-in** for the Geo-FNO Elasticity benchmark, generated offline.

NOT the benchmark: synthetic data of the same kind, so that examples and tests run
without the (non-redistributable) Geo-FNO files. Each sample is:

* **Geometry**: the unit cell ``[0, 1]^2`` with a star-shaped void centred at
  ``(0.5, 0.5)``, radius ``r(theta) = r0 + sum_{k=1..5} (a_k cos k theta + b_k sin k theta)``
  with ``r0 ~ U(0.2, 0.3)`` and ``a_k, b_k ~ N(0, (0.05 / k^1.5)^2)``; if ``r`` leaves
  ``[0.15, 0.4]`` the Fourier part is scaled down until it fits, so the void stays
  well inside the cell (at least 0.1 from its sides). ``params = [r0, a_1..a_5,
  b_1..b_5]`` (``[1, 11]``) are the parameters after that scaling.
* **Mesh**: a conforming triangle mesh from the ``triangle`` library (quality
  meshing, minimum angle 30 degrees) with target edge lengths ``h_void`` on the
  void's polygon and ``h_outer`` on the cell's sides, so that, as in the benchmark,
  the points are denser near the void; about 1000 nodes by default (the benchmark
  has 972). The samples keep their cells (quadrature weights come from the
  triangles, not from a point-cloud estimate) and their node count varies a little
  from sample to sample.
* **Physics**: plane-strain *linear* elasticity (Geo-FNO's data are for an
  incompressible Rivlin-Saunders hyperelastic material; we use linear elasticity
  with ``E = 1``, ``nu = 0.3``), solved with P1 finite elements in scikit-fem
  (:mod:`data_adapters.standins.fem`): bottom edge clamped, top edge pulled by a
  uniform traction ``(0, 1)``, sides and void traction free. Stresses are in units of
  the applied traction.
* **Target**: the nodal von Mises stress (plane strain, with ``sigma_zz``), from the
  consistent L2 projection of the element stresses, as ``fields["sigma"]`` (the same
  name as the Geo-FNO reader, so examples can switch).

Every sample has ``standin=True`` and a ``source`` that says "stand-in".
"""

from __future__ import annotations

import math

import numpy as np
import torch

from data_adapters._geometry import (
    band_around,
    closed_polygon,
    polygon_distance,
    star_polygon,
    triangulate_loops,
)
from data_adapters.standins._cache import describe, generate_or_load
from data_adapters.standins.fem import nodal_stress, solve_plane_strain, von_mises_plane_strain
from meshops.datasets.folder import add_inputs_targets, as_float_dtype
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays
from meshops.utils.progress import progress as progress_bar

GENERATOR = "elasticity"
VERSION = 1
NUM_MODES = 5
CENTER = (0.5, 0.5)


def void_radius(theta, params) -> np.ndarray:
    """``r(theta)`` of a void with ``params = [r0, a_1..a_K, b_1..b_K]``.

    Shapes:
        theta ``[T]``, params ``[2K + 1]`` -> ``[T]``
    """
    params = np.asarray(params, dtype=np.float64)
    K = (len(params) - 1) // 2
    k = np.arange(1, K + 1)
    th = np.asarray(theta, dtype=np.float64)[:, None]
    return params[0] + (np.cos(k * th) @ params[1:K + 1]) + (np.sin(k * th) @ params[K + 1:])


def sample_void_params(rng: np.random.Generator, r0_range=(0.2, 0.3), amplitude: float = 0.05,
                       r_range=(0.15, 0.4), num_modes: int = NUM_MODES) -> np.ndarray:
    """Draw ``[r0, a_1..a_K, b_1..b_K]`` with ``r`` inside ``r_range`` (see the module doc)."""
    r0 = rng.uniform(*r0_range)
    k = np.arange(1, num_modes + 1)
    ab = rng.normal(size=(2, num_modes)) * (amplitude / k ** 1.5)
    theta = np.linspace(0.0, 2 * np.pi, 720, endpoint=False)
    pert = void_radius(theta, np.r_[0.0, ab.ravel()])
    lo, hi = pert.min(), pert.max()
    scale = 1.0
    if r0 + hi > r_range[1]:
        scale = min(scale, (r_range[1] - r0) / hi)
    if r0 + lo < r_range[0]:
        scale = min(scale, (r_range[0] - r0) / lo)
    return np.r_[r0, scale * ab.ravel()]


def mesh_unit_cell(params, h_void: float = 0.012, h_outer: float = 0.047,
                   min_angle: float = 30.0, ring: int = 1,
                   band: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Triangle mesh of the unit cell minus the void (``triangle`` library).

    Args:
        params: Void parameters ``[r0, a.., b..]`` (:func:`void_radius`); a circular
            hole of radius ``R`` is ``[R]`` padded with zeros.
        h_void: Target edge length on the void's boundary polygon.
        h_outer: Target edge length on the cell's sides; also sets the maximum
            triangle area ``sqrt(3)/4 h_outer^2``.
        min_angle: Minimum angle of the quality mesh (degrees).
        ring: A graded re-mesh: the band of width ``band`` around the void with
            triangles ``ring`` times smaller in area (edges ``h_void / sqrt(ring)``).
        band: Width of that band, along the rays from the void's centre.

    Returns:
        ``(points [N, 2], triangles [M, 3])``.
    """
    if ring > 1 and not band > 0:
        raise ValueError(f"mesh_unit_cell: a refined ring needs a band width > 0, got {band!r}")
    r_dense = void_radius(np.linspace(0.0, 2 * np.pi, 2048, endpoint=False), params)
    if r_dense.min() <= 0 or r_dense.max() >= 0.5:
        raise MeshError(f"void radius must stay in (0, 0.5), got {r_dense.min():.3g}.."
                        f"{r_dense.max():.3g}")
    fine = h_void / math.sqrt(ring)
    void = closed_polygon(lambda t: void_radius(t, params), CENTER, fine)
    n_side = max(2, math.ceil(1.0 / h_outer))
    s = np.arange(n_side) / n_side
    o, z = np.ones(n_side), np.zeros(n_side)
    square = np.concatenate([np.stack([s, z], 1), np.stack([o, s], 1),
                             np.stack([1 - s, o], 1), np.stack([z, 1 - s], 1)])
    loops, regions = [square, void], []
    if ring > 1:
        edge, seed = band_around(lambda t: void_radius(t, params), CENTER, band, fine)
        loops.append(edge)
        regions.append((seed, math.sqrt(3) / 4 * fine * fine))
    return triangulate_loops(loops, [CENTER], math.sqrt(3) / 4 * h_outer ** 2, min_angle,
                             regions)


def solve_sample(params, h_void: float = 0.012, h_outer: float = 0.047, E: float = 1.0,
                 nu: float = 0.3, traction: float = 1.0, ring: int = 1, band: float = 0.0):
    """Mesh (:func:`mesh_unit_cell`) and solve one unit cell.

    Returns:
        ``(points [N, 2], triangles [M, 3], sigma_vm [N])``.
    """
    points, tri = mesh_unit_cell(params, h_void, h_outer, ring=ring, band=band)
    u = solve_plane_strain(points, tri, E, nu, traction, support="clamped")
    vm = von_mises_plane_strain(nodal_stress(points, tri, u, E, nu), nu)
    return points, tri, vm


def _generate(num_samples: int, seed: int, cfg: dict, progress: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = np.stack([sample_void_params(rng) for _ in range(num_samples)]) \
        if num_samples else np.zeros((0, 2 * NUM_MODES + 1))
    params = params[cfg.get("first", 0):]
    pts, tris, sig, wts, npts, ntri = [], [], [], [], [0], [0]
    for prm in progress_bar(params, desc="elasticity STAND-IN (FEM, not Geo-FNO)",
                            enabled=progress, leave=False):
        p, t, s = solve_sample(prm, cfg["h_void"], cfg["h_outer"], cfg["E"], cfg["nu"],
                               cfg["traction"], cfg.get("ring", 1), cfg.get("band", 0.0))
        # Validated once here (no degenerate triangles) and cached.
        wts.append(mesh_from_arrays(p, [("triangle", t)],
                                    source=f"elasticity stand-in sample {len(wts)}").weight.numpy())
        pts.append(p)
        tris.append(t.astype(np.int32))
        sig.append(s)
        npts.append(npts[-1] + len(p))
        ntri.append(ntri[-1] + len(t))
    return {
        "points": np.concatenate(pts) if pts else np.zeros((0, 2)),
        "triangles": np.concatenate(tris) if tris else np.zeros((0, 3), np.int32),
        "sigma": np.concatenate(sig) if sig else np.zeros(0),
        "weight": np.concatenate(wts) if wts else np.zeros(0),
        "point_offsets": np.asarray(npts, np.int64),
        "cell_offsets": np.asarray(ntri, np.int64),
        "params": params,
    }


def _build(arrays: dict, seed: int, dtype: torch.dtype,
           void_distance: bool = False, first: int = 0, mesh_note: str = "") -> list[MeshData]:
    out = []
    po, co = arrays["point_offsets"], arrays["cell_offsets"]
    for j in range(len(po) - 1):
        k = first + j  # the sample's place in the draw
        points = arrays["points"][po[j]:po[j + 1]]
        tri = arrays["triangles"][co[j]:co[j + 1]].astype(np.int64)
        source = (f"stand-in:elasticity v{VERSION} seed={seed} sample={k}{mesh_note} "
                  "(P1 FEM, not Geo-FNO)")
        fields = {"sigma": torch.from_numpy(arrays["sigma"][po[j]:po[j + 1]].copy())}
        if void_distance:
            prm = arrays["params"][j]
            polygon = star_polygon(lambda t: void_radius(t, prm), CENTER)
            fields["void_distance"] = torch.from_numpy(polygon_distance(points, polygon))
        mesh = MeshData(pos=torch.from_numpy(points.copy()),
                        weight=torch.from_numpy(arrays["weight"][po[j]:po[j + 1]].copy()),
                        fields=fields, cells=[("triangle", torch.from_numpy(tri))],
                        cell_data={}, source=source)
        inputs = ["void_distance"] if void_distance else []
        out.append(add_inputs_targets(mesh, inputs, ["sigma"], dtype, sample_id=k, standin=True,
                                      params=torch.from_numpy(arrays["params"][j].copy())[None]))
    return out


def make_elasticity_standin(num_samples: int = 200, seed: int = 0, cache_dir=None,
                            progress: bool = True, *, dtype=torch.float32,
                            h_void: float = 0.012, h_outer: float = 0.047, E: float = 1.0,
                            nu: float = 0.3, traction: float = 1.0,
                            void_distance: bool = False, first: int = 0, ring: int = 1,
                            band: float = 0.006) -> list[MeshData]:
    """Generate (or load from the cache) the Elasticity **stand-in** data set.

    See the module docstring for the geometry, mesh, physics and target. The data
    are deterministic in ``seed`` (and the other arguments): the same arguments give
    byte-identical cache files; loading the cache is much faster than generating.

    Args:
        num_samples: Number of unit cells.
        seed: Seed of the random void shapes.
        cache_dir: Cache folder; ``None``: ``$MESHOPS_CACHE/standins`` or
            ``~/.cache/meshops/standins``; ``False``: no cache.
        progress: Print what was generated/loaded (stderr), with a tqdm bar on a terminal.
        dtype: Floating dtype of the returned tensors.
        h_void, h_outer: Mesh sizes on the void and on the cell's sides (defaults
            give about 1000 nodes).
        E, nu, traction: Material and load.
        void_distance: Add ``fields["void_distance"]``, each point's distance to the
            void's boundary, and use it as the input ``x [N, 1]`` (the stress
            concentrates on that boundary; see :mod:`data_adapters._geometry`).
        first: Only the samples ``first..num_samples - 1`` of the same draw (e.g. the
            test shapes alone, meshed again).
        ring, band: A graded re-mesh: the band of width ``band`` around the void
            refined ``ring`` times in area (:func:`mesh_unit_cell`); the default band is
            half of ``h_void``, about one layer of the default meshes' triangles.

    Returns:
        ``list[MeshData]``: ``pos [N, 2]``, ``weight [N]`` (from the triangles),
        ``cells = [("triangle", [M, 3])]``, ``fields = {"sigma": [N]}``, ``x [N, 0]``,
        ``y [N, 1]`` (sigma), ``params [1, 11]``, ``standin=True``, ``sample_id``,
        ``source``.

    Shapes:
        item: pos ``[N, 2]``, weight ``[N]``, x ``[N, 0]`` (``[N, 1]`` with
        ``void_distance``), y ``[N, 1]``, params ``[1, 11]``
    """
    dtype = as_float_dtype(dtype)
    cfg = {"h_void": float(h_void), "h_outer": float(h_outer), "E": float(E), "nu": float(nu),
           "traction": float(traction), "num_modes": NUM_MODES}
    if not (isinstance(ring, int) and ring >= 1 and 0 <= first <= num_samples):
        raise ValueError(f"make_elasticity_standin: ring must be a positive integer and "
                         f"0 <= first <= num_samples, got ring={ring!r}, first={first}")
    # the keys of the plain sets' cache files stay as they were
    cfg.update({"first": int(first)} if first else {})
    cfg.update({"ring": ring, "band": float(band)} if ring > 1 else {})
    meta = describe(GENERATOR, VERSION, cfg, seed, num_samples)
    arrays, _ = generate_or_load(meta, lambda: _generate(num_samples, seed, cfg, progress),
                                 cache_dir, progress, "elasticity")
    return _build(arrays, seed, dtype, void_distance, first,
                  f", band refined {ring}x" if ring > 1 else "")
