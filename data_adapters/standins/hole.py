"""A parametric FEM **stand-in** whose geometry changes with the parameters: a
heated plate with a cooled circular hole, one mesh per sample.

Synthetic data. Sample ``s`` solves, with P1 finite elements (scikit-fem), on the
unit square minus a disc ``|x - c| < r``,

    -laplace(u) = 1                    (uniform heating),
    u = 0                              on the hole (cooled),
    du/dn + Bi * u = 0                 on the square's sides (convective cooling),

with four parameters: the hole's centre ``(cx, cy)`` and radius ``r`` (``r``
uniform in ``[0.05, 0.2]``, the centre uniform where the hole stays at least 0.1
from the sides) and the Biot number ``Bi`` (log-uniform in ``[0.1, 10]``). Each
sample has its own quality mesh (``triangle`` library, 30 degrees; edges of about
``h_hole`` on the hole, growing to ``h`` away from it; 700-1,100 nodes), so the
mean field and POD-type baselines do not apply; a surrogate must read the geometry.

The closed form of the annulus ``r < |x| < R`` (same equations, radial) checks the
solver in the tests: ``u = -rho^2 / 4 + A log(rho) + B`` with ``A, B`` from the two
boundary conditions (:func:`annulus_solution`).

Each sample is a :class:`meshops.MeshData` with ``pos``, ``cells``, ``weight``,
``fields`` ``cx, cy, r, Bi`` (constant) and ``u``; ``x [N, 4]``, ``y [N, 1]``,
``params [1, 4]``, ``standin=True``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from data_adapters._geometry import band_around, triangulate_loops
from data_adapters.parametric import parametric_sample
from data_adapters.standins._cache import describe, generate_or_load
from meshops.datasets.folder import as_float_dtype
from meshops.errors import MeshError

GENERATOR = "hole"
VERSION = 1
INPUTS = ("cx", "cy", "r", "Bi")
TARGET = "u"
MARGIN = 0.1


def mesh_with_hole(outer, center, radius: float, h: float = 0.05, h_hole: float = 0.015,
                   min_angle: float = 30.0, ring: int = 1, band: float = 0.0):
    """Quality triangle mesh of the polygon ``outer`` minus a disc.

    Args:
        outer: ``[P, 2]`` vertices of the outer boundary (counter-clockwise), each
            side split into pieces of about ``h``.
        center, radius: The hole.
        h: Edge length on the outer boundary and the largest triangles' size.
        h_hole: Edge length on the hole's polygon (finer, where the gradient is).
        ring: A graded re-mesh: the annulus of width ``band`` around the hole with
            triangles ``ring`` times smaller in area (edges ``h_hole / sqrt(ring)``).
        band: Width of that annulus.

    Returns:
        ``(points [N, 2], triangles [M, 3])``.
    """
    if ring > 1 and not band > 0:
        raise ValueError(f"mesh_with_hole: a refined ring needs a band width > 0, got {band!r}")
    outer = np.asarray(outer, np.float64)
    pts = []
    for a, b in zip(outer, np.roll(outer, -1, axis=0)):
        n = max(1, math.ceil(np.linalg.norm(b - a) / h))
        pts.extend(a + (b - a) * t / n for t in range(n))
    fine = h_hole / math.sqrt(ring)
    n_hole = max(12, math.ceil(2 * math.pi * radius / fine))
    th = np.linspace(0.0, 2 * math.pi, n_hole, endpoint=False)
    hole = np.asarray(center)[None] + radius * np.stack([np.cos(th), np.sin(th)], 1)
    loops, regions = [np.asarray(pts), hole], []
    if ring > 1:
        edge, seed = band_around(lambda t: np.full(np.shape(t), radius), center, band, fine)
        loops.append(edge)
        regions.append((seed, math.sqrt(3) / 4 * fine * fine))
    return triangulate_loops(loops, [center], math.sqrt(3) / 4 * h * h, min_angle, regions)


def heat_operators(points, triangles, center, radius: float, biot: float):
    """``(K, M, hole_nodes, basis)``: the P1 stiffness matrix with the Robin term
    ``biot * int u v`` on the boundary edges off the hole, the mass matrix, the nodes on
    the hole (within ``1e-6 * radius`` of its circle; ``u = 0`` there) and the
    scikit-fem basis.

    Raises:
        MeshError: no boundary node on the hole's circle.
    """
    import skfem
    from skfem.helpers import dot, grad

    p = np.asarray(points, np.float64)
    mesh = skfem.MeshTri(p.T.copy(), np.asarray(triangles, np.int64).T.copy())
    basis = skfem.Basis(mesh, skfem.ElementTriP1())
    on_hole = np.abs(np.linalg.norm(p - np.asarray(center)[None], axis=1) - radius) \
        <= 1e-6 * radius
    facets = mesh.boundary_facets()
    robin = facets[~on_hole[mesh.facets[:, facets]].all(axis=0)]
    hole_nodes = np.flatnonzero(on_hole)
    if len(hole_nodes) == 0:
        raise MeshError("solve_heat_with_hole: no boundary node on the hole's circle")

    @skfem.BilinearForm
    def stiffness(u, v, _):
        return dot(grad(u), grad(v))

    @skfem.BilinearForm
    def mass(u, v, _):
        return u * v

    A = stiffness.assemble(basis)
    if biot > 0 and len(robin):
        A = A + biot * mass.assemble(skfem.FacetBasis(mesh, skfem.ElementTriP1(),
                                                      facets=robin))
    return A, mass.assemble(basis), hole_nodes, basis


def solve_heat_with_hole(points, triangles, center, radius: float, biot: float,
                         source: float = 1.0) -> np.ndarray:
    """P1 solution of the problem of the module docstring on a given mesh.

    Boundary nodes within ``1e-6 * radius`` of the circle ``|x - center| = radius``
    are the hole's (``u = 0``); every other boundary edge carries the Robin
    condition ``du/dn + biot * u = 0`` (:func:`heat_operators`).

    Shapes:
        points ``[N, 2]``, triangles ``[M, 3]`` -> ``[N]``
    """
    import skfem

    if not (radius > 0 and biot >= 0):
        raise MeshError(f"radius must be > 0 and biot >= 0, got {radius}, {biot}")
    A, _, hole_nodes, basis = heat_operators(points, triangles, center, radius, biot)

    @skfem.LinearForm
    def load(v, _):
        return source * v

    b = load.assemble(basis)
    return skfem.solve(*skfem.condense(A, b, D=hole_nodes))


def annulus_solution(rho, r: float, R: float, biot: float, source: float = 1.0):
    """Exact solution on the annulus ``r < rho < R`` (``u(r) = 0``, Robin at ``R``).

    ``u = source * (-rho^2 / 4) + A log(rho) + B`` with ``u(r) = 0`` and
    ``u'(R) + biot u(R) = 0``.
    """
    # unknowns (A, B): A log r + B = source r^2 / 4;
    # A / R + biot (A log R + B) = source (R / 2 + biot R^2 / 4)
    M = np.array([[math.log(r), 1.0], [1.0 / R + biot * math.log(R), biot]])
    rhs = source * np.array([r * r / 4, R / 2 + biot * R * R / 4])
    A, B = np.linalg.solve(M, rhs)
    rho = np.asarray(rho, np.float64)
    return -source * rho ** 2 / 4 + A * np.log(rho) + B


def sample_params(num_samples: int, seed: int = 0) -> np.ndarray:
    """``[S, 4]`` parameters ``(cx, cy, r, Bi)`` drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    r = rng.uniform(0.05, 0.2, num_samples)
    lo, hi = MARGIN + r, 1.0 - MARGIN - r
    cx = lo + (hi - lo) * rng.uniform(size=num_samples)
    cy = lo + (hi - lo) * rng.uniform(size=num_samples)
    bi = np.exp(rng.uniform(math.log(0.1), math.log(10.0), num_samples))
    return np.stack([cx, cy, r, bi], 1)


SQUARE = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])


def _generate(num_samples: int, seed: int, h: float, h_hole: float, progress: bool,
              first: int = 0, ring: int = 1, band: float = 0.0) -> dict:
    from meshops.utils.progress import progress as progress_bar

    params = sample_params(num_samples, seed)[first:]
    pts, tris, us, npts, ntri = [], [], [], [0], [0]
    for cx, cy, r, bi in progress_bar(params, desc="hole STAND-IN (FEM)", enabled=progress,
                                      leave=False):
        p, t = mesh_with_hole(SQUARE, (cx, cy), r, h, h_hole, ring=ring, band=band)
        us.append(solve_heat_with_hole(p, t, (cx, cy), r, bi))
        pts.append(p)
        tris.append(t.astype(np.int32))
        npts.append(npts[-1] + len(p))
        ntri.append(ntri[-1] + len(t))
    return {"points": np.concatenate(pts) if pts else np.zeros((0, 2)),
            "triangles": np.concatenate(tris) if tris else np.zeros((0, 3), np.int32),
            "u": np.concatenate(us) if us else np.zeros(0),
            "point_offsets": np.asarray(npts, np.int64),
            "cell_offsets": np.asarray(ntri, np.int64), "params": params}


def make_hole_standin(num_samples: int = 300, seed: int = 0, cache_dir=None,
                      progress: bool = True, *, h: float = 0.05, h_hole: float = 0.015,
                      first: int = 0, ring: int = 1, band: float = 0.0075,
                      dtype=torch.float32) -> list:
    """Generate (or load from the cache) the plate-with-a-hole stand-in.

    Args:
        num_samples: Number of samples (one mesh each).
        seed: Seed of the parameters.
        cache_dir: Cache folder (``None``: the default; ``False``: no cache).
        progress: Say what was generated/loaded (stderr).
        h, h_hole: Mesh sizes on the square and on the hole.
        first: Only the samples ``first..num_samples - 1`` of the same draw (e.g. the
            test shapes alone, meshed again).
        ring, band: A graded re-mesh: the annulus of width ``band`` around the hole
            refined ``ring`` times in area (:func:`mesh_with_hole`); the default band is
            half of ``h_hole``, about one layer of the default meshes' triangles.
        dtype: Floating dtype of the returned tensors.

    Returns:
        ``list[MeshData]`` (see the module docstring).

    Shapes:
        item: pos ``[N_s, 2]``, x ``[N_s, 4]``, y ``[N_s, 1]``, params ``[1, 4]``
    """
    dtype = as_float_dtype(dtype)
    if not (isinstance(ring, int) and ring >= 1 and 0 <= first <= num_samples):
        raise ValueError(f"make_hole_standin: ring must be a positive integer and "
                         f"0 <= first <= num_samples, got ring={ring!r}, first={first}")
    size = {"h": float(h), "h_hole": float(h_hole)}
    # the keys of the plain sets' cache files stay as they were
    size.update({"first": int(first)} if first else {})
    size.update({"ring": ring, "band": float(band)} if ring > 1 else {})
    meta = describe(GENERATOR, VERSION, size, seed, num_samples)
    arrays, _ = generate_or_load(
        meta, lambda: _generate(num_samples, seed, h, h_hole, progress, first, ring, band),
        cache_dir, progress, "plate-with-a-hole")
    po, co = arrays["point_offsets"], arrays["cell_offsets"]
    note = f", band refined {ring}x" if ring > 1 else ""
    return [parametric_sample(arrays["points"][po[s]:po[s + 1]],
                              arrays["triangles"][co[s]:co[s + 1]], INPUTS, prm,
                              {TARGET: arrays["u"][po[s]:po[s + 1]]},
                              f"plate-with-a-hole STAND-IN sample {first + s} (seed {seed}"
                              f"{note})", dtype, first + s, standin=True)
            for s, prm in enumerate(arrays["params"])]
