"""Graded re-meshes of the stand-in families (issue 36's mesh-independence suite): the
band around the body is refined by the asked area factor (triangle's regional bound),
the rest of the mesh stays as in training, and a re-meshed split holds the same shapes
as the test split it stands beside."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from data_adapters._geometry import band_around, triangulate_loops
from data_adapters.standins import elasticity, hole


def _areas(points, triangles):
    c = points[triangles]
    e1, e2 = c[:, 1] - c[:, 0], c[:, 2] - c[:, 0]
    return 0.5 * np.abs(e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]), c.mean(1)


def test_a_band_region_gets_its_own_bound_and_the_rest_the_global_one():
    """A disc of radius 0.2 in the unit square: triangles whose centroid lies in the
    band 0.2 < rho < 0.25 obey the band's bound, those far from it the global one."""
    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], float)
    th = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    disc = 0.5 + 0.2 * np.stack([np.cos(th), np.sin(th)], 1)
    edge, seed = band_around(lambda t: np.full(np.shape(t), 0.2), (0.5, 0.5), 0.05, 0.02)
    assert 0.2 < np.hypot(*(seed - 0.5)) < 0.25
    np.testing.assert_allclose(np.hypot(*(edge - 0.5).T), 0.25, rtol=1e-12)
    pts, tri = triangulate_loops([square, disc, edge], [(0.5, 0.5)], 0.01, 30,
                                 [(seed, 1e-4)])
    area, cen = _areas(pts, tri)
    rho = np.hypot(*(cen - 0.5).T)
    assert rho.min() > 0.2 - 1e-3  # the disc is a hole
    assert area[rho < 0.25].max() <= 1e-4 * (1 + 1e-9) < area[rho > 0.3].max() <= 0.01


@pytest.mark.parametrize("ring", [16, 64])
def test_the_elasticity_and_hole_bands_are_refined_by_the_ring(ring):
    prm = elasticity.sample_void_params(np.random.default_rng(2))
    base = elasticity.mesh_unit_cell(prm)
    graded = elasticity.mesh_unit_cell(prm, ring=ring, band=0.006)
    area, cen = _areas(*graded)
    rel = cen - elasticity.CENTER
    rho, theta = np.hypot(*rel.T), np.arctan2(rel[:, 1], rel[:, 0])
    in_band = rho <= elasticity.void_radius(theta, prm) + 0.006
    assert area[in_band].max() <= math.sqrt(3) / 4 * 0.012 ** 2 / ring * (1 + 1e-9)
    assert len(graded[0]) > 3 * len(base[0])
    cx, cy, r, _ = hole.sample_params(3, seed=1)[2]
    pts, tri = hole.mesh_with_hole(hole.SQUARE, (cx, cy), r, ring=ring, band=0.0075)
    area, cen = _areas(pts, tri)
    in_band = np.hypot(cen[:, 0] - cx, cen[:, 1] - cy) <= r + 0.0075
    assert area[in_band].max() <= math.sqrt(3) / 4 * 0.015 ** 2 / ring * (1 + 1e-9)
    with pytest.raises(ValueError, match="band width > 0"):
        hole.mesh_with_hole(hole.SQUARE, (cx, cy), r, ring=ring, band=0.0)


def test_a_remeshed_split_holds_the_test_shapes():
    """``first`` keeps the draw: the re-meshed samples have the test samples' parameters
    and ids, on other meshes; their truths agree where the physics does (the heat
    problem's solution, P1 on both meshes, at the nodes the meshes share: the square's
    corners)."""
    plain = hole.make_hole_standin(5, cache_dir=False, progress=False, dtype=torch.float64)
    again = hole.make_hole_standin(5, cache_dir=False, progress=False, dtype=torch.float64,
                                   first=3, ring=16)
    assert [s.sample_id for s in again] == [3, 4]
    for a, b in zip(plain[3:], again):
        torch.testing.assert_close(a.x[0], b.x[0])
        assert len(b.pos) > 1.3 * len(a.pos)
        corner_a = torch.cdist(a.pos, torch.zeros(1, 2, dtype=a.pos.dtype)).argmin()
        corner_b = torch.cdist(b.pos, torch.zeros(1, 2, dtype=b.pos.dtype)).argmin()
        assert abs(a.y[corner_a] - b.y[corner_b]) < 0.02 * a.y.abs().max()
    el = elasticity.make_elasticity_standin(4, cache_dir=False, progress=False, first=2,
                                            ring=16)
    full = elasticity.make_elasticity_standin(4, cache_dir=False, progress=False)
    assert [s.sample_id for s in el] == [2, 3]
    torch.testing.assert_close(el[1].params, full[3].params)
    with pytest.raises(ValueError, match="ring=0"):
        hole.make_hole_standin(3, cache_dir=False, progress=False, ring=0)
