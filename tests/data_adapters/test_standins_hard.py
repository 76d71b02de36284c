"""The harder stand-ins: properties of their physics that a wrong solver would break."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from data_adapters.standins import boundary_layer as bl
from data_adapters.standins import hole, materials


# ------------------------------------------------------------------ materials
@pytest.fixture(scope="module")
def plate():
    return materials.mesh_plate(h=0.1)


def test_triangles_carry_the_material_block_of_their_centroid(plate):
    points, tri, block = plate
    c = points[tri].mean(1)
    np.testing.assert_array_equal(block, materials.block_of(c[:, 0], c[:, 1]))
    assert sorted(set(block.tolist())) == list(range(8))


def test_homogeneous_bar_in_tension_matches_the_closed_form(plate):
    """Uniaxial stress s on a bar free to contract: plane strain gives
    u1 = (1 - nu^2) s x / E, u2 = -nu (1 + nu) s y / E, linear, so P1 is exact."""
    solver = materials.PlateSolver(*plate, support="roller")
    E, s = 2.5, 1.3
    u = solver.solve(np.r_[np.full(8, E), s, 0.0, 0.0])
    x, y = plate[0][:, 0], plate[0][:, 1]
    nu = materials.NU
    np.testing.assert_allclose(u[:, 0], (1 - nu ** 2) * s * x / E, atol=1e-12)
    np.testing.assert_allclose(u[:, 1], -nu * (1 + nu) * s * y / E, atol=1e-12)


def test_displacement_is_linear_in_the_loads_and_scales_with_one_over_E(plate):
    solver = materials.PlateSolver(*plate)
    p = materials.sample_params(1, seed=3)[0]
    u = solver.solve(p)
    scale = np.max(np.abs(u))
    loads = p.copy()
    loads[[8, 10]] *= 2.0
    np.testing.assert_allclose(solver.solve(loads), 2 * u, atol=1e-10 * scale)
    edge_only, top_only = p.copy(), p.copy()
    edge_only[10] = 0.0
    top_only[8] = 0.0
    np.testing.assert_allclose(solver.solve(edge_only) + solver.solve(top_only), u,
                               atol=1e-10 * scale)
    stiffer = p.copy()
    stiffer[:8] *= 4.0
    np.testing.assert_allclose(solver.solve(stiffer), u / 4.0, atol=1e-10 * scale)
    # a stiffer block next to the clamp makes the plate deflect less at the tip
    softer = p.copy()
    softer[[0, 4]] /= 10.0
    tip = np.argmax(plate[0][:, 0])
    assert np.linalg.norm(solver.solve(softer)[tip]) > np.linalg.norm(u[tip])


def test_materials_standin_samples_and_cache(tmp_path):
    a = materials.make_materials_standin(3, seed=1, cache_dir=tmp_path, progress=False, h=0.1)
    b = materials.make_materials_standin(3, seed=1, cache_dir=tmp_path, progress=False, h=0.1)
    assert len(list(tmp_path.iterdir())) == 1
    s = a[2]
    assert s.x.shape == (s.num_nodes, 11) and s.y.shape == (s.num_nodes, 2)
    assert s.params.shape == (1, 11) and s.standin
    # the inputs in the samples' float32, the parameters in float64 (issue 28)
    assert s.params.dtype == torch.float64
    np.testing.assert_array_equal(s.x[0].numpy(), s.params[0].float().numpy())
    np.testing.assert_array_equal(a[1].y.numpy(), b[1].y.numpy())
    solver = materials.PlateSolver(*materials.mesh_plate(0.1))
    np.testing.assert_allclose(s.y.numpy(), solver.solve(s.params[0].double().numpy()),
                               rtol=1e-5, atol=1e-6 * float(s.y.abs().max()))


# ----------------------------------------------------------------------- hole
def _annulus_error(h, r=0.3, R=1.0, biot=2.0):
    n = max(12, math.ceil(2 * math.pi * R / h))
    th = np.linspace(0.0, 2 * math.pi, n, endpoint=False)
    points, tri = hole.mesh_with_hole(R * np.stack([np.cos(th), np.sin(th)], 1), (0.0, 0.0),
                                      r, h, h)
    u = hole.solve_heat_with_hole(points, tri, (0.0, 0.0), r, biot)
    exact = hole.annulus_solution(np.linalg.norm(points, axis=1), r, R, biot)
    return np.abs(u - exact).max() / np.abs(exact).max()


def test_hole_solver_converges_to_the_annulus_closed_form():
    """P1 with polygonal boundaries: O(h^2) in the interior, at least O(h) overall."""
    coarse, fine = _annulus_error(0.1), _annulus_error(0.05)
    assert fine < 5e-3
    assert fine < coarse / 2


def test_hole_standin_has_one_mesh_per_sample_cut_by_its_hole(tmp_path):
    samples = hole.make_hole_standin(3, seed=2, cache_dir=tmp_path, progress=False)
    for a, b in ((0, 1), (0, 2), (1, 2)):  # three different meshes
        pa, pb = samples[a].pos, samples[b].pos
        assert pa.shape != pb.shape or not np.allclose(pa.numpy(), pb.numpy())
    for s in samples:
        cx, cy, r, bi = s.params[0].double().numpy()
        assert 0.05 <= r <= 0.2 and 0.1 <= bi <= 10.0
        assert min(cx, cy) - r >= hole.MARGIN - 1e-12 and max(cx, cy) + r <= 1 - hole.MARGIN + 1e-12
        d = np.linalg.norm(s.pos.double().numpy() - [cx, cy], axis=1)
        assert d.min() >= r * (1 - 1e-6)  # no node inside the hole
        u = s.y[:, 0].double().numpy()
        on = np.abs(d - r) <= 1e-6 * r
        assert on.sum() >= 12 and np.abs(u[on]).max() == 0.0
        assert u.min() >= -1e-7 * u.max()  # heated, cooled to 0: never below 0
        assert s.weight.sum().item() == pytest.approx(1 - math.pi * r * r, rel=2e-3)


# ------------------------------------------------------------- boundary layer
def test_graded_nodes_refine_to_h_min_at_the_chosen_ends():
    x = bl.graded_nodes(h=0.05, h_min=1e-3, ratio=1.5, left=True, right=True)
    d = np.diff(x)
    assert x[0] == 0.0 and x[-1] == 1.0 and (d > 0).all()
    assert d[0] == pytest.approx(1e-3) and d[-1] == pytest.approx(1e-3)
    assert d.max() <= 0.05 * 1.05
    right_only = np.diff(bl.graded_nodes(h=0.05, h_min=1e-3, ratio=1.5))
    assert right_only[-1] == pytest.approx(1e-3) and right_only[0] > 0.04


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 1e-1])
def test_layer_matches_the_1d_closed_form_without_oscillation(eps):
    """theta = 0 with zero-flux walls: u = x - (e^{(x-1)/eps} - e^{-1/eps}) / (1 - e^{-1/eps})
    exactly; the graded mesh resolves even eps = 1e-3 (a uniform mesh of as many
    nodes would not) and the discrete solution has no undershoot."""
    points, tri = bl.graded_square()
    u = bl.solve_convection_diffusion(points, tri, [[eps, 0.0]], walls="neumann")[0]
    exact = bl.layer_1d(points[:, 0], eps)
    assert np.abs(u - exact).max() < 1.5e-2
    assert u.min() >= -1e-3


def test_uniform_mesh_fails_where_the_graded_one_passes():
    import skfem

    n = len(bl.graded_nodes()), len(bl.graded_nodes(left=True))
    m = skfem.MeshTri.init_tensor(np.linspace(0, 1, n[0]), np.linspace(0, 1, n[1]))
    u = bl.solve_convection_diffusion(m.p.T, m.t.T, [[1e-3, 0.0]], walls="neumann")[0]
    assert np.abs(u - bl.layer_1d(m.p[0], 1e-3)).max() > 0.1


def test_boundary_layer_standin_samples(tmp_path):
    samples = bl.make_boundary_layer_standin(4, seed=0, cache_dir=tmp_path, progress=False)
    for s in samples:
        eps, theta = s.params[0].double().numpy()
        assert 1e-3 <= eps <= 1e-1 and abs(theta) <= math.pi / 6
        u = s.y[:, 0].double().numpy()
        pos = s.pos.double().numpy()
        assert np.abs(u[(pos == 0).any(1) | (pos == 1).any(1)]).max() == 0.0
        # away from the layers u follows the streamlines: u ~ x / cos(theta) along y = 0.5
        mid = (np.abs(pos[:, 1] - 0.5) < 0.02) & (np.abs(pos[:, 0] - 0.5) < 0.02)
        if eps < 0.01:
            np.testing.assert_allclose(u[mid], pos[mid, 0] / math.cos(theta), rtol=0.05)
