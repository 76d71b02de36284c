"""Quadrature weights: measure, exactness for linear fields, convergence, errors."""

import math

import numpy as np
import pytest
import torch
from _meshes import annulus_quads, cube_mesh, cube_sphere, square_mesh, tetra_cube

from meshops import MeshError
from meshops.mesh.pointcloud import point_cloud_weights
from meshops.mesh.quadrature import grid_weights, quadrature_weights, structured_grid_cells

RTOL = 1e-12
A2, A3 = np.array([0.7, -1.3]), np.array([0.7, -1.3, 2.1])
B = 0.4


def integral_of_linear(w, pts, a):
    return float((w.numpy() * (pts @ a + B)).sum())


@pytest.mark.parametrize("kind", ["quad", "triangle", "mixed"])
@pytest.mark.parametrize("amount", [0.0, 0.3])
def test_unit_square_measure_and_linear_exactness(kind, amount):
    pts, cells = square_mesh(6, kind, amount=amount, seed=3)
    w = quadrature_weights(pts, cells)
    assert w.dtype == torch.float64 and w.shape == (len(pts),)
    assert abs(w.sum().item() - 1.0) < RTOL
    # Exact: integral of a.x + b over the unit square is a.(1/2, 1/2) + b.
    assert abs(integral_of_linear(w, pts, A2) - (A2.sum() / 2 + B)) < RTOL


def test_distorted_quads_are_not_an_even_split():
    """On a distorted quad the even split (area/4 per vertex) loses linear exactness;
    the basis-function weights keep it."""
    pts, cells = square_mesh(5, "quad", amount=0.35, seed=1)
    w = quadrature_weights(pts, cells)
    exact = A2.sum() / 2 + B
    even = np.zeros(len(pts))
    for c in cells[0][1]:
        x = pts[c]
        d1, d2 = x[2] - x[0], x[3] - x[1]
        area = 0.5 * abs(d1[0] * d2[1] - d1[1] * d2[0])
        np.add.at(even, c, area / 4)
    assert abs(integral_of_linear(w, pts, A2) - exact) < RTOL
    assert abs(float((even * (pts @ A2 + B)).sum()) - exact) > 1e-5


@pytest.mark.parametrize("amount", [0.0, 0.2])
def test_unit_cube_hex_pyramid_wedge_mixed(amount):
    pts, cells = cube_mesh(3, amount=amount, seed=5)
    assert {t for t, _ in cells} == {"hexahedron", "pyramid", "wedge"}
    w = quadrature_weights(pts, cells)
    assert abs(w.sum().item() - 1.0) < RTOL
    assert abs(integral_of_linear(w, pts, A3) - (A3.sum() / 2 + B)) < RTOL


@pytest.mark.parametrize("ctype", ["hexahedron", "pyramid", "wedge"])
def test_each_3d_type_alone_on_distorted_mesh(ctype):
    pts, cells = cube_mesh(3, amount=0.2, seed=7)
    conn = dict(cells)[ctype]
    w = quadrature_weights(pts, [(ctype, conn)])
    # Reference: the same cells integrated by a plain high-order rule written here,
    # with the Jacobian from finite differences of the isoparametric map.
    ref_measure, ref_int = _reference_integrals(ctype, pts, conn)
    assert abs(w.sum().item() - ref_measure) < 1e-9
    assert abs(integral_of_linear(w, pts, A3) - ref_int) < 1e-9


def _reference_integrals(ctype, pts, conn, n=8):
    """Plain Gauss rule in the standard reference coordinates, FD Jacobian."""
    g, gw = np.polynomial.legendre.leggauss(n)
    g, gw = (g + 1) / 2, gw / 2

    def shape(u, v, t):
        if ctype == "hexahedron":
            q = [(1 - u) * (1 - v), u * (1 - v), u * v, (1 - u) * v]
            return np.array([a * (1 - t) for a in q] + [a * t for a in q])
        if ctype == "wedge":  # reference triangle (u, v) with u + v <= 1, mapped below
            lam = [1 - u - v, u, v]
            return np.array([a * (1 - t) for a in lam] + [a * t for a in lam])
        # pyramid: rational basis on base [0,1]^2 at height t
        s = 1 - t
        if s < 1e-14:
            return np.array([0, 0, 0, 0, 1.0])
        x, y = u / s, v / s
        q = [(1 - x) * (1 - y), x * (1 - y), x * y, (1 - x) * y]
        return np.array([a * s for a in q] + [t])

    measure = integral = 0.0
    h = 1e-6
    for c in conn:
        X = pts[c]
        for a, wa in zip(g, gw):
            for b, wb in zip(g, gw):
                for t, wt in zip(g, gw):
                    if ctype == "hexahedron":
                        u, v, jac0 = a, b, 1.0
                    elif ctype == "wedge":
                        u, v, jac0 = a, b * (1 - a), 1 - a
                    else:
                        u, v, jac0 = a * (1 - t), b * (1 - t), (1 - t) ** 2
                    def xmap(p):
                        return shape(*p) @ X
                    p0 = np.array([u, v, t])
                    J = np.stack([(xmap(p0 + h * e) - xmap(p0 - h * e)) / (2 * h)
                                  for e in np.eye(3)], axis=1)
                    dv = abs(np.linalg.det(J)) * jac0 * wa * wb * wt
                    measure += dv
                    integral += dv * (xmap(p0) @ A3 + B)
    return measure, integral


@pytest.mark.parametrize("amount", [0.0, 0.25])
def test_tetra_cube(amount):
    pts, cells = tetra_cube(3, amount=amount, seed=2)
    w = quadrature_weights(pts, cells)
    assert abs(w.sum().item() - 1.0) < RTOL
    assert abs(integral_of_linear(w, pts, A3) - (A3.sum() / 2 + B)) < RTOL


def test_l_shape():
    pts, cells = square_mesh(4, "mixed")
    quads, tris = cells[0][1], cells[1][1]
    # Keep cells whose centroid is outside the upper-right quarter: an L of area 3/4.
    keep = lambda c: ~((pts[c].mean(1) > 0.5).all(axis=1))
    pts2 = pts * 2  # L-shape [0,2]^2 minus [1,2]^2, area 3
    w = quadrature_weights(pts2, [("quad", quads[keep(quads)]), ("triangle", tris[keep(tris)])])
    assert abs(w.sum().item() - 3.0) < RTOL


def test_reversed_orientation_is_accepted_and_equal():
    pts, cells = cube_mesh(2, amount=0.2, seed=1)
    flip = {"hexahedron": [4, 5, 6, 7, 0, 1, 2, 3], "wedge": [3, 4, 5, 0, 1, 2],
            "pyramid": [0, 3, 2, 1, 4]}
    w = quadrature_weights(pts, cells)
    w_flipped = quadrature_weights(pts, [(t, c[:, flip[t]]) for t, c in cells])
    torch.testing.assert_close(w, w_flipped, rtol=1e-13, atol=0)


def _convergence_ratio(errors):
    return [errors[i] / errors[i + 1] for i in range(len(errors) - 1)]


def test_annulus_converges_second_order():
    exact = math.pi * (1.0 - 0.25)
    errs = [abs(quadrature_weights(*annulus_quads(4, nt)).sum().item() - exact)
            for nt in (16, 32, 64, 128)]
    ratios = _convergence_ratio(errs)
    # Polygonal boundary: area error ~ C / nt^2, so halving h divides it by 4.
    assert all(3.8 < r < 4.2 for r in ratios), ratios


def test_sphere_surface_quads_converge_to_4pi():
    errs = [abs(quadrature_weights(*cube_sphere(n)).sum().item() - 4 * math.pi)
            for n in (4, 8, 16, 32)]
    ratios = _convergence_ratio(errs)
    assert all(3.5 < r < 4.5 for r in ratios), ratios


def test_surface_in_3d_uses_true_area_not_projection():
    # A tilted unit square: z = x, true area sqrt(2).
    pts, cells = square_mesh(3, "mixed")
    pts3 = np.column_stack([pts, pts[:, 0]])
    assert abs(quadrature_weights(pts3, cells).sum().item() - math.sqrt(2)) < RTOL


def test_curve_length():
    t = np.linspace(0, 2 * np.pi, 257)[:-1]
    pts = np.column_stack([np.cos(t), np.sin(t), 0.1 * np.ones_like(t)])
    lines = np.column_stack([np.arange(256), (np.arange(256) + 1) % 256])
    length = quadrature_weights(pts, [("line", lines)]).sum().item()
    assert abs(length - 2 * 256 * math.sin(math.pi / 256)) < 1e-12


def test_lower_dimensional_cells_are_ignored():
    pts, cells = square_mesh(3, "triangle")
    boundary = np.array([[0, 1], [1, 2]])
    w0 = quadrature_weights(pts, cells)
    w1 = quadrature_weights(pts, cells + [("line", boundary), ("vertex", np.array([[0]]))])
    torch.testing.assert_close(w0, w1, rtol=0, atol=0)


def test_structured_grid_weights_curvilinear():
    # A polar grid as a structured (n0, n1) array pair: quads from the grid.
    r = np.linspace(0.5, 1.0, 9)
    t = np.linspace(0, np.pi / 2, 33)
    R, T = np.meshgrid(r, t, indexing="ij")
    w = grid_weights(R * np.cos(T), R * np.sin(T))
    # Exact area of the polygonal quarter annulus: each cell a planar quad sector.
    chord = 0.5 * np.sin(np.pi / 2 / 32) * 32
    assert abs(w.sum().item() - chord * (1.0 - 0.25)) < 1e-12
    assert structured_grid_cells((3, 4)).shape == (6, 4)


def test_point_cloud_uniform_and_knn():
    rng = np.random.default_rng(0)
    pts = rng.random((4000, 2))
    w_u = point_cloud_weights(pts, "uniform", measure=1.0)
    assert torch.allclose(w_u, torch.full((4000,), 1 / 4000, dtype=torch.float64))
    # Clustered sampling (density ~ 2x on x < 1/2 ... via rejection): the knn estimate
    # must down-weight the dense half, so the integral of 1_{x<1/2} stays ~ 1/2.
    dense = np.concatenate([pts, rng.random((4000, 2)) * [0.5, 1.0]])
    w_k = point_cloud_weights(dense, "knn", measure=1.0)
    left = float(w_k[dense[:, 0] < 0.5].sum())
    w_uniform_left = (dense[:, 0] < 0.5).mean()
    assert abs(w_k.sum().item() - 1.0) < RTOL
    assert abs(left - 0.5) < 0.03 and abs(w_uniform_left - 0.5) > 0.2
    # Batched: each sample normalised to its own (hull) measure.
    batch = torch.cat([torch.zeros(4000, dtype=torch.long), torch.ones(4000, dtype=torch.long)])
    w_b = point_cloud_weights(np.concatenate([pts, pts * 2]), "uniform", batch=batch)
    assert w_b[batch == 1].sum() / w_b[batch == 0].sum() == pytest.approx(4.0, rel=1e-12)


# ---------------------------------------------------------------- errors


def test_nan_coordinates():
    pts, cells = square_mesh(2)
    pts[4, 1] = np.nan
    with pytest.raises(MeshError, match=r"plate\.vtu: point 4 has a non-finite coordinate"):
        quadrature_weights(pts, cells, source="plate.vtu")


def test_degenerate_triangle_named():
    pts = np.array([[0, 0], [1, 0], [0, 1], [2, 0.0]])
    cells = [("triangle", np.array([[0, 1, 2], [0, 1, 3]]))]
    with pytest.raises(MeshError, match=r"triangle cell 1 \(block 0\) with vertices \[0, 1, 3\] "
                                        r"has zero measure"):
        quadrature_weights(pts, cells)


def test_degenerate_tetra():
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0.0]])
    with pytest.raises(MeshError, match="tetra cell 0 .* zero measure"):
        quadrature_weights(pts, [("tetra", np.array([[0, 1, 2, 3]]))])


def test_tangled_quad_named():
    pts, cells = square_mesh(2)
    q = cells[0][1].copy()
    q[2] = q[2][[0, 2, 1, 3]]  # bow-tie
    with pytest.raises(MeshError, match=r"quad cell 2 \(block 0\) .* is tangled"):
        quadrature_weights(pts, [("quad", q)])


def test_non_convex_quad_is_tangled():
    pts = np.array([[0, 0], [1, 0], [0.2, 0.2], [0, 1.0]])
    with pytest.raises(MeshError, match="tangled"):
        quadrature_weights(pts, [("quad", np.array([[0, 1, 2, 3]]))])


def test_tangled_hex():
    pts, cells = cube_mesh(1)
    hexes = cells[0][1].copy()
    hexes[0] = hexes[0][[0, 1, 2, 3, 5, 4, 6, 7]]
    with pytest.raises(MeshError, match="hexahedron cell 0 .* tangled"):
        quadrature_weights(pts, [("hexahedron", hexes)])


def test_index_out_of_range_named():
    pts, cells = square_mesh(2, "triangle")
    tri = cells[0][1].copy()
    tri[5, 2] = 99
    with pytest.raises(MeshError, match=r"triangle cell 5 \(block 0\) has vertex index out of "
                                        r"range .*99.*9 points"):
        quadrature_weights(pts, [("triangle", tri)])
    tri[5, 2] = -1
    with pytest.raises(MeshError, match="out of range"):
        quadrature_weights(pts, [("triangle", tri)])


def test_unsupported_cell_type():
    pts, _ = square_mesh(1)
    with pytest.raises(MeshError, match=r"unsupported cell type 'triangle6'"):
        quadrature_weights(pts, [("triangle6", np.zeros((1, 6), int))])


def test_wrong_connectivity_width():
    pts, _ = square_mesh(1)
    with pytest.raises(MeshError, match=r"quad\) has connectivity of shape \(1, 3\)"):
        quadrature_weights(pts, [("quad", np.array([[0, 1, 2]]))])


def test_no_cells():
    with pytest.raises(MeshError, match="no line, surface or volume cells"):
        quadrature_weights(np.zeros((3, 2)), [("vertex", np.array([[0], [1]]))])


# ------------------------------------------------------ duplicated and overlapping cells
def _push(pts, i, to):
    out = pts.copy()
    out[i] = to
    return out


def test_node_pushed_across_neighbours_is_refused():
    # Node 6 (0.25, 0.25) of the 4x4 triangle grid moved past the edge [5, 11]: the
    # cell [5, 11, 6] turns over onto its neighbour, the total area grows by twice
    # its area (1/32 + 1/32 = 1.0625 - 1), but no cell is degenerate or tangled.
    pts, cells = square_mesh(4, "triangle")
    bad = _push(pts, 6, [0.6, 0.2])
    assert quadrature_weights(bad, cells, check=False).sum().item() == pytest.approx(1.0625)
    with pytest.raises(MeshError, match=r"triangle cell 20 \(block 0\) with vertices "
                                        r"\[5, 11, 6\] overlaps triangle cell 0 .* same side "
                                        r"of their shared edge \[5, 6\]"):
        quadrature_weights(bad, cells, source="pushed.vtu")


def test_tet_node_pushed_across_neighbours_is_refused():
    pts, cells = tetra_cube(3)
    bad = _push(pts, 21, [0.7, 0.34, 0.34])  # the interior node (1/3, 1/3, 1/3)
    assert quadrature_weights(bad, cells, check=False).sum().item() > 1 + 1e-3
    with pytest.raises(MeshError, match=r"tetra cell .* overlaps tetra cell .* same side of "
                                        r"their shared face \[\d+, \d+, \d+\]"):
        quadrature_weights(bad, cells)


def test_facets_are_checked_in_passes_by_their_smallest_vertex(monkeypatch):
    # A large mesh is checked a range of smallest vertex ids at a time (equal facets
    # share theirs): with passes of 10 facets, the same overlaps are found in a later
    # pass (at least 1 such face counted there), a valid mesh passes, and the passes
    # cover every vertex once.
    from meshops.mesh import _overlap

    pts, cells = tetra_cube(3)
    monkeypatch.setattr(_overlap, "FACETS_PER_PASS", 10)
    ranges = _overlap._vertex_ranges([(0, "tetra", cells[0][1])], len(pts))
    assert len(ranges) > 5 and ranges[0][0] == 0 and ranges[-1][1] == len(pts)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert quadrature_weights(pts, cells).sum().item() == pytest.approx(1.0)
    bad = _push(pts, 21, [0.7, 0.34, 0.34])
    with pytest.raises(MeshError, match=r"tetra cell .* overlaps tetra cell .* same side of "
                                        r"their shared face \[\d+, \d+, \d+\] .*; at "
                                        r"least \d+ such faces"):
        quadrature_weights(bad, cells)
    tri = np.array([[0, 0], [1, 0], [0.5, 1], [0.5, -1], [0.3, 0.5]])
    with pytest.raises(MeshError, match=r"edge \[0, 1\] is shared by more than 2 cells"):
        quadrature_weights(tri, [("triangle", np.array([[0, 1, 2], [1, 0, 3], [0, 1, 4]]))])


def test_hex_folded_onto_its_neighbour_is_refused():
    # Hex 1 shares the top face of the unit cube (hex 0) but its far face is at
    # z = 0.5, inside hex 0: a consistently (negatively) oriented, untangled cell
    # that overlaps hex 0. Quad faces are matched by their vertex sets.
    pts, cells = cube_mesh(1)
    top = pts[cells[0][1][0, 4:]]
    pts = np.concatenate([pts, top - [0, 0, 0.5]])
    hexes = np.array([cells[0][1][0], list(cells[0][1][0, 4:]) + [8, 9, 10, 11]])
    with pytest.raises(MeshError, match=r"hexahedron cell 1 .* overlaps hexahedron cell 0 "
                                        r".* shared face"):
        quadrature_weights(pts, [("hexahedron", hexes)])
    # The same hex on the other side of the face is fine.
    hexes[1, 4:] = [8, 9, 10, 11]
    pts[8:] = top + [0, 0, 0.5]
    assert quadrature_weights(pts, [("hexahedron", hexes)]).sum().item() == pytest.approx(1.5)


def test_inverted_segment_in_1d():
    pts = np.array([0.0, 0.25, 0.6, 0.5, 1.0])[:, None]  # node 3 pushed behind node 2
    lines = np.array([[0, 1], [1, 2], [2, 3], [3, 4]])
    with pytest.raises(MeshError, match=r"line cell 2 .* overlaps line cell 1 .* shared "
                                        r"point \[2\]"):
        quadrature_weights(pts, [("line", lines)])


def test_edge_shared_by_three_triangles_is_refused():
    pts = np.array([[0, 0], [1, 0], [0.5, 1], [0.5, -1], [0.3, 0.5]])
    tri = np.array([[0, 1, 2], [1, 0, 3], [0, 1, 4]])
    with pytest.raises(MeshError, match=r"edge \[0, 1\] is shared by more than 2 cells "
                                        r"\(triangle cell 0 .*triangle cell 1 .*triangle "
                                        r"cell 2 .*\): the cells overlap"):
        quadrature_weights(pts, [("triangle", tri)])


def test_duplicated_cells_are_refused():
    pts, cells = square_mesh(4, "triangle")
    tri = cells[0][1]
    # Three cells listed twice (in another vertex order): area 1 + 3/32.
    three = np.concatenate([tri, tri[[3, 7, 9]][:, ::-1]])
    assert quadrature_weights(pts, [("triangle", three)], check=False).sum().item() == \
        pytest.approx(1 + 3 / 32)
    with pytest.raises(MeshError, match=r"dup.vtu: triangle cell 32 \(block 0\) with vertices "
                                        r"\[9, 8, 3\] duplicates triangle cell 3 \(block 0\) "
                                        r".*3 duplicated cells"):
        quadrature_weights(pts, [("triangle", three)], source="dup.vtu")
    # Two copies of the whole mesh, in two blocks.
    with pytest.raises(MeshError, match=r"triangle cell 0 \(block 1\) .* duplicates triangle "
                                        r"cell 0 \(block 0\)"):
        quadrature_weights(pts, [("triangle", tri), ("triangle", tri)])


def test_duplicated_cells_on_embedded_surfaces_and_curves():
    pts, cells = cube_sphere(3)
    quads = cells[0][1]
    with pytest.raises(MeshError, match="quad cell .* duplicates quad cell 5"):
        quadrature_weights(pts, [("quad", np.concatenate([quads, quads[5:6, ::-1]]))])
    t = np.linspace(0, 1, 5)
    curve = np.stack([t, t ** 2], axis=1)
    lines = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [3, 2]])
    with pytest.raises(MeshError, match=r"line cell 4 .* duplicates line cell 2"):
        quadrature_weights(np.hstack([curve, t[:, None]]), [("line", lines)])


@pytest.mark.parametrize("mesh", ["triangle", "tetra"])
def test_reversed_cells_that_do_not_overlap_are_accepted(mesh):
    # Orientation is not what is checked: a mesh listed all clockwise, or with
    # some cells in reversed order, is fine as long as no cells overlap.
    pts, cells = square_mesh(4, "triangle", amount=0.3) if mesh == "triangle" \
        else tetra_cube(2, amount=0.3)
    conn = cells[0][1]
    some = conn.copy()
    some[::3] = some[::3, ::-1]
    for c in (conn[:, ::-1], some):
        assert quadrature_weights(pts, [(cells[0][0], c)]).sum().item() == pytest.approx(1.0)


def test_quads_collapsed_at_a_pole_are_accepted():
    # A polar quad mesh of the unit disc whose inner quads collapse one side onto
    # the centre (node 0 repeated): the collapsed "edge" [0, 0] is in 12 cells but
    # has no sides, so it is no overlap. Area: the inscribed 12-gon's, 3.
    nt, nr = 12, 3
    r, t = np.linspace(0, 1, nr + 1)[1:], np.linspace(0, 2 * np.pi, nt, endpoint=False)
    pts = np.vstack([[0, 0], np.stack([np.outer(r, np.cos(t)).ravel(),
                                       np.outer(r, np.sin(t)).ravel()], 1)])
    idx = 1 + np.arange(nr * nt).reshape(nr, nt)
    quads = [[0, idx[0, j], idx[0, (j + 1) % nt], 0] for j in range(nt)]
    quads += [[idx[i, j], idx[i + 1, j], idx[i + 1, (j + 1) % nt], idx[i, (j + 1) % nt]]
              for i in range(nr - 1) for j in range(nt)]
    w = quadrature_weights(pts, [("quad", np.array(quads))])
    assert w.sum().item() == pytest.approx(0.5 * nt * math.sin(2 * math.pi / nt), rel=1e-12)
