"""The parametric convection-diffusion stand-in (one fixed mesh, three constant input
fields): its solutions obey the equation's scalings, and its samples are what
`meshops train` reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data_adapters.standins.convdiff import (
    INPUTS,
    make_convection_diffusion_standin,
    sample_params,
    solve_convection_diffusion,
)


def test_solution_scalings_and_wind():
    """-kappa lap u + w.grad u = f is linear in f, and without wind u ~ 1/kappa; a
    wind along +x carries the solution downwind (its centroid moves to x > 0.5)."""
    params = np.array([[0.05, 0.0, 0.0], [0.1, 0.0, 0.0], [0.05, 1.0, 0.0]])
    pts, tri, u = solve_convection_diffusion(21, params)
    _, _, u2 = solve_convection_diffusion(21, params, source=2.0)
    np.testing.assert_allclose(u2, 2 * u, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(u[0], 2 * u[1], rtol=1e-10, atol=1e-15)
    boundary = (pts.min(1) == 0) | (pts.max(1) == 1)
    assert np.abs(u[:, boundary]).max() == 0 and u[:, ~boundary].min() > 0
    # no wind: symmetric about x = 0.5; wind +x: centroid downwind
    cx = (u * pts[:, 0]).sum(1) / u.sum(1)
    assert cx[0] == pytest.approx(0.5, abs=1e-12) and cx[2] > 0.52
    assert tri.shape == (2 * 20 * 20, 3)


def test_samples_share_one_mesh_with_constant_inputs():
    samples = make_convection_diffusion_standin(4, seed=3, n=11, dtype=torch.float64)
    params = sample_params(4, seed=3)
    assert np.all((params[:, 0] >= 0.02) & (params[:, 0] <= 0.1))
    speed = np.hypot(params[:, 1], params[:, 2])
    assert np.all((speed >= 0.25) & (speed <= 1.0))
    for s, p in zip(samples, params):
        assert torch.equal(s.pos, samples[0].pos) and s.x.shape == (121, len(INPUTS))
        np.testing.assert_array_equal(s.x.numpy(), np.tile(p, (121, 1)))
        assert float(s.weight.sum()) == pytest.approx(1.0, rel=1e-12)  # the unit square
        assert s.standin is True and s.y.shape == (121, 1)
    assert not torch.equal(samples[0].y, samples[1].y)
