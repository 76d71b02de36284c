"""Discretisation consistency: the property that defines meshops.

With fixed random parameters and smooth input fields, every layer's output at a
fixed set of points must

1. converge as the mesh is refined (nested refinements, so the probe points are
   vertices of every mesh): the error ratio between refinements is checked against
   the order of the nodal quadrature (2 for smooth kernels, 1 for kernels with a
   hard cut-off such as kNN/quantile balls and patch borders);
2. agree between a strongly graded mesh and a uniform one, to within a tolerance
   that the same layer with uniform weights ``w = 1/N`` misses by a layer-specific
   factor (``GRADED_RATIO``: hundreds to thousands for smooth kernels, tens for
   balls and patches).

The observed figures are printed (``pytest -s``); the bounds below are derived from
them. Both tests also run on CUDA (``device64``: float64) where a GPU is present.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshops.mesh.quadrature import quadrature_weights

IN_CHANNELS = 8


def rectilinear(xs: np.ndarray, ys: np.ndarray):
    """Quad mesh on the tensor grid ``xs x ys``: points ``[N, 2]``, cells."""
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    pts = np.stack([X.ravel(), Y.ravel()], 1)
    idx = np.arange(len(pts)).reshape(len(xs), len(ys))
    q = np.stack([idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]], -1).reshape(-1, 4)
    return pts, [("quad", q)]


def input_field(pts: np.ndarray) -> torch.Tensor:
    """Smooth input channels ``[N, IN_CHANNELS]``."""
    x, y = pts[:, 0], pts[:, 1]
    cols = [np.sin(np.pi * x) * np.cos(np.pi * y), x ** 2 + y, np.cos(2 * x * y),
            np.exp(-x), y * (1 - y), np.sin(2 * y + x), x * y, np.ones_like(x)]
    return torch.tensor(np.stack(cols, 1), dtype=torch.float64)


def run(layer, pts, weight, device):
    pos = torch.tensor(pts, dtype=torch.float64)
    with torch.no_grad():
        return device.run(layer, input_field(pts), pos, weight)


def probe_rows(pts: np.ndarray, probes: np.ndarray) -> np.ndarray:
    """Row of each probe point in ``pts`` (probes are vertices of the mesh)."""
    lookup = {tuple(np.round(p, 12)): i for i, p in enumerate(pts)}
    return np.array([lookup[tuple(np.round(p, 12))] for p in probes])


def _layers():
    """name -> (factory, convergence order, GRADED_RATIO bound)."""
    from meshops.nn import (
        ContinuumAttention,
        FourierAttention,
        GalerkinAttention,
        LocalAttention,
        LocalPositionAttention,
        PositionAttention,
        patch_attention,
    )
    from meshops.nn.slice import SliceAttention

    # Smooth kernels converge at the order of the nodal quadrature (2). A hard
    # cut-off (a ball, a patch border) is integrated to first order, because the
    # nodal rule does not resolve where the border cuts a cell.
    #
    # GRADED_RATIO (test_graded_mesh_matches_uniform_mesh): with w = 1/N the graded
    # mesh (3/4 of its points in 1/4 of the domain) is a wrong measure, an O(1) error
    # whatever h; with quadrature weights the error is the rule's, O(h^2) for a
    # smooth kernel and O(h) for a cut-off, at h = 1/16: the ratio scales like
    # 16^2 = 256 resp. 16, times a layer constant. Observed (pytest -s, these fixed
    # parameters; in brackets the smallest over 6 parameter draws): continuum 1519
    # (1519), galerkin 695 (562), fourier 538 (538), position 62 (56: its lambda = 20
    # Gaussian is ~3 cells wide, so the h^2 constant is large), local_position_radius
    # 29 (26), local_radius 25 (21), patch_window_voxel 277 (248), patch_token_voxel
    # 72 (58), slice 1481 (its tokens are ratios of smooth integrals; convergence
    # ratios 4.00). Each bound is about 2/3 of the smallest seen: a lost order (O(h)
    # instead of O(h^2): 16x) or an unweighted sum anywhere fails it.
    layers = {
        "continuum": (lambda: ContinuumAttention(IN_CHANNELS, 8, heads=2), 2, 1000),
        "galerkin": (lambda: GalerkinAttention(IN_CHANNELS, 8, heads=2), 2, 400),
        "fourier": (lambda: FourierAttention(IN_CHANNELS, 8, heads=2), 2, 350),
        "position": (lambda: PositionAttention(IN_CHANNELS, 8, heads=2, lam_init=[5.0, 20.0]),
                     2, 40),
        "local_position_radius": (lambda: LocalPositionAttention(
            IN_CHANNELS, 8, heads=2, radius=0.3, lam_init=[5.0, 20.0]), 1, 18),
        "local_radius": (lambda: LocalAttention(IN_CHANNELS, 8, heads=2, radius=0.3), 1, 14),
        # Voxel patches are fixed boxes of the domain; kd patches balance point
        # counts and so move with the point density (not mesh-independent).
        "patch_window_voxel": (lambda: patch_attention(
            IN_CHANNELS, 8, heads=2, num_patches=4, method="voxel", mode="window"), 1, 160),
        "patch_token_voxel": (lambda: patch_attention(
            IN_CHANNELS, 8, heads=2, num_patches=4, method="voxel", mode="token", pos_dim=2),
            1, 40),
        "slice": (lambda: SliceAttention(IN_CHANNELS, 8, heads=2, slices=4), 2, 900),
        # a temperature per point is a pointwise map: the same order as the plain layer
        "slice_adaptive": (lambda: SliceAttention(IN_CHANNELS, 8, heads=2, slices=4,
                                                  adaptive_temperature=True), 2, 900),
        # the slices' measures are integrals of smooth functions too (floor 0.3: most
        # of the 4 slices weigh about m / (m + 0.3), away from both limits)
        "slice_min_measure": (lambda: SliceAttention(IN_CHANNELS, 8, heads=2, slices=4,
                                                     min_measure=0.3), 2, 900),
    }
    return layers


LAYERS = _layers()


def make(name):
    """The layer in float64 with fixed generic projections: every ``Linear`` drawn here
    from ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with a seeded generator, so that the
    figures bounded below do not move with the library's initialisation scheme (norms
    keep their identity init, lambdas come from ``lam_init``)."""
    factory, order, graded_ratio = LAYERS[name]
    layer = factory().double().eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, m in sorted(layer.named_modules(), key=lambda item: item[0]):
            if isinstance(m, torch.nn.Linear):
                bound = m.in_features ** -0.5
                for p in (m.weight, m.bias):
                    if p is not None:
                        p.copy_((torch.rand(p.shape, generator=g, dtype=p.dtype) * 2 - 1)
                                * bound)
    return layer, order, graded_ratio


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_converges_under_nested_refinement(name, device64):
    layer, order, _ = make(name)
    layer = device64.module(layer)
    probes, _ = rectilinear(np.linspace(0, 1, 5), np.linspace(0, 1, 5))
    outs = []
    for n in (8, 16, 32, 64):
        g = np.linspace(0, 1, n + 1)
        pts, cells = rectilinear(g, g)
        w = quadrature_weights(pts, cells)
        outs.append(run(layer, pts, w, device64)[probe_rows(pts, probes)])
    errs = [float((outs[i] - outs[i + 1]).abs().max()) for i in range(len(outs) - 1)]
    ratios = [errs[i] / errs[i + 1] for i in range(len(errs) - 1)]
    print(f"\n{name}: successive differences {errs}, ratios {ratios}")
    # Order p gives a ratio of 2^p per halving of h. Smooth kernels (p = 2) show
    # 4.00-4.13 at every step (pytest -s): each ratio must exceed 3.5, room for the
    # pre-asymptotic h^3 term but not for a lost order (2). Points entering and
    # leaving a ball or patch make single ratios of cut-off layers (p = 1) erratic
    # (1.7 to 5.6), so there the mean ratio over the range is checked: observed 1.78
    # (patch_window_voxel) to 3.08 (local_position_radius), bound 1.6, below the
    # asymptotic 2 by the 10% the smallest of them shows.
    mean_ratio = (errs[0] / errs[-1]) ** (1 / (len(errs) - 1))
    print(f"{name}: mean ratio {mean_ratio:.2f}")
    if order == 2:
        assert min(ratios) > 3.5, ratios
    else:
        assert mean_ratio > 1.6, ratios
    assert errs[-1] < 0.03 * float(outs[-1].abs().max())


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_graded_mesh_matches_uniform_mesh(name, device64):
    layer, _, graded_ratio = make(name)
    layer = device64.module(layer)
    uniform = np.linspace(0, 1, 17)
    # 48 extra x-lines packed into [0, 1/4]: three quarters of the points in a quarter
    # of the domain. The uniform grid's lines are kept, so its nodes are shared.
    extra = 0.25 * np.linspace(0, 1, 50)[1:-1] ** 1.5
    graded_x = np.unique(np.round(np.concatenate([uniform, extra]), 14))
    pts_u, cells_u = rectilinear(uniform, uniform)
    pts_g, cells_g = rectilinear(graded_x, uniform)
    rows_g = probe_rows(pts_g, pts_u)
    w_u, w_g = quadrature_weights(pts_u, cells_u), quadrature_weights(pts_g, cells_g)

    out_u = run(layer, pts_u, w_u, device64)
    err_w = float((run(layer, pts_g, w_g, device64)[rows_g] - out_u).abs().max())
    ones_u = torch.full_like(w_u, 1 / len(w_u))
    ones_g = torch.full_like(w_g, 1 / len(w_g))
    err_1n = float((run(layer, pts_g, ones_g, device64)[rows_g]
                    - run(layer, pts_u, ones_u, device64)).abs().max())
    scale = float(out_u.abs().max())
    print(f"\n{name}: graded-vs-uniform error {err_w:.3e} with quadrature weights, "
          f"{err_1n:.3e} with w = 1/N (ratio {err_1n / err_w:.1f}), output scale {scale:.3f}")
    assert err_1n >= graded_ratio * err_w, (err_1n / err_w, graded_ratio)
    assert err_w < 0.05 * scale
