"""A **stand-in** family of geometries with several fields of different units: steady
viscous flow past an obstacle whose shape and place change from sample to sample.

Synthetic data, made to stand for the CFD users' ordinary case (each sample its own
domain and triangle mesh, one input field, velocity and pressure of different units).
Sample ``s`` solves the steady incompressible Navier-Stokes equations

    (u . grad) u - nu laplace(u) + grad(p) / rho = 0,     div(u) = 0,

in the channel ``[0, L] x [0, H]`` (``L = 4 m``, ``H = 1 m``) minus a star-shaped
obstacle ``r(theta) = r0 (1 + sum_k a_k cos(k theta) + b_k sin(k theta))`` (``k = 1..3``)
centred at ``(cx, cy)``, with a parabolic inflow of mean speed ``U = 0.2 m/s`` at
``x = 0``, no slip on the walls and the obstacle and a free outflow (zero normal
stress) at ``x = L``. The fluid is a heavy oil: ``rho = 900 kg/m^3``,
``nu = 2e-3 m^2/s``, so the Reynolds number ``U 2 r0 / nu`` is 20 to 40 (steady flow,
a recirculation behind the larger obstacles). The pressure (Pa, 0 on average at the
outflow) is about 100 times the velocity (m/s).

The shape parameters are ``cx ~ U(0.8, 1.2)``, ``cy ~ U(0.4, 0.6)``,
``r0 ~ U(0.1, 0.2)``, ``a_k, b_k ~ N(0, (0.15 / k)^2)`` (scaled down when the radius
would leave ``[0.5 r0, 1.5 r0]``). Each sample has its own quality mesh (``triangle``,
30 degrees; edges of about ``h_body`` on the obstacle growing to ``h`` away from it;
1,500-2,500 nodes by default), and the equations are solved with Taylor-Hood (P2
velocity, P1 pressure) elements in scikit-fem by Newton's method from the Stokes
solution, to a residual below ``1e-9`` of the first (or of the Stokes flow's viscous
forces, when it is smaller).

Each sample is a :class:`meshops.MeshData` on the P1 mesh (the vertices; the P2
velocity's vertex values) with ``fields`` ``sdf`` (the distance to the obstacle, the
input), ``u``, ``v`` (m/s) and ``p`` (Pa), ``x [N, 1]``, ``y [N, 3]``, ``params [1, 9]``
(the shape parameters, for the nearest-sample baseline) and ``standin=True``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from data_adapters._geometry import band_around, closed_polygon, polygon_distance, triangulate_loops
from data_adapters.standins._cache import describe, generate_or_load
from meshops.datasets.folder import add_inputs_targets, as_float_dtype
from meshops.errors import MeshError
from meshops.mesh.io import mesh_from_arrays

GENERATOR = "obstacle"
VERSION = 1
INPUTS = ("sdf",)
TARGETS = ("u", "v", "p")
#: The fields of the targets: velocity (u, v together) and pressure.
FIELDS = ("u+v", "p")
PARAMS = ("cx", "cy", "r0", "a1", "a2", "a3", "b1", "b2", "b3")
LENGTH, HEIGHT = 4.0, 1.0
U_MEAN, RHO, NU = 0.2, 900.0, 2e-3
MODES = 3
#: Width (m) of the band around the obstacle that a graded re-mesh refines: half the
#: default ``h_body``, so about one layer of the training meshes' triangles.
RING_BAND = 0.01


def obstacle_radius(theta, params) -> np.ndarray:
    """``r(theta)`` of the obstacle with ``params = [cx, cy, r0, a1..a3, b1..b3]``.

    Shapes:
        theta ``[T]`` -> ``[T]``
    """
    params = np.asarray(params, np.float64)
    k = np.arange(1, MODES + 1)
    th = np.asarray(theta, np.float64)[:, None]
    a, b = params[3:3 + MODES], params[3 + MODES:3 + 2 * MODES]
    return params[2] * (1 + np.cos(k * th) @ a + np.sin(k * th) @ b)


def sample_params(num_samples: int, seed: int = 0) -> np.ndarray:
    """``[S, 9]`` shape parameters drawn from ``seed`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out = []
    theta = np.linspace(0.0, 2 * np.pi, 720, endpoint=False)
    for _ in range(num_samples):
        cx, cy, r0 = rng.uniform(0.8, 1.2), rng.uniform(0.4, 0.6), rng.uniform(0.1, 0.2)
        ab = rng.normal(size=(2, MODES)) * (0.15 / np.arange(1, MODES + 1))
        pert = np.cos(np.arange(1, MODES + 1) * theta[:, None]) @ ab[0] + \
            np.sin(np.arange(1, MODES + 1) * theta[:, None]) @ ab[1]
        scale = min(1.0, 0.5 / max(np.abs(pert).max(), 1e-12))
        out.append(np.r_[cx, cy, r0, scale * ab.ravel()])
    return np.asarray(out).reshape(num_samples, 3 + 2 * MODES)


def body_polygon(params, h_body: float) -> np.ndarray:
    """The obstacle's boundary as a polygon with edges of about ``h_body``."""
    return closed_polygon(lambda t: obstacle_radius(t, params), params[:2], h_body)


def mesh_channel(params, h: float = 0.07, h_body: float = 0.02, min_angle: float = 30.0,
                 ring: int = 1, band: float = 0.0):
    """Quality triangle mesh of the channel minus the obstacle.

    The boundary spacing sets the size near the obstacle and the area bound elsewhere (a
    size field through triangle's 'u' switch is not in its Python API).

    Args:
        params: The shape parameters ``[9]``.
        h, h_body: Edge lengths away from the obstacle and on it.
        min_angle: Smallest triangle angle (degrees).
        ring: Area refinement of the band around the obstacle: its triangles are about
            ``ring`` times smaller in area than with ``ring=1`` (edges ``h_body /
            sqrt(ring)``), and the rest of the mesh is as with ``ring=1`` beyond the
            grading out of the band. A graded re-mesh, as boundary-layer meshes are.
        band: Width of that band (m), measured along the rays from the obstacle's centre.

    Returns:
        ``(points [N, 2], triangles [M, 3], body [B, 2])``: the mesh and the obstacle's
        polygon (its vertices are mesh nodes).
    """
    if ring > 1 and not band > 0:
        raise ValueError(f"mesh_channel: a refined ring needs a band width > 0, got {band!r}")
    fine = h_body / math.sqrt(ring)
    body = body_polygon(params, fine)
    nx, ny = math.ceil(LENGTH / h), math.ceil(HEIGHT / h)
    s, t = np.arange(nx) / nx, np.arange(ny) / ny
    box = np.concatenate([np.stack([LENGTH * s, 0 * s], 1),
                          np.stack([LENGTH + 0 * t, HEIGHT * t], 1),
                          np.stack([LENGTH * (1 - s), HEIGHT + 0 * s], 1),
                          np.stack([0 * t, HEIGHT * (1 - t)], 1)])
    loops, regions = [box, body], []
    if ring > 1:
        edge, seed = band_around(lambda t: obstacle_radius(t, params), params[:2], band, fine)
        loops.append(edge)
        regions.append((seed, math.sqrt(3) / 4 * fine * fine))
    points, triangles = triangulate_loops(loops, [params[:2]], math.sqrt(3) / 4 * h * h,
                                          min_angle, regions)
    return points, triangles, body


def solve_flow(points, triangles, tol: float = 1e-9, max_newton: int = 20):
    """Taylor-Hood solution of the module docstring's problem on one mesh.

    Every boundary facet but the outflow's (``x = L``) carries a Dirichlet velocity:
    the parabolic profile on the inflow (``x = 0``), zero elsewhere (walls, obstacle).

    Args:
        points, triangles: The P1 mesh (``[N, 2]``, ``[M, 3]``).

    Returns:
        ``(u [N], v [N], p [N])`` at the vertices: m/s and Pa.

    Raises:
        MeshError: Newton's method did not converge.
    """
    import skfem
    from scipy.sparse import bmat
    from skfem.helpers import ddot, div, dot, grad

    mesh = skfem.MeshTri(np.asarray(points, np.float64).T.copy(),
                         np.asarray(triangles, np.int64).T.copy())
    bu = skfem.Basis(mesh, skfem.ElementVector(skfem.ElementTriP2()), intorder=4)
    bp = skfem.Basis(mesh, skfem.ElementTriP1(), intorder=4)

    @skfem.BilinearForm
    def viscous(u, v, _):
        return NU * ddot(grad(u), grad(v))

    @skfem.BilinearForm
    def divergence(u, q, _):
        return -div(u) * q

    def advect(g, a):  # (a . grad) of a vector field with gradient g
        return np.einsum("ij...,j...->i...", g, a)

    @skfem.BilinearForm
    def convection_jacobian(du, v, w):
        # the derivative of (u . grad) u at w: (du . grad) w + (w . grad) du
        return dot(advect(w["w"].grad, du) + advect(grad(du), w["w"]), v)

    @skfem.LinearForm
    def convection(v, w):
        return dot(advect(w["w"].grad, w["w"]), v)

    A, B = viscous.assemble(bu), divergence.assemble(bu, bp)
    n_u, n_p = bu.N, bp.N
    mid = mesh.p[:, mesh.facets[:, mesh.boundary_facets()]].mean(axis=1)
    dirichlet = mesh.boundary_facets()[mid[0] < LENGTH - 1e-9]
    inflow = mesh.boundary_facets()[mid[0] < 1e-9]
    fixed = bu.get_dofs(facets=dirichlet).all()
    x_in = bu.get_dofs(facets=inflow)
    x_in = np.concatenate([x_in.nodal["u^1"], x_in.facet["u^1"]])
    y = bu.doflocs[1, x_in]
    U = np.zeros(n_u + n_p)
    U[x_in] = 6.0 * U_MEAN * y * (HEIGHT - y) / HEIGHT ** 2
    U = skfem.solve(*skfem.condense(bmat([[A, B.T], [B, None]], "csr"),
                                    np.zeros(n_u + n_p), x=U, D=fixed))
    # the residual is measured against the viscous forces of the Stokes flow, so that a
    # flow Stokes already solves (no convection) counts as converged at once
    scale = float(np.linalg.norm(A @ U[:n_u]))
    first = norm = None
    for _ in range(max_newton):
        w = bu.interpolate(U[:n_u])
        r = np.concatenate([A @ U[:n_u] + convection.assemble(bu, w=w) + B.T @ U[n_u:],
                            B @ U[:n_u]])
        r[fixed] = 0.0
        norm = float(np.linalg.norm(r))
        first = norm if first is None else first
        if norm <= tol * max(first, scale):
            break
        J = bmat([[A + convection_jacobian.assemble(bu, w=w), B.T], [B, None]], "csr")
        U += skfem.solve(*skfem.condense(J, -r, D=fixed))
    else:
        raise MeshError(f"obstacle flow: Newton did not converge in {max_newton} steps "
                        f"(residual {norm:.3g} of {first:.3g})")
    vel = U[:n_u][bu.nodal_dofs]   # [2, N]: the P2 velocity at the vertices
    return vel[0].copy(), vel[1].copy(), RHO * U[n_u:][bp.nodal_dofs[0]]


def _generate(params: np.ndarray, h: float, h_body: float, progress: bool, ring: int = 1,
              band: float = 0.0) -> dict:
    from meshops.utils.progress import progress as progress_bar

    pts, tris, fields, npts, ntri = [], [], {k: [] for k in ("sdf", *TARGETS)}, [0], [0]
    for prm in progress_bar(params, desc="obstacle-flow STAND-IN (FEM)", enabled=progress,
                            leave=False):
        p, t, body = mesh_channel(prm, h, h_body, ring=ring, band=band)
        for k, v in zip(TARGETS, solve_flow(p, t)):
            fields[k].append(v)
        fields["sdf"].append(polygon_distance(p, body))
        pts.append(p)
        tris.append(t.astype(np.int32))
        npts.append(npts[-1] + len(p))
        ntri.append(ntri[-1] + len(t))
    return {"points": np.concatenate(pts), "triangles": np.concatenate(tris),
            **{k: np.concatenate(v) for k, v in fields.items()},
            "point_offsets": np.asarray(npts, np.int64),
            "cell_offsets": np.asarray(ntri, np.int64), "params": params}


def make_obstacle_standin(num_samples: int = 300, seed: int = 0, cache_dir=None,
                          progress: bool = True, *, refine: int = 1, h: float = 0.07,
                          h_body: float = 0.02, first: int = 0, ring: int = 1,
                          band: float = RING_BAND, dtype=torch.float32) -> list:
    """Generate (or load from the cache) the obstacle-flow stand-in.

    Args:
        num_samples: Number of samples (one mesh each).
        seed: Seed of the shape parameters.
        cache_dir: Cache folder (``None``: the default; ``False``: no cache).
        progress: Say what was generated/loaded (stderr).
        refine: Mesh sizes divided by ``refine`` (``2``: the same shapes on about 4x the
            nodes, for the zero-shot refinement check).
        h, h_body: Mesh sizes away from and on the obstacle (before ``refine``).
        first: Only the samples ``first..num_samples - 1`` (of the same draw): e.g. the
            test shapes alone on finer meshes.
        ring: Graded re-mesh: the band of width ``band`` around the obstacle refined
            ``ring`` times in area (see :func:`mesh_channel`), for the zero-shot check on
            meshes that differ from the training ones as boundary-layer meshes do.
        band: Width of that band (m).
        dtype: Floating dtype of the returned tensors.

    Returns:
        ``list[MeshData]`` (see the module docstring).

    Shapes:
        item: pos ``[N_s, 2]``, x ``[N_s, 1]``, y ``[N_s, 3]``, params ``[1, 9]``
    """
    dtype = as_float_dtype(dtype)
    if not (isinstance(refine, int) and refine >= 1 and isinstance(ring, int) and ring >= 1
            and 0 <= first <= num_samples):
        raise ValueError(f"make_obstacle_standin: refine and ring must be positive integers "
                         f"and 0 <= first <= num_samples, got refine={refine!r}, "
                         f"ring={ring!r}, first={first}")
    params = sample_params(num_samples, seed)[first:]
    size = {"h": float(h) / refine, "h_body": float(h_body) / refine, "first": int(first)}
    if ring > 1:  # the key of the plain meshes' cache files stays as it was
        size.update(ring=ring, band=float(band))
    meta = describe(GENERATOR, VERSION, size, seed, num_samples)
    arrays, _ = generate_or_load(meta, lambda: _generate(params, size["h"], size["h_body"],
                                                         progress, ring, band),
                                 cache_dir, progress, "obstacle-flow")
    po, co = arrays["point_offsets"], arrays["cell_offsets"]
    out = []
    for s, prm in enumerate(arrays["params"]):
        sl = slice(po[s], po[s + 1])
        mesh = mesh_from_arrays(
            arrays["points"][sl], [("triangle", arrays["triangles"][co[s]:co[s + 1]]
                                    .astype(np.int64))],
            {k: arrays[k][sl] for k in (*INPUTS, *TARGETS)},
            source=f"obstacle-flow STAND-IN sample {first + s} (seed {seed}, refine {refine}"
                   + (f", ring {ring} x{band:g} m)" if ring > 1 else ")"))
        out.append(add_inputs_targets(mesh, list(INPUTS), list(TARGETS), dtype,
                                      sample_id=first + s, standin=True,
                                      params=torch.from_numpy(prm.copy())[None]))
    return out
