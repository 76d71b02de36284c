"""Offline stand-ins: the solvers against known solutions, determinism and caching."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import data_adapters.standins.airfoil as airfoil_mod
import data_adapters.standins.elasticity as elasticity_mod
from data_adapters import make_airfoil_standin, make_elasticity_standin
from data_adapters.standins._cache import ENV_VAR, cache_root
from data_adapters.standins.airfoil import local_mach
from data_adapters.standins.elasticity import mesh_unit_cell, void_radius
from data_adapters.standins.fem import nodal_stress, solve_plane_strain
from data_adapters.standins.naca4 import naca4
from data_adapters.standins.panel import solve_panels
from meshops.mesh.io import mesh_from_arrays

# Small, coarse settings so the generators run in a fraction of a second per sample.
EL_FAST = dict(h_void=0.03, h_outer=0.1)
AF_FAST = dict(n_side=21, n_wake=8, n1=12)


# ---------------------------------------------------------------------------------
# FEM: Kirsch plate and equilibrium
# ---------------------------------------------------------------------------------
def test_fem_kirsch_stress_concentration():
    """Plate [0, 1]^2 with a hole of radius a = 0.05 under uniaxial tension 1 (top
    traction, bottom on rollers): sigma_yy at the hole's sides -> 3 (Kirsch; the
    finite width d/W = 0.1 raises it to about 3.03), sigma_xx at its top and bottom
    -> -1. Tolerance 5 % (resp. 10 %): P1 stresses are only first-order accurate and
    the nodal values are L2 projections of element constants; with h = a/20 on the
    hole (about 1200 nodes) we observe 2.94-3.01 and -0.96..-1.02."""
    a = 0.05
    points, tri = mesh_unit_cell(np.r_[a, np.zeros(10)], h_void=0.0025, h_outer=0.05)
    u = solve_plane_strain(points, tri, E=1.0, nu=0.3, traction=1.0, support="roller")
    s = nodal_stress(points, tri, u, nu=0.3)
    near = lambda x, y: int(np.argmin(np.hypot(points[:, 0] - x, points[:, 1] - y)))  # noqa
    sides = [near(0.5 + a, 0.5), near(0.5 - a, 0.5)]
    poles = [near(0.5, 0.5 + a), near(0.5, 0.5 - a)]
    assert np.hypot(*(points[sides[0]] - (0.5 + a, 0.5))) < 1e-9  # nodes on the hole
    scf = s[sides, 1].mean()
    assert abs(scf - 3.0) < 0.05 * 3.0, scf
    assert abs(s[poles, 0].mean() + 1.0) < 0.10, s[poles, 0]
    # far from the hole the stress is the applied uniaxial tension
    corner = near(0.1, 0.9)
    assert s[corner] == pytest.approx([0.0, 1.0, 0.0], abs=0.02)


@pytest.mark.parametrize("support", ["clamped", "roller"])
def test_fem_equilibrium_with_quadrature_weights(support):
    """Discrete equilibrium with the test functions v = (0, y) and (y, 0), which vanish
    on the bottom edge: int sigma_yy = traction * width = 1 and int sigma_xy = 0,
    exactly (the L2 projection keeps integrals, the weights integrate P1 exactly)."""
    params = np.r_[0.25, 0.03, 0.0, 0.01, 0, 0, 0.02, 0, 0, 0, 0]
    points, tri = mesh_unit_cell(params, h_void=0.02, h_outer=0.06)
    w = mesh_from_arrays(points, [("triangle", tri)]).weight.numpy()
    s = nodal_stress(points, tri, solve_plane_strain(points, tri, support=support))
    assert (w * s[:, 1]).sum() == pytest.approx(1.0, abs=1e-9)
    assert (w * s[:, 2]).sum() == pytest.approx(0.0, abs=1e-9)


# ---------------------------------------------------------------------------------
# Panel method: symmetric airfoil, lift slope, zero-lift angle, cylinder
# ---------------------------------------------------------------------------------
def test_panel_symmetric_airfoil_has_no_lift():
    sol = solve_panels(naca4(0.0, 0.0, 0.12, 101), alpha=0.0)
    assert abs(sol.cl) < 1e-12  # observed ~1e-17
    # and the surface speed is symmetric
    vt = np.abs(sol.vt)
    assert np.allclose(vt, vt[::-1], atol=1e-12)


@pytest.mark.parametrize("t", [0.06, 0.12])
def test_panel_lift_slope(t):
    """dCl/dalpha from Kutta-Joukowski: thin-airfoil theory gives 2 pi; thickness raises
    it, to about 2 pi (1 + 0.77 t) for these sections. Tolerance: within 2 % of that
    (200 panels; observed +0.5 % for NACA 0006, +0.9 % for NACA 0012), and for
    NACA 0006 between 2 pi and 1.08 * 2 pi."""
    c = naca4(0.0, 0.0, t, 101)
    da = np.radians(2.0)
    slope = (solve_panels(c, da).cl - solve_panels(c, -da).cl) / (2 * da)
    assert slope == pytest.approx(2 * np.pi * (1 + 0.77 * t), rel=0.02)
    if t == 0.06:
        assert 2 * np.pi < slope < 1.08 * 2 * np.pi


def test_panel_zero_lift_angle_of_cambered_airfoil():
    """NACA 2412: zero-lift angle from thin-airfoil theory,
    alpha_L0 = -(1/pi) int_0^pi dyc/dx (cos th - 1) dth (about -2.08 deg), within 0.15 deg."""
    m, p = 0.02, 0.4
    th = np.linspace(0, np.pi, 200001)
    x = 0.5 * (1 - np.cos(th))
    dyc = np.where(x < p, 2 * m / p ** 2 * (p - x), 2 * m / (1 - p) ** 2 * (p - x))
    alpha_l0 = -np.trapezoid(dyc * (np.cos(th) - 1), th) / np.pi
    c = naca4(m, p, 0.12, 101)
    cl0, cl1 = solve_panels(c, 0.0).cl, solve_panels(c, 0.01).cl
    panel_l0 = -cl0 / ((cl1 - cl0) / 0.01)
    assert np.degrees(alpha_l0) == pytest.approx(-2.08, abs=0.01)
    assert np.degrees(panel_l0) == pytest.approx(np.degrees(alpha_l0), abs=0.15)


def test_panel_cylinder_matches_potential_flow():
    """Non-lifting flow past a unit circle: surface speed 2 V sin(theta) at the panel
    midpoints and the analytic field u - i v = V (1 - 1/z^2) off the body (within 1 %,
    100 panels: the polygon is a slightly smaller body)."""
    th = np.linspace(0.0, -2 * np.pi, 101)  # clockwise
    circle = np.stack([np.cos(th), np.sin(th)], 1)
    circle[-1] = circle[0]
    sol = solve_panels(circle, 0.0, lifting=False)
    mid = 0.5 * (circle[:-1] + circle[1:])
    ang = np.arctan2(mid[:, 1], mid[:, 0])
    assert np.allclose(np.abs(sol.vt), 2 * np.abs(np.sin(ang)), atol=1e-6)
    pts = np.array([[2.0, 0.0], [0.0, 1.5], [1.2, 1.2], [-3.0, 0.5]])
    z = pts[:, 0] + 1j * pts[:, 1]
    w = 1 - 1 / z ** 2
    assert np.allclose(sol.velocity(pts), np.stack([w.real, -w.imag], 1), atol=0.01)
    # lifting: the sheet's circulation vanishes at zero incidence for a symmetric body
    assert abs(solve_panels(circle, 0.0).cl) < 1e-10


def test_local_mach_approximation():
    assert local_mach(1.0, 0.5) == pytest.approx(0.5)
    assert local_mach(0.0, 0.5) == 0.0
    q = np.linspace(0.0, 3.0, 31)
    assert np.all(np.diff(local_mach(q, 0.5)) >= 0)  # monotone in the speed ...
    assert np.all(np.diff(local_mach(q[2:], 0.5)) > 0)  # ... strictly above q = 1 - beta
    assert np.isfinite(local_mach(100.0, 0.7))  # clipped below the vacuum limit


# ---------------------------------------------------------------------------------
# Stand-in data sets
# ---------------------------------------------------------------------------------
def test_elasticity_standin_samples(tmp_path, capsys):
    data = make_elasticity_standin(3, seed=0, cache_dir=tmp_path, progress=True,
                                   dtype=torch.float64, **EL_FAST)
    err = capsys.readouterr().err
    assert "STAND-IN" in err and "generated 3 elasticity" in err
    for m in data:
        assert m.standin is True and "stand-in" in m.source
        assert m.cells[0][0] == "triangle" and m.params.shape == (1, 11)
        assert m.y.shape == (m.pos.shape[0], 1) and m.x.shape == (m.pos.shape[0], 0)
        assert torch.equal(m.y[:, 0], m.fields["sigma"]) and (m.fields["sigma"] >= 0).all()
        # weights from the cells: the measure is 1 - void area (polygonal void)
        prm = m.params[0].numpy()
        th = np.linspace(0, 2 * np.pi, 4096, endpoint=False)
        void = 0.5 * np.mean(void_radius(th, prm) ** 2) * 2 * np.pi
        assert m.measure == pytest.approx(1 - void, abs=2e-3)
        r = void_radius(th, prm)
        assert 0.15 - 1e-9 <= r.min() and r.max() <= 0.4 + 1e-9
        # the largest stress sits on the void, as in the benchmark
        pos = m.pos.numpy()
        d = np.hypot(pos[:, 0] - 0.5, pos[:, 1] - 0.5)
        i = int(m.fields["sigma"].argmax())
        theta_i = np.arctan2(pos[i, 1] - 0.5, pos[i, 0] - 0.5)
        assert d[i] == pytest.approx(void_radius([theta_i], prm)[0], abs=0.02)
    # loading from the cache says so, and gives identical tensors
    again = make_elasticity_standin(3, seed=0, cache_dir=tmp_path, progress=True,
                                    dtype=torch.float64, **EL_FAST)
    assert "loaded 3 elasticity STAND-IN" in capsys.readouterr().err
    assert all(torch.equal(a.pos, b.pos) and torch.equal(a.y, b.y) for a, b in zip(data, again))
    # the distance to the void as the input: zero on the void's nodes (they lie on
    # the curve; the 1024-gon's chords deviate by ~ L^2 kappa / 8 ~ 1e-6 for chords
    # L ~ 2e-3 and curvature kappa up to ~10), at least 0.1 on the sides
    feat = make_elasticity_standin(3, seed=0, cache_dir=tmp_path, progress=False,
                                   dtype=torch.float64, void_distance=True, **EL_FAST)
    for m, plain in zip(feat, data):
        assert torch.equal(m.pos, plain.pos) and m.x.shape == (m.pos.shape[0], 1)
        pos, dist = m.pos.numpy(), m.x[:, 0].numpy()
        r = np.hypot(pos[:, 0] - 0.5, pos[:, 1] - 0.5)
        on_void = np.isclose(r, void_radius(np.arctan2(pos[:, 1] - 0.5, pos[:, 0] - 0.5),
                                            m.params[0].numpy()), atol=1e-12)
        assert on_void.sum() >= 16 and dist[on_void].max() < 1e-5
        on_side = (pos.min(1) < 1e-12) | (pos.max(1) > 1 - 1e-12)
        assert dist[on_side].min() >= 0.1 - 1e-9 and (dist[~on_void] > 0).all()


def test_default_elasticity_mesh_size():
    """The default mesh has about as many nodes as the benchmark's 972."""
    rng = np.random.default_rng(1)
    n = [len(mesh_unit_cell(elasticity_mod.sample_void_params(rng))[0]) for _ in range(3)]
    assert all(900 <= k <= 1100 for k in n), n


def test_airfoil_standin_samples(tmp_path):
    data = make_airfoil_standin(3, seed=0, cache_dir=tmp_path, progress=False,
                                dtype=torch.float64, **AF_FAST)
    n0, n1 = 2 * 21 - 1 + 2 * 8, 12
    for m in data:
        assert m.standin is True and "stand-in" in m.source and "panel method" in m.source
        assert m.grid_shape.tolist() == [[n0, n1]] and m.pos.shape == (n0 * n1, 2)
        assert torch.equal(m.y[:, 0], m.fields["mach"])
        alpha = np.radians(float(m.params[0, 3]))
        assert torch.allclose(m.x, torch.tensor([np.cos(alpha), np.sin(alpha)]).expand_as(m.x))
        assert -5 <= float(m.params[0, 3]) <= 10
        # far field: free-stream Mach; a stagnation point on the airfoil (cp ~ 1)
        mach = m.fields["mach"].numpy().reshape(n0, n1)
        assert np.abs(mach[:, -1] - 0.5).max() < 0.05
        cp = m.fields["cp"].numpy().reshape(n0, n1)
        assert cp[8:n0 - 8, 0].max() > 0.9  # coarse: no node exactly at stagnation
        assert (m.weight > 0).all()
    # targets and inputs are selectable (and not part of the cache key)
    alt = make_airfoil_standin(3, seed=0, cache_dir=tmp_path, progress=False, target=["cp"],
                               inputs=(), **AF_FAST)
    assert alt[0].x.shape[1] == 0 and torch.allclose(alt[0].y[:, 0].double(),
                                                     data[0].fields["cp"], atol=1e-6)
    assert len(list(tmp_path.iterdir())) == 1


def test_airfoil_wall_distance_is_the_distance_to_the_naca_curve(tmp_path):
    """``wall_distance`` is the distance to the airfoil itself, not to the grid's wall
    nodes: against a plain reference (the nearest of 40,001 points of the curve a side:
    within their spacing's sag), zero on the airfoil's wall nodes (which lie on the
    curve) to the polyline's sag, positive off it; on a finer grid of the same shapes
    too."""
    from scipy.spatial import cKDTree

    from data_adapters.standins.naca4 import naca4

    coarse = make_airfoil_standin(2, seed=0, cache_dir=tmp_path, progress=False,
                                  dtype=torch.float64, inputs=("wall_distance",), **AF_FAST)
    fine = make_airfoil_standin(2, seed=0, cache_dir=tmp_path, progress=False,
                                dtype=torch.float64, inputs=("wall_distance",),
                                n_side=41, n_wake=16, n1=23)
    n0, n1 = 2 * 21 - 1 + 2 * 8, 12
    for c, f in zip(coarse, fine):
        m, p, t, _ = c.params[0].tolist()
        dense = naca4(m, p, t, 40001)
        for mesh in (c, f):
            d = mesh.x[:, 0].numpy()
            assert torch.equal(mesh.x[:, 0], mesh.fields["wall_distance"])
            ref = cKDTree(dense).query(mesh.pos.numpy())[0]
            # the reference's own error: at most half its spacing, about 4e-5 chord
            np.testing.assert_allclose(d, ref, atol=5e-5)
        wall = c.x[:, 0].numpy().reshape(n0, n1)[8:n0 - 8, 0]
        assert np.abs(wall).max() < 1e-6
        assert (c.x[:, 0].numpy().reshape(n0, n1)[:, 1:] > 1e-4).all()


@pytest.mark.parametrize("make, fast, mod", [
    (make_elasticity_standin, EL_FAST, elasticity_mod),
    (make_airfoil_standin, AF_FAST, airfoil_mod),
])
def test_standin_determinism_and_cache(tmp_path, monkeypatch, make, fast, mod):
    a = make(2, seed=0, cache_dir=tmp_path / "a", progress=False, **fast)
    b = make(2, seed=0, cache_dir=tmp_path / "b", progress=False, **fast)
    fa, fb = list((tmp_path / "a").iterdir()), list((tmp_path / "b").iterdir())
    assert len(fa) == len(fb) == 1 and fa[0].name == fb[0].name
    assert fa[0].read_bytes() == fb[0].read_bytes()  # byte-identical cache files
    for x, y in zip(a, b):
        for k in ("pos", "weight", "x", "y", "params"):
            assert torch.equal(getattr(x, k), getattr(y, k))
    c = make(2, seed=1, cache_dir=tmp_path / "c", progress=False, **fast)
    assert not torch.equal(a[0].params, c[0].params)
    assert next((tmp_path / "c").iterdir()).read_bytes() != fa[0].read_bytes()
    # A second call loads the cache (the generator must not run again) ...
    monkeypatch.setattr(mod, "_generate", lambda *args, **kw: pytest.fail("regenerated"))
    d = make(2, seed=0, cache_dir=tmp_path / "a", progress=False, **fast)
    assert all(torch.equal(x.y, y.y) for x, y in zip(a, d))
    # ... and other parameters are another cache entry.
    with pytest.raises(pytest.fail.Exception, match="regenerated"):
        make(3, seed=0, cache_dir=tmp_path / "a", progress=False, **fast)
    # No temporary files are left behind.
    assert [p.name for p in (tmp_path / "a").iterdir()] == [fa[0].name]


def test_cache_location(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env" / "standins"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    assert cache_root(False) is None
    make_elasticity_standin(1, seed=3, progress=False, **EL_FAST)
    assert len(list((tmp_path / "env" / "standins").glob("elasticity-v1-n1-seed3-*.npz"))) == 1
    monkeypatch.delenv(ENV_VAR)
    from pathlib import Path
    assert cache_root() == Path.home() / ".cache" / "meshops" / "standins"
    # no cache at all
    before = set((tmp_path / "env" / "standins").iterdir())
    data = make_elasticity_standin(1, seed=4, cache_dir=False, progress=False, **EL_FAST)
    assert len(data) == 1 and set((tmp_path / "env" / "standins").iterdir()) == before


def test_corrupt_cache_is_regenerated(tmp_path):
    make_elasticity_standin(1, seed=0, cache_dir=tmp_path, progress=False, **EL_FAST)
    f = next(tmp_path.iterdir())
    good = f.read_bytes()
    f.write_bytes(b"not a zip")
    data = make_elasticity_standin(1, seed=0, cache_dir=tmp_path, progress=False, **EL_FAST)
    assert f.read_bytes() == good and len(data) == 1
