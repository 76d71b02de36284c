"""A parametric FEM **stand-in**: steady convection-diffusion on one fixed mesh.

The kind of data a new user brings to ``meshops train``: one mesh, a few scalar
parameters per sample given as constant input fields, a smooth solution. Sample
``s`` solves, with P1 finite elements (scikit-fem) on the unit square,

    -kappa * laplace(u) + w . grad(u) = exp(-|x - (0.5, 0.5)|^2 / (2 * 0.1^2)),
    u = 0 on the boundary,

with three parameters drawn from the seed: the diffusivity ``kappa``
(log-uniform in ``[0.02, 0.1]``) and the wind ``w = (wind_x, wind_y)`` (direction
uniform, speed uniform in ``[0.25, 1]``). The mesh is the structured triangulation
of an ``n x n`` grid of nodes (``n = 56``: 3,136 nodes); the cell Peclet number
``|w| h / (2 kappa)`` stays below 0.5, so the Galerkin solution is smooth (no
upwinding needed). The solution is linear in the source and, without wind, in
``1 / kappa``, which the tests check.

Each sample is a :class:`meshops.MeshData` with ``pos``, ``cells``, ``weight``,
``fields`` ``kappa``, ``wind_x``, ``wind_y`` (constant) and ``u``; ``x`` the three
parameter fields, ``y`` = ``u``, ``params [1, 3]``, ``standin=True``.
"""

from __future__ import annotations

import numpy as np
import torch

from meshops.datasets.folder import add_inputs_targets, as_float_dtype
from meshops.mesh.io import mesh_from_arrays

INPUTS = ("kappa", "wind_x", "wind_y")
TARGET = "u"


def sample_params(num_samples: int, seed: int = 0) -> np.ndarray:
    """``[S, 3]`` parameters ``(kappa, wind_x, wind_y)`` drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    kappa = np.exp(rng.uniform(np.log(0.02), np.log(0.1), num_samples))
    angle = rng.uniform(0, 2 * np.pi, num_samples)
    speed = rng.uniform(0.25, 1.0, num_samples)
    return np.stack([kappa, speed * np.cos(angle), speed * np.sin(angle)], 1)


def convection_diffusion_matrices(basis):
    """Stiffness ``K`` and the two advection matrices ``A_x``, ``A_y`` of a scalar basis:
    ``kappa K + w_x A_x + w_y A_y`` is the matrix of ``-kappa laplace(u) + w . grad(u)``.

    Shapes:
        -> three sparse ``[N, N]`` matrices (``N`` = ``basis.N``)
    """
    import skfem
    from skfem.helpers import dot, grad

    @skfem.BilinearForm
    def diffusion(u, v, _):
        return dot(grad(u), grad(v))

    @skfem.BilinearForm
    def advection_x(u, v, _):
        return grad(u)[0] * v

    @skfem.BilinearForm
    def advection_y(u, v, _):
        return grad(u)[1] * v

    return tuple(f.assemble(basis) for f in (diffusion, advection_x, advection_y))


def solve_convection_diffusion(n: int, params: np.ndarray, source: float = 1.0):
    """P1 solutions on the ``n x n``-node unit square for each row of ``params``.

    Args:
        n: Nodes per side.
        params: ``[S, 3]`` rows ``(kappa, wind_x, wind_y)``.
        source: Amplitude of the Gaussian source.

    Returns:
        ``(points [N, 2], triangles [M, 3], u [S, N])``.
    """
    import skfem

    t = np.linspace(0.0, 1.0, n)
    mesh = skfem.MeshTri.init_tensor(t, t)
    basis = skfem.Basis(mesh, skfem.ElementTriP1())

    @skfem.LinearForm
    def rhs(v, w):
        x, y = w.x
        return source * np.exp(-((x - 0.5) ** 2 + (y - 0.5) ** 2) / (2 * 0.1 ** 2)) * v

    K, Ax, Ay = convection_diffusion_matrices(basis)
    b = rhs.assemble(basis)
    boundary = mesh.boundary_nodes()
    out = np.zeros((len(params), mesh.p.shape[1]))
    for s, (kappa, wx, wy) in enumerate(np.asarray(params, dtype=np.float64)):
        A = kappa * K + wx * Ax + wy * Ay
        out[s] = skfem.solve(*skfem.condense(A, b, D=boundary))
    return mesh.p.T.copy(), mesh.t.T.copy(), out


def make_convection_diffusion_standin(num_samples: int = 200, seed: int = 0, n: int = 56,
                                      dtype=torch.float32) -> list:
    """Generate the convection-diffusion stand-in.

    Args:
        num_samples: Number of samples.
        seed: Seed of the parameters.
        n: Nodes per side of the fixed mesh (``n * n`` nodes).
        dtype: Floating dtype of the returned tensors.

    Returns:
        ``list[MeshData]`` (see the module docstring).

    Shapes:
        item: pos ``[n*n, 2]``, x ``[n*n, 3]``, y ``[n*n, 1]``, params ``[1, 3]``
    """
    dtype = as_float_dtype(dtype)
    params = sample_params(num_samples, seed)
    points, triangles, u = solve_convection_diffusion(n, params)
    samples = []
    for s, p in enumerate(params):
        fields = {name: np.full(len(points), v) for name, v in zip(INPUTS, p)}
        fields[TARGET] = u[s]
        mesh = mesh_from_arrays(points, [("triangle", triangles)], fields,
                                source=f"convection-diffusion STAND-IN sample {s} (seed {seed})")
        samples.append(add_inputs_targets(mesh, INPUTS, [TARGET], dtype, sample_id=s, standin=True,
                                          params=torch.as_tensor(p)[None]))
    return samples
