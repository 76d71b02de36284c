"""A parametric FEM **stand-in** with many parameters and a vector target: a
multi-material plate in plane-strain linear elasticity.

Synthetic data of the kind of a real parametric study (one mesh, a dozen scalar
parameters, a vector field out), harder than
:mod:`data_adapters.standins.convdiff`. Each sample solves, with P1 finite elements
(scikit-fem) on the plate ``[0, 2] x [0, 1]``,

    -div sigma(u) = 0,   sigma = lambda(E) tr(eps) I + 2 mu(E) eps   (plane strain),

* **Materials**: the plate is cut into a 4 x 2 grid of 0.5 x 0.5 blocks (block
  ``k = 4 * row + col``, row 0 at the bottom), each with its own Young's modulus
  ``E1..E8`` (log-uniform in ``[1, 10]``); Poisson ratio ``nu = 0.3`` everywhere.
  The mesh (``triangle`` library, quality 30 degrees, about 1,200 nodes) has the
  block edges as segments, so no triangle straddles two materials.
* **Loads**: the left edge ``x = 0`` is clamped; the right edge ``x = 2`` carries a
  uniform traction of magnitude ``load`` (uniform in ``[0.5, 1.5]``) in the direction
  ``angle`` (uniform in ``[-pi/2, pi/2]`` from the x axis: pulling, with any
  shear, never wrapping around); the top edge ``y = 1`` a
  uniform pressure ``pressure`` (uniform in ``[0, 1]``, pushing down); the bottom
  edge is free.
* **Target**: the displacement ``(u1, u2)`` at the nodes.

So the 11 parameters ``E1..E8, load, angle, pressure`` enter non-linearly (the
displacement goes like ``1 / E`` and like ``cos``/``sin`` of the angle), while the
solution is linear in the loads, which the tests check, with the closed form of a
homogeneous bar in uniaxial tension.

Each sample is a :class:`meshops.MeshData` with ``pos [N, 2]``, ``cells``,
``weight``, ``fields`` (the 11 parameters as constant fields, ``u1``, ``u2``),
``x [N, 11]``, ``y [N, 2]``, ``params [1, 11]``, ``standin=True``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from data_adapters.parametric import parametric_sample
from data_adapters.standins._cache import describe, generate_or_load
from data_adapters.standins.fem import lame
from meshops.datasets.folder import as_float_dtype
from meshops.errors import MeshError

GENERATOR = "materials"
VERSION = 2
WIDTH, HEIGHT = 2.0, 1.0
COLS, ROWS = 4, 2
NU = 0.3
MODULI = tuple(f"E{k + 1}" for k in range(COLS * ROWS))
INPUTS = MODULI + ("load", "angle", "pressure")
TARGETS = ("u1", "u2")


def block_of(x, y) -> np.ndarray:
    """Material block ``4 * row + col`` of points ``(x, y)`` inside the plate."""
    col = np.clip(np.floor(np.asarray(x) / (WIDTH / COLS)), 0, COLS - 1).astype(np.int64)
    row = np.clip(np.floor(np.asarray(y) / (HEIGHT / ROWS)), 0, ROWS - 1).astype(np.int64)
    return row * COLS + col


def mesh_plate(h: float = 0.055, min_angle: float = 30.0):
    """Quality triangle mesh of the plate whose triangles respect the block edges.

    Args:
        h: Target edge length (segments of about ``h``, triangle areas at most
            ``sqrt(3)/4 h^2``).
        min_angle: Minimum angle (degrees).

    Returns:
        ``(points [N, 2], triangles [M, 3], block [M])``: the block of each triangle.
    """
    import triangle

    xs = np.linspace(0.0, WIDTH, COLS + 1)
    ys = np.linspace(0.0, HEIGHT, ROWS + 1)
    vertices, index = [], {}

    def vid(p) -> int:
        key = (round(p[0], 12), round(p[1], 12))
        if key not in index:
            index[key] = len(vertices)
            vertices.append(key)
        return index[key]

    segments = []

    def line(a, b) -> None:  # the segment a-b split into pieces of about h
        n = max(1, math.ceil(math.dist(a, b) / h))
        pts = [vid((a[0] + (b[0] - a[0]) * t / n, a[1] + (b[1] - a[1]) * t / n))
               for t in range(n + 1)]
        segments.extend(zip(pts[:-1], pts[1:]))

    for x in xs:  # vertical grid lines (outer sides included)
        for y0, y1 in zip(ys[:-1], ys[1:]):
            line((x, y0), (x, y1))
    for y in ys:
        for x0, x1 in zip(xs[:-1], xs[1:]):
            line((x0, y), (x1, y))
    regions = [[0.5 * (xs[c] + xs[c + 1]), 0.5 * (ys[r] + ys[r + 1]), r * COLS + c, 0]
               for r in range(ROWS) for c in range(COLS)]
    out = triangle.triangulate(
        {"vertices": np.asarray(vertices), "segments": np.asarray(segments),
         "regions": np.asarray(regions, dtype=np.float64)},
        f"pq{min_angle:g}Aa{math.sqrt(3) / 4 * h * h:.10f}")
    block = np.asarray(out["triangle_attributes"]).reshape(-1).round().astype(np.int64)
    return (np.asarray(out["vertices"], np.float64), np.asarray(out["triangles"], np.int64),
            block)


def _edge_load(points, edges, direction) -> np.ndarray:
    """Consistent P1 load ``[N, 2]`` of a unit traction ``direction`` on ``edges``
    (half of traction x length on each end node)."""
    length = np.linalg.norm(points[edges[:, 1]] - points[edges[:, 0]], axis=1)
    f = np.zeros((len(points), 2))
    for end in (0, 1):
        np.add.at(f, edges[:, end], 0.5 * length[:, None] * np.asarray(direction)[None])
    return f


class PlateSolver:
    """Assembles the plate once, solves for many parameter vectors.

    The stiffness is ``K(E) = sum_k E_k K_k`` with ``K_k`` the stiffness of block
    ``k`` at unit modulus, and the load is ``load * (cos(angle) F_x + sin(angle) F_y)
    + pressure * F_p``, so each sample costs one sparse solve.

    Args:
        points, triangles, block: The mesh (:func:`mesh_plate`).
        support: ``"clamped"`` (left edge fixed, the data set) or ``"roller"`` (left
            edge ``u1 = 0``, bottom-left corner ``u2 = 0``: a bar free to contract,
            for the closed-form check).

    Shapes:
        points ``[N, 2]``, triangles ``[M, 3]``, block ``[M]``; :meth:`solve` ->
        ``[N, 2]``
    """

    def __init__(self, points, triangles, block, support: str = "clamped"):
        import skfem
        from skfem.models.elasticity import linear_elasticity

        if support not in ("clamped", "roller"):
            raise MeshError(f"support must be 'clamped' or 'roller', got {support!r}")
        self.points = np.asarray(points, np.float64)
        mesh = skfem.MeshTri(self.points.T.copy(), np.asarray(triangles, np.int64).T.copy())
        element = skfem.ElementVector(skfem.ElementTriP1())
        form = linear_elasticity(*lame(1.0, NU))
        self.blocks = [skfem.asm(form, skfem.Basis(mesh, element,
                                                   elements=np.flatnonzero(block == k)))
                       for k in range(COLS * ROWS)]
        basis = skfem.Basis(mesh, element)
        self.dofs = basis.nodal_dofs  # [2, N]
        self.n_dofs = basis.N
        p = self.points
        tol = 1e-9
        edges = mesh.facets[:, mesh.boundary_facets()].T
        on = lambda axis, value: edges[(np.abs(p[edges, axis] - value) <= tol).all(1)]
        self.F_x = self._dof_vector(_edge_load(p, on(0, WIDTH), (1.0, 0.0)))
        self.F_y = self._dof_vector(_edge_load(p, on(0, WIDTH), (0.0, 1.0)))
        self.F_p = self._dof_vector(_edge_load(p, on(1, HEIGHT), (0.0, -1.0)))
        left = np.flatnonzero(np.abs(p[:, 0]) <= tol)
        if support == "clamped":
            self.fixed = self.dofs[:, left].ravel()
        else:
            corner = left[np.argmin(p[left, 1])]
            self.fixed = np.r_[self.dofs[0, left], self.dofs[1, corner]]

    def _dof_vector(self, f) -> np.ndarray:
        out = np.zeros(self.n_dofs)
        out[self.dofs[0]] = f[:, 0]
        out[self.dofs[1]] = f[:, 1]
        return out

    def solve(self, params) -> np.ndarray:
        """Displacement ``[N, 2]`` for ``params = (E1..E8, load, angle, pressure)``."""
        import skfem

        params = np.asarray(params, np.float64)
        if params.shape != (len(INPUTS),):
            raise MeshError(f"params must have {len(INPUTS)} values {INPUTS}, got "
                            f"shape {params.shape}")
        E, (load, angle, pressure) = params[:len(MODULI)], params[len(MODULI):]
        if not (E > 0).all():
            raise MeshError(f"Young's moduli must be positive, got {E.tolist()}")
        K = sum(e * Kk for e, Kk in zip(E, self.blocks))
        f = load * (math.cos(angle) * self.F_x + math.sin(angle) * self.F_y) \
            + pressure * self.F_p
        u = skfem.solve(*skfem.condense(K, f, D=self.fixed))
        return np.stack([u[self.dofs[0]], u[self.dofs[1]]], 1)


def sample_params(num_samples: int, seed: int = 0) -> np.ndarray:
    """``[S, 11]`` parameters ``(E1..E8, load, angle, pressure)`` drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    E = np.exp(rng.uniform(0.0, math.log(10.0), (num_samples, len(MODULI))))
    load = rng.uniform(0.5, 1.5, num_samples)
    angle = rng.uniform(-0.5 * math.pi, 0.5 * math.pi, num_samples)
    pressure = rng.uniform(0.0, 1.0, num_samples)
    return np.column_stack([E, load, angle, pressure])


def _generate(num_samples: int, seed: int, h: float, progress: bool) -> dict:
    from meshops.utils.progress import progress as progress_bar

    points, triangles, block = mesh_plate(h)
    solver = PlateSolver(points, triangles, block)
    params = sample_params(num_samples, seed)
    u = np.zeros((num_samples, len(points), 2))
    for s in progress_bar(range(num_samples), desc="materials STAND-IN (FEM)", enabled=progress,
                          leave=False):
        u[s] = solver.solve(params[s])
    return {"points": points, "triangles": triangles.astype(np.int32),
            "block": block.astype(np.int32), "params": params, "u": u}


def make_materials_standin(num_samples: int = 500, seed: int = 0, cache_dir=None,
                           progress: bool = True, *, h: float = 0.055,
                           dtype=torch.float32) -> list:
    """Generate (or load from the cache) the multi-material elasticity stand-in.

    Args:
        num_samples: Number of samples.
        seed: Seed of the parameters.
        cache_dir: Cache folder (``None``: the default of
            :mod:`data_adapters.standins._cache`; ``False``: no cache).
        progress: Say what was generated/loaded (stderr).
        h: Mesh size (the default gives about 1,200 nodes).
        dtype: Floating dtype of the returned tensors.

    Returns:
        ``list[MeshData]`` (see the module docstring); ``cell_data["block"]`` holds
        the material block of each triangle.

    Shapes:
        item: pos ``[N, 2]``, x ``[N, 11]``, y ``[N, 2]``, params ``[1, 11]``
    """
    dtype = as_float_dtype(dtype)
    meta = describe(GENERATOR, VERSION, {"h": float(h)}, seed, num_samples)
    arrays, _ = generate_or_load(meta, lambda: _generate(num_samples, seed, h, progress),
                                 cache_dir, progress, "multi-material elasticity")
    points, tri = arrays["points"], arrays["triangles"].astype(np.int64)
    return [parametric_sample(points, tri, INPUTS, p, {"u1": arrays["u"][s, :, 0],
                                                       "u2": arrays["u"][s, :, 1]},
                              f"multi-material elasticity STAND-IN sample {s} (seed {seed})",
                              dtype, s, {"block": [arrays["block"]]}, standin=True)
            for s, p in enumerate(arrays["params"])]
