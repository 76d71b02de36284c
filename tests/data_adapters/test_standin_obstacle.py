"""The obstacle-flow stand-in (issue 27): its Navier-Stokes solver reproduces Poiseuille
flow exactly (Taylor-Hood holds the quadratic velocity and the linear pressure), conserves
mass past an obstacle, and the samples have the sizes and units the docstring states."""

from __future__ import annotations

import math

import numpy as np
import pytest

from data_adapters.standins import obstacle as ob


def _channel_mesh(h: float = 0.1):
    import triangle

    box = np.array([[0, 0], [ob.LENGTH, 0], [ob.LENGTH, ob.HEIGHT], [0, ob.HEIGHT]], float)
    out = triangle.triangulate({"vertices": box,
                                "segments": np.array([[0, 1], [1, 2], [2, 3], [3, 0]])},
                               f"pq30a{math.sqrt(3) / 4 * h * h:.10f}")
    return np.asarray(out["vertices"]), np.asarray(out["triangles"], np.int64)


def test_an_empty_channel_gives_poiseuille_flow_exactly():
    """u = 6 U y (H - y) / H^2, v = 0, p = 12 rho nu U (L - x) / H^2 (zero normal stress at
    the outflow) solve the equations, and P2/P1 elements hold them exactly: the error
    is the linear solver's, not the discretisation's."""
    pts, tri = _channel_mesh()
    u, v, p = ob.solve_flow(pts, tri)
    x, y = pts[:, 0], pts[:, 1]
    U, H, L = ob.U_MEAN, ob.HEIGHT, ob.LENGTH
    np.testing.assert_allclose(u, 6 * U * y * (H - y) / H ** 2, atol=1e-10)
    np.testing.assert_allclose(v, 0.0, atol=1e-10)
    np.testing.assert_allclose(p, ob.RHO * 12 * ob.NU * U * (L - x) / H ** 2, atol=1e-7)


def test_mass_is_conserved_past_an_obstacle():
    """The flux through the outflow equals the inflow's, U H, to the trapezoid rule's
    accuracy on the vertex values (h^2 ~ 5e-3 relative)."""
    prm = ob.sample_params(1, seed=3)[0]
    pts, tri, body = ob.mesh_channel(prm)
    u, v, p = ob.solve_flow(pts, tri)
    out = np.flatnonzero(np.abs(pts[:, 0] - ob.LENGTH) < 1e-9)
    order = out[np.argsort(pts[out, 1])]
    flux = np.trapezoid(u[order], pts[order, 1])
    assert flux == pytest.approx(ob.U_MEAN * ob.HEIGHT, rel=5e-3)
    # no slip on the obstacle
    on_body = np.flatnonzero(np.min(np.linalg.norm(pts[:, None] - body[None], axis=-1), 1)
                             < 1e-12)
    assert len(on_body) == len(body)
    assert float(np.abs(np.r_[u[on_body], v[on_body]]).max()) < 1e-12


def test_samples_have_the_stated_sizes_and_units():
    # sample 2 of a draw of 3, on the default meshes and on 4x the nodes
    train = ob.make_obstacle_standin(3, seed=0, cache_dir=False, progress=False, first=2)
    fine = ob.make_obstacle_standin(3, seed=0, cache_dir=False, progress=False, refine=2,
                                    first=2)
    for s in train:
        assert 1500 <= s.pos.shape[0] <= 2500
        assert s.x.shape == (s.pos.shape[0], 1) and s.y.shape == (s.pos.shape[0], 3)
        speed = float(s.fields["u"].abs().max())
        assert 0.2 < speed < 1.0                          # m/s
        assert 50 < float(s.fields["p"].abs().max()) / speed < 1000  # Pa: ~100x larger
        assert float(s.fields["sdf"].min()) == pytest.approx(0.0, abs=1e-12)
    # the same shape on about 4x the nodes
    assert fine[0].sample_id == train[0].sample_id == 2
    assert np.array_equal(fine[0].params, train[0].params)
    assert 3.3 < fine[0].pos.shape[0] / train[0].pos.shape[0] < 4.7


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="refine and ring must be positive integers"):
        ob.make_obstacle_standin(3, refine=0, cache_dir=False, progress=False)
    with pytest.raises(ValueError, match="ring=0"):
        ob.make_obstacle_standin(3, ring=0, cache_dir=False, progress=False)
    with pytest.raises(ValueError, match="band width > 0"):
        ob.mesh_channel(ob.sample_params(1)[0], ring=16, band=0.0)


def _band_triangles(params, points, triangles, band):
    """Areas of the triangles and whether each centroid lies in the band
    ``r(theta) <= rho <= r(theta) + band`` around the obstacle."""
    corners = points[triangles]
    e1, e2 = corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]
    area = 0.5 * np.abs(e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0])
    rel = corners.mean(1) - params[:2]
    rho, theta = np.hypot(rel[:, 0], rel[:, 1]), np.arctan2(rel[:, 1], rel[:, 0])
    return area, rho <= ob.obstacle_radius(theta, params) + band, rho


@pytest.mark.parametrize("ring", [16, 64])
def test_a_graded_remesh_refines_the_band_alone(ring):
    """The band's triangles obey the regional area bound (``sqrt(3)/4 (h_body^2 /
    ring)``, what triangle guarantees), and far from the obstacle the mesh is the
    training one's: the same mean triangle area to the few per cent that the grading's
    reach changes."""
    params, band = ob.sample_params(4, seed=3)[2], ob.RING_BAND
    base = ob.mesh_channel(params)
    graded = ob.mesh_channel(params, ring=ring, band=band)
    bound = math.sqrt(3) / 4 * 0.02 ** 2 / ring
    area, inside, rho = _band_triangles(params, *graded[:2], band)
    assert inside.sum() > 50
    assert area[inside].max() <= bound * (1 + 1e-9)
    base_area, base_inside, base_rho = _band_triangles(params, *base[:2], band)
    assert base_area[base_inside].mean() > 16 * area[inside].mean()
    far, base_far = rho > 0.6, base_rho > 0.6
    assert abs(area[far].mean() / base_area[base_far].mean() - 1) < 0.05
    assert len(graded[0]) > 1.5 * len(base[0])
