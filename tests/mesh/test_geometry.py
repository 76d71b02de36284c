"""Geometry features (:mod:`meshops.mesh.geometry`): the distance to the domain's boundary and
the direction to it, against the exact functions of the domain (float64), on two
refinements of one domain (discretisation consistency), in 3-D, and as inputs of a
:class:`~meshops.datasets.layout.SampleLayout` (``geo:distance``, ``geo:direction``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshops import MeshError
from meshops.datasets.layout import SampleLayout
from meshops.mesh.geometry import boundary_facets, geometry_channels
from meshops.mesh.io import mesh_from_arrays, write_mesh


def _square(n: int, jitter: float = 0.0, seed: int = 0):
    """The unit square in 2 n^2 triangles, interior nodes moved by up to ``jitter`` of a
    cell (the boundary stays straight)."""
    t = np.linspace(0.0, 1.0, n + 1)
    x, y = np.meshgrid(t, t, indexing="ij")
    pts = np.stack([x.ravel(), y.ravel()], 1)
    inner = (pts > 0).all(1) & (pts < 1).all(1)
    pts[inner] += jitter / n * np.random.default_rng(seed).uniform(-1, 1, (inner.sum(), 2))
    idx = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    a, b, c, d = idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]
    tri = np.concatenate([np.stack([a, b, c], -1).reshape(-1, 3),
                          np.stack([a, c, d], -1).reshape(-1, 3)])
    return pts, tri


def _exact_square(pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distance to the unit square's boundary and the unit vector to the nearest side."""
    gaps = np.stack([pts[:, 0], 1 - pts[:, 0], pts[:, 1], 1 - pts[:, 1]], 1)
    sides = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])
    return gaps.min(1), sides[gaps.argmin(1)]


@pytest.mark.parametrize("n", [6, 12])
def test_distance_and_direction_are_the_squares_on_any_mesh_of_it(n):
    """Straight sides: exact (1e-12) on a jittered mesh and on one twice as fine; the
    direction where the nearest side is unique (away from the diagonals)."""
    pts, tri = _square(n, jitter=0.3, seed=n)
    geo = geometry_channels(mesh_from_arrays(pts, [("triangle", tri)]))
    dist, direction = _exact_square(pts)
    assert geo["geo:distance"].dtype == torch.float64
    np.testing.assert_allclose(geo["geo:distance"].numpy(), dist, atol=1e-12)
    gaps = np.sort(np.stack([pts[:, 0], 1 - pts[:, 0], pts[:, 1], 1 - pts[:, 1]], 1), 1)
    unique = (gaps[:, 1] - gaps[:, 0] > 1e-6) & (dist > 0)
    np.testing.assert_allclose(geo["geo:direction"].numpy()[unique], direction[unique],
                               atol=1e-12)
    on_boundary = dist == 0
    assert on_boundary.sum() == 4 * n
    assert np.all(geo["geo:direction"].numpy()[on_boundary] == 0)


def test_a_hole_is_part_of_the_boundary():
    """The square with its middle cell pair removed: points of the hole's edges are at 0,
    and the boundary has the 4 n outer edges and the hole's 4."""
    n = 4
    pts, tri = _square(n)
    centre = pts[tri].mean(1)
    keep = ~((np.abs(centre - 0.5) < 0.25).all(1) & (centre[:, 0] < 0.5) & (centre[:, 1] < 0.5))
    mesh = mesh_from_arrays(pts, [("triangle", tri[keep])])
    facets = boundary_facets(pts, [("triangle", tri[keep])])
    assert len(facets) == 4 * n + 4
    d = geometry_channels(mesh)["geo:distance"].numpy()
    assert d[np.argmin(np.abs(pts - [0.5, 0.5]).sum(1))] == 0  # a corner of the hole


@pytest.mark.parametrize("shift", [0.0, 1e-9])
def test_a_seam_of_duplicated_nodes_is_inside_the_domain(shift):
    """Issue 38, item 6: two blocks meshed apart and glued (each with its own nodes
    on the seam x = 1/2, written with ``shift`` of rounding) gave distance 0 along the
    seam. The distance is the one-block mesh's, to the shift (far below the mesh size
    1/8, at which a seam would count)."""
    n = 8
    pts, tri = _square(n)
    left = pts[tri].mean(1)[:, 0] < 0.5
    blocks_pts, blocks_tri = [], []
    for k, half in enumerate((left, ~left)):
        used = np.unique(tri[half])
        index = np.full(len(pts), -1)
        index[used] = np.arange(len(used)) + sum(len(b) for b in blocks_pts)
        blocks_pts.append(pts[used] + k * shift)
        blocks_tri.append(index[tri[half]])
    glued = np.concatenate(blocks_pts)
    assert len(glued) == len(pts) + n + 1  # the seam's nodes twice
    geo = geometry_channels(mesh_from_arrays(glued, [("triangle", np.concatenate(blocks_tri))]))
    exact, _ = _exact_square(glued)
    np.testing.assert_allclose(geo["geo:distance"].numpy(), exact, rtol=0, atol=2 * shift + 1e-12)
    seam = np.abs(glued[:, 0] - 0.5) < 1e-6
    assert (geo["geo:distance"].numpy()[seam] > 0).sum() == 2 * (n - 1)


def test_three_dimensional_cube():
    """The unit cube in tetrahedra: the distance to the nearest face (1e-9)."""
    n = 3
    t = np.linspace(0, 1, n + 1)
    grid = np.stack(np.meshgrid(t, t, t, indexing="ij"), -1).reshape(-1, 3)
    idx = np.arange((n + 1) ** 3).reshape(n + 1, n + 1, n + 1)
    tets = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                v = [idx[i + a, j + b, k + c] for a in (0, 1) for b in (0, 1) for c in (0, 1)]
                # the 6 tetrahedra of a cube around its diagonal v0 - v7
                for p in ([0, 1, 3, 7], [0, 1, 5, 7], [0, 2, 3, 7], [0, 2, 6, 7],
                          [0, 4, 5, 7], [0, 4, 6, 7]):
                    tets.append([v[q] for q in p])
    pts = grid + 0.0
    geo = geometry_channels(mesh_from_arrays(pts, [("tetra", np.array(tets))]))
    exact = np.minimum(pts, 1 - pts).min(1)
    np.testing.assert_allclose(geo["geo:distance"].numpy(), exact, atol=1e-9)
    norms = np.linalg.norm(geo["geo:direction"].numpy(), axis=1)
    np.testing.assert_allclose(norms[exact > 0], 1.0, atol=1e-9)


def test_a_point_cloud_has_no_boundary():
    with pytest.warns(UserWarning, match="a point cloud without cells"):
        mesh = mesh_from_arrays(np.random.default_rng(0).random((20, 2)), [])
    with pytest.raises(MeshError, match="no 2-D cells: the boundary of a mesh is found from"):
        geometry_channels(mesh)


def test_layout_computes_geometry_inputs_from_the_mesh(tmp_path):
    pts, tri = _square(5, jitter=0.2)
    f = tmp_path / "a.vtu"
    write_mesh(f, mesh_from_arrays(pts, [("triangle", tri)],
                                   {"f": pts[:, 0], "u": pts[:, 1]}))
    from meshops.mesh.io import read_mesh

    layout = SampleLayout(["f", "geo:distance", "geo:direction"], ["u"])
    sample = layout.view(read_mesh(f), f)
    dist, _ = _exact_square(pts)
    np.testing.assert_allclose(sample.fields["geo:distance"].numpy(), dist, atol=1e-12)
    assert tuple(sample.fields["geo:direction"].shape) == (len(pts), 2)
    # a file with a field of that name: which one is meant cannot be told
    g = tmp_path / "b.vtu"
    write_mesh(g, mesh_from_arrays(pts, [("triangle", tri)],
                                   {"f": pts[:, 0], "u": pts[:, 1], "geo:distance": pts[:, 0]}))
    with pytest.raises(MeshError, match="b.vtu: the file has a field 'geo:distance', the name"):
        layout.view(read_mesh(g), g)
    with pytest.raises(MeshError, match="input 'geo:normal': the geometry features are "
                                        "geo:distance, geo:direction"):
        SampleLayout(["geo:normal"], ["u"])
    with pytest.raises(MeshError, match="target 'geo:distance': .* inputs only"):
        SampleLayout(["f"], ["geo:distance"])
