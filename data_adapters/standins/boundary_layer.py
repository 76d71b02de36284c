"""A parametric FEM **stand-in** with thin boundary layers: convection-diffusion at
high Peclet number on a graded mesh.

Synthetic data. Sample ``s`` solves, with P1 finite elements (scikit-fem) on the
unit square,

    -eps * laplace(u) + b . grad(u) = 1,    u = 0 on the boundary,
    b = (cos(theta), sin(theta)),

with two parameters: the diffusivity ``eps`` (log-uniform in ``[1e-3, 1e-1]``, two
orders of magnitude; the Peclet number ``1 / eps`` goes from 10 to 1,000) and the
wind angle ``theta`` (uniform in ``[-pi/6, pi/6]``). The solution is about
``x / cos(theta)`` along the streamlines and drops to 0 in an exponential
**boundary layer** of thickness about ``eps`` at the outflow side ``x = 1`` (and of
``eps / |sin(theta)|`` at the top or bottom side), so the target ranges from a
smooth field (``eps = 0.1``) to one with a near-discontinuity (``eps = 1e-3``).

One fixed **graded** tensor-product mesh serves every sample: cells of
``h_min = 2e-4`` at ``x = 1``, ``y = 0`` and ``y = 1``, growing geometrically by
``ratio = 1.3`` to ``h = 1/32`` in the interior (3,185 nodes), so the thinnest
layer spans several cells and the Galerkin solution does not oscillate (checked in
the tests against the 1-D closed form). Relative L2 errors with the mesh's own
quadrature weights weigh the layer by its small area, unweighted ones by its many
nodes: the two differ much here.

Each sample is a :class:`meshops.MeshData` with ``pos``, ``cells``, ``weight``,
``fields`` ``eps``, ``theta`` (constant) and ``u``; ``x [N, 2]``, ``y [N, 1]``,
``params [1, 2]``, ``standin=True``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from data_adapters.parametric import parametric_sample
from data_adapters.standins._cache import describe, generate_or_load
from meshops.datasets.folder import as_float_dtype
from meshops.errors import MeshError

GENERATOR = "boundary_layer"
VERSION = 1
INPUTS = ("eps", "theta")
TARGET = "u"
EPS_RANGE = (1e-3, 1e-1)
THETA_MAX = math.pi / 6


def graded_nodes(h: float = 1 / 32, h_min: float = 2e-4, ratio: float = 1.3,
                 left: bool = False, right: bool = True) -> np.ndarray:
    """Nodes of ``[0, 1]``: uniform spacing about ``h``, refined geometrically
    (spacing ``h_min, h_min * ratio, ...`` up to ``h``) towards the chosen ends.

    Returns:
        Increasing nodes ``[n]`` from 0 to 1.
    """
    if not (0 < h_min < h < 1 and ratio > 1):
        raise MeshError(f"need 0 < h_min < h < 1 and ratio > 1, got {h_min}, {h}, {ratio}")
    steps = []
    s = h_min
    while s < h:
        steps.append(s)
        s *= ratio
    graded = np.cumsum(steps)  # distances of the graded nodes from the refined end
    zone = graded[-1]
    lo = zone if left else 0.0
    hi = 1.0 - zone if right else 1.0
    nodes = [np.linspace(lo, hi, max(1, round((hi - lo) / h)) + 1)]
    if left:
        nodes += [[0.0], graded]
    if right:
        nodes += [[1.0], 1.0 - graded]
    return np.unique(np.clip(np.concatenate(nodes), 0.0, 1.0))


def graded_square(h: float = 1 / 32, h_min: float = 2e-4, ratio: float = 1.3):
    """The fixed mesh: :func:`graded_nodes` towards ``x = 1`` and towards both
    ``y = 0`` and ``y = 1``, each rectangle cut into two triangles.

    Returns:
        ``(points [N, 2], triangles [M, 3])``.
    """
    import skfem

    x = graded_nodes(h, h_min, ratio, left=False, right=True)
    y = graded_nodes(h, h_min, ratio, left=True, right=True)
    mesh = skfem.MeshTri.init_tensor(x, y)
    return mesh.p.T.copy(), mesh.t.T.copy()


def solve_convection_diffusion(points, triangles, params, source: float = 1.0,
                               walls: str = "dirichlet") -> np.ndarray:
    """P1 Galerkin solutions for each row ``(eps, theta)`` of ``params``.

    Args:
        points, triangles: The mesh of the unit square.
        params: ``[S, 2]`` rows ``(eps, theta)``.
        source: The constant right-hand side.
        walls: ``"dirichlet"`` (``u = 0`` on the whole boundary, the data set) or
            ``"neumann"`` (``u = 0`` only at ``x = 0`` and ``x = 1``, zero flux at
            ``y = 0, 1``: with ``theta = 0`` the exact solution is the 1-D one,
            :func:`layer_1d`).

    Returns:
        ``[S, N]``.
    """
    import skfem

    from data_adapters.standins.convdiff import convection_diffusion_matrices

    if walls not in ("dirichlet", "neumann"):
        raise MeshError(f"walls must be 'dirichlet' or 'neumann', got {walls!r}")
    p = np.asarray(points, np.float64)
    mesh = skfem.MeshTri(p.T.copy(), np.asarray(triangles, np.int64).T.copy())
    basis = skfem.Basis(mesh, skfem.ElementTriP1())

    K, Ax, Ay = convection_diffusion_matrices(basis)

    @skfem.LinearForm
    def rhs(v, _):
        return source * v

    b = rhs.assemble(basis)
    tol = 1e-12
    if walls == "dirichlet":
        fixed = mesh.boundary_nodes()
    else:
        fixed = np.flatnonzero((p[:, 0] <= tol) | (p[:, 0] >= 1 - tol))
    params = np.atleast_2d(np.asarray(params, np.float64))
    out = np.zeros((len(params), len(p)))
    for s, (eps, theta) in enumerate(params):
        if not eps > 0:
            raise MeshError(f"eps must be positive, got {eps}")
        A = eps * K + math.cos(theta) * Ax + math.sin(theta) * Ay
        out[s] = skfem.solve(*skfem.condense(A, b, D=fixed))
    return out


def layer_1d(x, eps: float, source: float = 1.0) -> np.ndarray:
    """Exact solution of ``-eps u'' + u' = source``, ``u(0) = u(1) = 0``:
    ``source * (x - (exp((x - 1) / eps) - exp(-1 / eps)) / (1 - exp(-1 / eps)))``."""
    x = np.asarray(x, np.float64)
    e = math.exp(-1.0 / eps)
    return source * (x - (np.exp((x - 1.0) / eps) - e) / (1.0 - e))


def sample_params(num_samples: int, seed: int = 0) -> np.ndarray:
    """``[S, 2]`` parameters ``(eps, theta)`` drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    eps = np.exp(rng.uniform(math.log(EPS_RANGE[0]), math.log(EPS_RANGE[1]), num_samples))
    theta = rng.uniform(-THETA_MAX, THETA_MAX, num_samples)
    return np.stack([eps, theta], 1)


def _generate(num_samples: int, seed: int, cfg: dict) -> dict:
    points, triangles = graded_square(cfg["h"], cfg["h_min"], cfg["ratio"])
    params = sample_params(num_samples, seed)
    u = solve_convection_diffusion(points, triangles, params) if num_samples \
        else np.zeros((0, len(points)))
    return {"points": points, "triangles": triangles.astype(np.int32), "params": params,
            "u": u}


def make_boundary_layer_standin(num_samples: int = 300, seed: int = 0, cache_dir=None,
                                progress: bool = True, *, h: float = 1 / 32,
                                h_min: float = 2e-4, ratio: float = 1.3,
                                dtype=torch.float32) -> list:
    """Generate (or load from the cache) the boundary-layer stand-in.

    Args:
        num_samples: Number of samples.
        seed: Seed of the parameters.
        cache_dir: Cache folder (``None``: the default; ``False``: no cache).
        progress: Say what was generated/loaded (stderr).
        h, h_min, ratio: The graded mesh (:func:`graded_square`).
        dtype: Floating dtype of the returned tensors.

    Returns:
        ``list[MeshData]`` (see the module docstring).

    Shapes:
        item: pos ``[N, 2]``, x ``[N, 2]``, y ``[N, 1]``, params ``[1, 2]``
    """
    dtype = as_float_dtype(dtype)
    cfg = {"h": float(h), "h_min": float(h_min), "ratio": float(ratio)}
    meta = describe(GENERATOR, VERSION, cfg, seed, num_samples)
    arrays, _ = generate_or_load(meta, lambda: _generate(num_samples, seed, cfg), cache_dir,
                                 progress, "boundary-layer convection-diffusion")
    points, tri = arrays["points"], arrays["triangles"].astype(np.int64)
    return [parametric_sample(points, tri, INPUTS, prm, {TARGET: arrays["u"][s]},
                              f"boundary-layer STAND-IN sample {s} (seed {seed})", dtype, s,
                              standin=True)
            for s, prm in enumerate(arrays["params"])]
