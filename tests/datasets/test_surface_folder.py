"""A folder of closed surfaces in space (triangles in 3-D, the body3d family's files) is
read with true-area weights by both readers: the one ``meshops train`` uses and the
accuracy benchmark's (issue 37: surface meshes are functions with area weights)."""

from __future__ import annotations

import meshio
import numpy as np
import pytest
import torch
import trimesh

from benchmarks.accuracy.folder import read_split
from meshops.datasets.lazy import load_folder_cached
from meshops.datasets.samples import load_folder

RADII = (1.0, 0.5)


@pytest.fixture()
def spheres(tmp_path):
    """Two icospheres (radius 1 and 0.5, not the same mesh) with a normal input and a
    target: ``{file name: triangulated area}``."""
    areas = {}
    (tmp_path / "train").mkdir()
    for k, (radius, level) in enumerate(zip(RADII, (1, 2))):
        m = trimesh.creation.icosphere(level, radius=radius)
        p = np.asarray(m.vertices)
        n = p / radius
        name = f"sphere_{k}.vtu"
        meshio.write(tmp_path / "train" / name, meshio.Mesh(
            p, [("triangle", np.asarray(m.faces))],
            point_data={"nx": n[:, 0], "ny": n[:, 1], "nz": n[:, 2],
                        "cp": 1 - 2.25 * (1 - n[:, 0] ** 2)}))
        areas[name] = float(m.area)
    return tmp_path, areas


def test_meshops_train_reads_surface_weights_as_areas(spheres, tmp_path):
    root, areas = spheres
    _, samples, _, dim = load_folder(root / "train", ["nx", "ny", "nz"], ["cp"], torch.float64)
    assert dim == 3
    got = [float(s.weight.sum()) for s in samples]
    np.testing.assert_allclose(got, list(areas.values()), rtol=1e-12)
    # the sphere's triangulated area is below 4 pi r^2 and converges to it: a planar
    # projection or a volume measure would not give these numbers
    assert all(a < 4 * np.pi * r ** 2 < 1.15 * a for a, r in zip(got, RADII))
    _, cached, _, _ = load_folder_cached(root / "train", ["nx", "ny", "nz"], ["cp"],
                                         torch.float64, cache=tmp_path / "cache")
    np.testing.assert_allclose([float(s.weight.sum()) for s in cached], got, rtol=1e-12)


def test_the_benchmark_reads_surface_weights_as_areas(spheres):
    root, areas = spheres
    samples = read_split(root, "train", ["nx", "ny", "nz"], ["cp"])
    assert [s.points.shape[1] for s in samples] == [3, 3]
    assert [s.cells.shape[1] for s in samples] == [3, 3]
    np.testing.assert_allclose([s.weight.sum() for s in samples], list(areas.values()),
                               rtol=1e-12)
