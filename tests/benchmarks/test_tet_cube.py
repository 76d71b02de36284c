"""The tetrahedral box of the end-to-end memory runs (benchmarks.tet_cube): a
conforming mesh of positive tetrahedra whose measure is the box's."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.tet_cube import box
from meshops.mesh.quadrature import quadrature_weights


def test_the_box_is_a_conforming_mesh_of_positive_tetrahedra():
    pts, tets, fields = box(5, height=1.3, phase=0.2)
    assert pts.shape == (125, 3) and tets.shape == (6 * 64, 4)
    d = pts[tets[:, 1:]] - pts[tets[:, :1]]
    vol = np.linalg.det(d) / 6
    assert np.all(vol > 0) and vol.sum() == pytest.approx(1.3)
    # the mesh checks (no overlapping or duplicated cells) pass, and the nodal
    # weights integrate the box
    assert quadrature_weights(pts, [("tetra", tets)]).sum().item() == pytest.approx(1.3)
    assert set(fields) == {"a", "u", "p"} and all(len(v) == 125 for v in fields.values())
