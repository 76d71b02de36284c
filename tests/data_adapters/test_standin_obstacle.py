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
    with pytest.raises(ValueError, match="refine must be a positive integer"):
        ob.make_obstacle_standin(3, refine=0, cache_dir=False, progress=False)
