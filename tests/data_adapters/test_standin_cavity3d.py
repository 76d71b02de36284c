"""The 3-D block-with-cavities stand-in (issue 37): its P1 elasticity solver gives the
exact uniaxial state of a bar, is linear in the load, the distance input is the true
distance to the ellipsoids, and the samples have the stated sizes, fields and units."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

pytest.importorskip("gmsh")

from data_adapters.standins import cavity3d as cv  # noqa: E402

#: Coarse meshes: the properties below do not need the default sizes.
COARSE = {"h": 0.4, "h_cavity": 0.12}
SPHERE = np.array([1.0, 0.5, 0.5, 0.25, 0.25, 0.25, 0.3, -0.2, 0.4])
ELLIPSOID = np.array([0.8, 0.45, 0.55, 0.22, 0.12, 0.09, 0.5, -0.6, 1.1])


def _boundary_nodes(tets) -> np.ndarray:
    """Nodes of the faces that only one tetrahedron has."""
    faces = np.sort(np.concatenate([tets[:, [0, 1, 2]], tets[:, [0, 1, 3]],
                                    tets[:, [0, 2, 3]], tets[:, [1, 2, 3]]]), axis=1)
    uniq, count = np.unique(faces, axis=0, return_counts=True)
    return np.unique(uniq[count == 1])


def _on_cavity(points, tets) -> np.ndarray:
    """Boundary nodes off the block's six planes: those on the cavities."""
    b = _boundary_nodes(tets)
    box = np.array([cv.LENGTH, cv.WIDTH, cv.HEIGHT])
    off = ((np.abs(points[b]) > 1e-9) & (np.abs(points[b] - box) > 1e-9)).all(1)
    return b[off]


def test_a_bar_under_axial_traction_is_in_exact_uniaxial_stress():
    """On rollers (``u_x = 0`` at ``x = 0`` and no more than removes the rigid motions) a
    uniform axial traction ``t`` gives ``sigma_xx = t``, every other stress zero, ``u =
    (t x, -nu t y, -nu t z) / E``: linear, so P1 holds it to the linear solver's
    rounding, and the projected von Mises stress is ``|t|`` at every node."""
    pts, tets = cv.mesh_block([], h=0.35)
    t = -7.5e6  # compression: the sign is kept
    u = cv.solve_elasticity(pts, tets, [t, 0.0, 0.0], support="roller")
    x, y, z = pts.T
    exact = np.stack([t * x, -cv.POISSON * t * y, -cv.POISSON * t * z], 1) / cv.YOUNG
    np.testing.assert_allclose(u, exact, rtol=0, atol=1e-10 * np.abs(exact).max())
    np.testing.assert_allclose(cv.von_mises(pts, tets, u), abs(t), rtol=1e-8)


def test_the_clamped_block_is_linear_in_the_load_and_balances_it():
    pts, tets = cv.mesh_block([ELLIPSOID], **COARSE)
    load = cv.traction(4e6, 0.4, -0.7)
    u1 = cv.solve_elasticity(pts, tets, load)
    u2 = cv.solve_elasticity(pts, tets, 2 * load)
    np.testing.assert_allclose(u2, 2 * u1, rtol=1e-9, atol=1e-12 * np.abs(u1).max())
    vm1, vm2 = cv.von_mises(pts, tets, u1), cv.von_mises(pts, tets, u2)
    np.testing.assert_allclose(vm2, 2 * vm1, rtol=1e-9)
    # clamped end fixed, the free end moves along the load's side
    clamped = np.abs(pts[:, 0]) < 1e-9
    assert np.abs(u1[clamped]).max() == 0.0
    end = np.abs(pts[:, 0] - cv.LENGTH) < 1e-9
    assert (u1[end].mean(0) @ load) > 0


def test_ellipsoid_distance_is_the_distance_to_the_surface():
    rng = np.random.default_rng(0)
    # a sphere: |x - c| - r exactly
    pts = SPHERE[:3] + rng.normal(size=(200, 3)) * 0.5
    far = np.linalg.norm(pts - SPHERE[:3], axis=1) > SPHERE[3]
    np.testing.assert_allclose(cv.ellipsoid_distance(pts[far], SPHERE),
                               np.linalg.norm(pts[far] - SPHERE[:3], axis=1) - SPHERE[3],
                               atol=1e-12)
    # an ellipsoid: the distance to a dense sampling of its surface from above, closely
    R = cv.rotation(*ELLIPSOID[6:])
    th, ph = np.meshgrid(np.linspace(0, np.pi, 200), np.linspace(0, 2 * np.pi, 400))
    unit = np.stack([np.sin(th) * np.cos(ph), np.sin(th) * np.sin(ph), np.cos(th)], -1)
    surface = ELLIPSOID[:3] + (unit.reshape(-1, 3) * ELLIPSOID[3:6]) @ R.T
    q = ELLIPSOID[:3] + rng.normal(size=(50, 3)) * 0.3
    local = (q - ELLIPSOID[:3]) @ R
    q = q[((local / ELLIPSOID[3:6]) ** 2).sum(1) > 1]
    got = cv.ellipsoid_distance(q, ELLIPSOID)
    dense = np.min(np.linalg.norm(q[:, None] - surface[None], axis=-1), 1)
    assert (got <= dense + 1e-12).all() and (dense - got).max() < 2e-3


def test_the_sdf_is_zero_on_the_cavities_and_exact_for_a_sphere():
    prm = np.r_[1, SPHERE, SPHERE, 1e6, 0.0, 0.0]
    pts, tets = cv.mesh_block(cv.cavities_of(prm), **COARSE)
    sdf = cv.cavity_distance(pts, prm)
    surface = _on_cavity(pts, tets)
    assert len(surface) > 50
    assert np.abs(sdf[surface]).max() < 1e-6
    np.testing.assert_allclose(sdf, np.linalg.norm(pts - SPHERE[:3], axis=1) - SPHERE[3],
                               atol=1e-6)
    assert sdf.min() >= 0


def test_samples_have_the_stated_sizes_fields_and_units():
    (s,) = cv.make_cavity3d_standin(2, seed=1, cache_dir=False, progress=False, first=1)
    n = s.pos.shape[0]
    assert 3000 <= n <= 6000 and s.pos.shape == (n, 3)
    assert s.x.shape == (n, 4) and s.y.shape == (n, 4) and s.params.shape == (1, 22)
    assert s.standin and "STAND-IN" in s.source and s.sample_id == 1
    assert [c[0] for c in s.cells] == ["tetra"]
    prm = s.params[0].numpy()
    # the tetrahedra's weights: the block's volume less the cavities' (to the faceting)
    cavities = sum(4 / 3 * math.pi * np.prod(c[3:6]) for c in cv.cavities_of(prm))
    volume = cv.LENGTH * cv.WIDTH * cv.HEIGHT - cavities
    assert float(s.weight.sum()) == pytest.approx(volume, rel=2e-3)
    for k, v in zip(cv.INPUTS[1:], prm[-3:]):
        np.testing.assert_allclose(s.fields[k].numpy(), v, rtol=1e-6)
    u = np.linalg.norm(s.y[:, :3].double().numpy(), axis=1).max()
    vm = float(s.fields["vm"].max())
    assert 1e-6 < u < 1e-2                     # m
    assert 1e5 < vm < 1e9 and 1e10 < vm / u < 1e12  # Pa, about 5e10 x the displacement


@pytest.mark.parametrize("bad, name", [({"refine": 0.5}, "refine=0.5"), ({"ring": 0}, "ring=0"),
                                       ({"ring": 2.5}, "ring=2.5"), ({"first": 4}, "first=4"),
                                       ({"band": 0.0}, "band=0.0")])
def test_bad_arguments_are_refused_by_name(bad, name):
    with pytest.raises(ValueError, match=name):
        cv.make_cavity3d_standin(3, cache_dir=False, progress=False, **bad)


def test_bad_solver_and_mesh_arguments_are_refused():
    pts, tets = cv.mesh_block([], h=0.6)
    with pytest.raises(ValueError, match="support"):
        cv.solve_elasticity(pts, tets, [1.0, 0, 0], support="pinned")
    with pytest.raises(ValueError, match="traction vector"):
        cv.solve_elasticity(pts, tets, [1.0, 0])
    with pytest.raises(ValueError, match="band width"):
        cv.mesh_block([SPHERE], ring=16, band=0.0)


def test_a_missing_gmsh_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gmsh", None)
    with pytest.raises(ImportError, match=r"meshops\[standins3d\]"):
        cv.mesh_block([])


def test_first_keeps_the_draw_and_the_plain_cache_key(tmp_path):
    full = cv.make_cavity3d_standin(3, seed=4, cache_dir=tmp_path, progress=False, **COARSE)
    tail = cv.make_cavity3d_standin(3, seed=4, cache_dir=False, progress=False, first=1,
                                    **COARSE)
    assert [s.sample_id for s in tail] == [1, 2]
    for a, b in zip(full[1:], tail):
        assert np.array_equal(a.params, b.params)
        assert np.array_equal(a.pos, b.pos)           # gmsh meshes deterministically
        np.testing.assert_allclose(a.y, b.y)
    np.testing.assert_array_equal(full[0].params[0], cv.sample_params(3, seed=4)[0])
    # the new options at their defaults read the plain set's cache file
    again = cv.make_cavity3d_standin(3, seed=4, cache_dir=tmp_path, progress=False, refine=1,
                                     ring=1, first=0, **COARSE)
    assert len(list(tmp_path.iterdir())) == 1 and np.array_equal(again[2].pos, full[2].pos)


def _volumes_and_distance(pts, tets, cavity):
    e = pts[tets[:, 1:]] - pts[tets[:, :1]]
    return np.abs(np.linalg.det(e)) / 6, cv.ellipsoid_distance(pts[tets].mean(1), cavity)


def test_the_ring_refines_the_band_at_the_cavities():
    """The band's tetrahedra are several times smaller than the plain mesh's there, while
    far from the cavity the sizes stay those of the plain mesh."""
    band = 0.06
    base = cv.mesh_block([ELLIPSOID], **COARSE)
    ring = cv.mesh_block([ELLIPSOID], ring=16, band=band, **COARSE)
    assert len(ring[0]) > 1.5 * len(base[0])
    vol_b, d_b = _volumes_and_distance(*base, ELLIPSOID)
    vol_r, d_r = _volumes_and_distance(*ring, ELLIPSOID)
    near_b, near_r = vol_b[d_b < band / 2].mean(), vol_r[d_r < band / 2].mean()
    assert near_r < near_b / 6
    far_b, far_r = vol_b[d_b > 0.6].mean(), vol_r[d_r > 0.6].mean()
    assert abs(far_r / far_b - 1) < 0.25
    assert near_r < far_r / 20
