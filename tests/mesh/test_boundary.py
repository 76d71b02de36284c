"""Boundary tags (issue 21.3): tagged facets from Gmsh physical groups and VTK integer
cell arrays, the boundary quadrature against closed-form integrals (perimeters,
areas, linear fields, the divergence theorem), outward normals, the input channels,
refusals, and ``meshops train --tags`` / ``meshops evaluate --integral`` end to end."""

import json
from pathlib import Path

import meshio
import numpy as np
import pytest
import torch
from _meshes import annulus_quads, cube_mesh, square_mesh, tetra_cube
from _tiny_run import one_line_error

from meshops import cli
from meshops.datasets.layout import SampleLayout
from meshops.errors import MeshError
from meshops.mesh.boundary import NORMAL_FIELD, boundary, tag_channels
from meshops.mesh.cells import cell_points
from meshops.mesh.io import mesh_from_arrays, read_mesh

NAMES = {"left": 1, "right": 2, "bottom": 3, "top": 4, "inner": 5}


def _square_edges(n: int) -> dict:
    """Boundary edges of the n x n grid of square_mesh, by side."""
    idx = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)   # idx[i, j]: x_i, y_j
    edge = lambda a: np.stack([a[:-1], a[1:]], 1)          # noqa: E731
    return {"left": edge(idx[0]), "right": edge(idx[-1]), "bottom": edge(idx[:, 0]),
            "top": edge(idx[:, -1])}


def gmsh_square(n: int = 4, kind: str = "mixed", amount: float = 0.25, seed: int = 0,
                fields=None, extra_lines=None):
    """A unit square as Gmsh writes it: the 2-D cells, the boundary lines tagged by side
    (gmsh:physical) and the physical names in field_data; also the whole boundary as
    VTK-style tags (``side`` = 1..4 in a cell array ``CellEntityIds``)."""
    pts, cells = square_mesh(n, kind, amount=amount, seed=seed)
    edges = _square_edges(n)
    lines = np.concatenate([edges[s] for s in ("left", "right", "bottom", "top")])
    tags = np.concatenate([np.full(len(edges[s]), NAMES[s]) for s in ("left", "right", "bottom",
                                                                      "top")])
    if extra_lines is not None:
        lines = np.concatenate([lines, extra_lines])
        tags = np.concatenate([tags, np.full(len(extra_lines), NAMES["inner"])])
    blocks = cells + [("line", lines)]
    phys = [np.zeros(len(c), int) for _, c in cells] + [tags]
    cell_data = {"gmsh:physical": phys, "CellEntityIds": [t + 10 for t in phys]}
    field_data = {k: np.array([v, 1]) for k, v in NAMES.items()}
    field_data["domain"] = np.array([0, 2])
    return mesh_from_arrays(pts, blocks, fields, cell_data, field_data=field_data)


# ------------------------------------------------------ closed-form integrals
def test_perimeter_and_side_lengths_are_exact():
    mesh = gmsh_square()
    for side in ("left", "right", "bottom", "top"):
        b = boundary(mesh, side)
        assert abs(b.measure.sum() - 1.0) < 1e-14
        assert abs(float(b.node_weights(len(mesh.pos)).sum()) - 1.0) < 1e-14
    total = sum(float(boundary(mesh, f"CellEntityIds={v}").node_weights(len(mesh.pos)).sum())
                for v in (11, 12, 13, 14))
    assert abs(total - 4.0) < 1e-14


@pytest.mark.parametrize("kind", ["quad", "triangle", "mixed"])
def test_linear_fields_integrate_exactly_over_tagged_edges(kind):
    mesh = gmsh_square(5, kind, amount=0.3, seed=2)
    x, y = mesh.pos[:, 0], mesh.pos[:, 1]
    f = 1 + 2 * x + 3 * y
    assert abs(float(boundary(mesh, "left").integrate(f)) - 2.5) < 1e-13   # int (1 + 3y) dy
    assert abs(float(boundary(mesh, "top").integrate(f)) - 5.0) < 1e-13    # int (4 + 2x) dx
    # a vector field: each component
    got = boundary(mesh, "bottom").integrate(torch.stack([f, x * 0 + 2], 1))
    assert torch.allclose(got, torch.tensor([2.0, 2.0], dtype=torch.float64), atol=1e-13)


def test_divergence_theorem_on_the_square():
    # int x n ds = (|Omega|, 0) and int (x, y) . n ds = 2 |Omega| over the closed boundary
    mesh = gmsh_square(4, "mixed", amount=0.3, seed=1)
    x = mesh.pos[:, 0]
    force = sum(boundary(mesh, s).integrate(x, mode="normal") for s in
                ("left", "right", "bottom", "top"))
    flux = sum(float(boundary(mesh, s).integrate(mesh.pos, mode="flux")) for s in
               ("left", "right", "bottom", "top"))
    assert torch.allclose(force, torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-14)
    assert abs(flux - 2.0) < 1e-14


def test_cell_values_on_the_boundary_take_their_cell():
    mesh = gmsh_square(4, "mixed")
    cp = cell_points(mesh)
    b = boundary(mesh, "right")
    c = torch.from_numpy(cp.centroid[:, 1])
    # each facet gets the value of the cell it bounds: that cell's centroid touches it
    assert torch.allclose(torch.from_numpy(cp.centroid[b.owner, 0]),
                          torch.ones(len(b.owner), dtype=torch.float64), atol=0.5 / 4)
    assert abs(float(b.integrate(torch.full_like(c, 3.0), at="cells")) - 3.0) < 1e-14


def _ring_edges(nr, nt):
    idx = np.arange((nr + 1) * nt).reshape(nr + 1, nt)
    ring = lambda r: np.stack([idx[r], np.roll(idx[r], -1)], 1)  # noqa: E731
    return ring(0), ring(-1)


def test_perimeter_of_a_curved_boundary_converges_at_second_order():
    # the annulus 0.5 < r < 1: inner + outer polygon perimeters -> 3 pi at O(h^2)
    ns, errs = [16, 32, 64], []
    for nt in ns:
        pts, cells = annulus_quads(4, nt)
        inner, outer = _ring_edges(4, nt)
        lines = np.concatenate([inner, outer])
        mesh = mesh_from_arrays(pts, cells + [("line", lines)], cell_data={
            "tag": [np.zeros(len(cells[0][1]), int), np.ones(len(lines), int)]})
        b = boundary(mesh, "tag=1")
        errs.append(abs(b.measure.sum() - 3 * np.pi))
        # outward: away from the annulus, so inward at the inner circle
        r = np.linalg.norm(pts[lines[:, 0]] + pts[lines[:, 1]], axis=1) / 2
        radial = (pts[lines[:, 0]] + pts[lines[:, 1]]) / 2 / r[:, None]
        dots = np.einsum("fd,fd->f", b.normal, radial)
        assert (dots[:nt] < -0.99).all() and (dots[nt:] > 0.99).all()
    order = -np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert 1.9 < order < 2.1, errs


def _boundary_faces(cells):
    """Faces bounding exactly one cell (a plain reference: a dict over every face)."""
    faces = {"tetra": [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)],
             "hexahedron": [(0, 3, 2, 1), (4, 5, 6, 7), (0, 1, 5, 4), (1, 2, 6, 5),
                            (2, 3, 7, 6), (3, 0, 4, 7)],
             "wedge": [(0, 1, 2), (3, 4, 5), (0, 1, 4, 3), (1, 2, 5, 4), (2, 0, 3, 5)],
             "pyramid": [(0, 1, 2, 3), (0, 1, 4), (1, 2, 4), (2, 3, 4), (3, 0, 4)]}
    seen = {}
    for ctype, conn in cells:
        for row in conn:
            for f in faces[ctype]:
                key = tuple(sorted(row[list(f)]))
                seen.setdefault(key, []).append(tuple(row[list(f)]))
    return [v[0] for v in seen.values() if len(v) == 1]


@pytest.mark.parametrize("gen", [cube_mesh, tetra_cube])
def test_faces_of_a_volume_mesh(gen):
    pts, cells = gen(3, amount=0.2, seed=4)
    faces = _boundary_faces(cells)
    on = lambda f, axis, v: all(abs(pts[i, axis] - v) < 1e-12 for i in f)  # noqa: E731
    side = [1 + next((2 * a + int(v) for a in range(3) for v in (0, 1) if on(f, a, v)), -1)
            for f in faces]
    tris = [f for f in faces if len(f) == 3]
    quads = [f for f in faces if len(f) == 4]
    tag = lambda group: np.array([side[faces.index(f)] for f in group], int)  # noqa: E731
    blocks = cells + [("triangle", np.array(tris).reshape(-1, 3)),
                      ("quad", np.array(quads).reshape(-1, 4))]
    data = [np.zeros(len(c), int) for _, c in cells] + [tag(tris), tag(quads)]
    blocks, data = zip(*[(b, d) for b, d in zip(blocks, data) if len(b[1])])
    mesh = mesh_from_arrays(pts, list(blocks), cell_data={"side": list(data)})
    x = mesh.pos
    f = 1 + x[:, 0] + 2 * x[:, 1]
    total_force = torch.zeros(3, dtype=torch.float64)
    flux = 0.0
    for s in range(1, 7):
        b = boundary(mesh, f"side={s}")
        axis, val = (s - 1) // 2, (s - 1) % 2
        assert abs(b.measure.sum() - 1.0) < 1e-13           # each face of the unit cube
        want = np.zeros(3)
        want[axis] = 1.0 if val else -1.0
        assert np.allclose(b.normal, want, atol=1e-12)      # outward
        total_force += b.integrate(x[:, 0], mode="normal")
        flux += float(b.integrate(x, mode="flux"))
        if s == 5:   # z = 0: int (1 + x + 2y) dx dy
            assert abs(float(b.integrate(f)) - 2.5) < 1e-13
    assert torch.allclose(total_force, torch.tensor([1.0, 0, 0], dtype=torch.float64), atol=1e-13)
    assert abs(flux - 3.0) < 1e-13


def test_normals_do_not_depend_on_node_order():
    pts, cells = square_mesh(4, "quad")
    flipped = [("quad", np.concatenate([cells[0][1][:8], cells[0][1][8:, ::-1]]))]
    edges = _square_edges(4)["left"][:, ::-1]    # listed downwards
    for cc in (cells, flipped):
        mesh = mesh_from_arrays(pts, cc + [("line", edges)], cell_data={
            "t": [np.zeros(16, int), np.ones(4, int)]})
        assert np.allclose(boundary(mesh, "t=1").normal, [-1.0, 0.0])


# ------------------------------------------------------------- input channels
def test_tag_channels_at_points_and_cells():
    n = 4
    mesh = gmsh_square(n, "quad", amount=0.2)
    ch = tag_channels(mesh, ["left", "bottom"])
    assert list(ch) == ["tag:left", "tag:bottom", NORMAL_FIELD]
    x, y = mesh.pos[:, 0], mesh.pos[:, 1]
    assert torch.equal(ch["tag:left"], (x == 0).double())
    assert torch.equal(ch["tag:bottom"], (y == 0).double())
    normal = ch[NORMAL_FIELD]
    on = (x == 0) | (y == 0)
    assert torch.allclose(normal[on].norm(dim=1), torch.ones(int(on.sum()), dtype=torch.float64))
    assert torch.equal(normal[~on], torch.zeros(int((~on).sum()), 2, dtype=torch.float64))
    mid = (x == 0) & (y > 0)
    assert torch.allclose(normal[mid], torch.tensor([-1.0, 0.0], dtype=torch.float64))
    corner = (x == 0) & (y == 0)
    assert torch.allclose(normal[corner], torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
                          / 2 ** 0.5)
    cp = cell_points(mesh)
    cells = tag_channels(mesh, ["left"], "cells", cp.num_cells)
    touches = torch.from_numpy(cp.centroid[:, 0] < 1.0 / n)
    assert torch.equal(cells["tag:left"], touches.double())
    assert torch.allclose(cells[NORMAL_FIELD][touches], torch.tensor([-1.0, 0.0],
                                                                      dtype=torch.float64))


def test_a_zero_length_tagged_edge_is_skipped_not_spread():
    # issue 28: a collapsed quad (vertices 1 and 4 coincide) puts a zero-length edge on the
    # tagged boundary; its normal is undefined (0/0), and NaN must not reach every vertex.
    pts = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [1, 0]], float)
    lines = np.array([[0, 1], [1, 4], [4, 2]])        # bottom, the zero-length edge, right
    mesh = mesh_from_arrays(pts, [("quad", np.array([[0, 1, 4, 2]])),
                                  ("triangle", np.array([[0, 2, 3]])), ("line", lines)],
                            cell_data={"t": [np.zeros(1, int), np.zeros(1, int),
                                             np.ones(3, int)]})
    normal = tag_channels(mesh, ["t=1"])[NORMAL_FIELD]
    down, right = [0.0, -1.0], [1.0, 0.0]
    expected = torch.tensor([down, down, right, [0.0, 0.0], right], dtype=torch.float64)
    assert torch.allclose(normal, expected, atol=1e-15)
    b = boundary(mesh, "t=1")
    assert b.measure[1] == 0 and np.isfinite(b.normal).all()
    # int x n ds: bottom int_0^1 x dx (0, -1) + right (1, 0) (x = 1): exact, finite
    got = b.integrate(mesh.pos[:, 0], mode="normal")
    assert torch.allclose(got, torch.tensor([1.0, -0.5], dtype=torch.float64), atol=1e-14)
    cp = cell_points(mesh)
    cells = tag_channels(mesh, ["t=1"], "cells", cp.num_cells)[NORMAL_FIELD]
    assert torch.isfinite(cells).all() and cells[0].norm() > 0.99


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("tag,message", [
    ("wal", r"unknown tag 'wal'; tags in this file: names bottom, domain, inner, left, right, "
            r"top; ARRAY=VALUE with the integer cell arrays CellEntityIds, gmsh:physical"),
    ("domain", r"tag 'domain' is a 2-D physical group; boundary tags are groups of 1-D facets"),
    ("gmsh:physical=0", r"tag 'gmsh:physical=0' \(gmsh:physical = 0\) marks quad cells, a 2-D "
                        r"region"),
    ("gmsh:physical=9", r"tag .gmsh:physical=9. \(gmsh:physical = 9\) marks no 1-D facets"),
    ("CellEntityIds=one",
     r"tag 'CellEntityIds=one': the value after '=' must be an integer cell tag, got 'one'"),
    ("nope=1", r"unknown tag 'nope=1': no cell array 'nope'"),
    ("inner", r"tag 'inner': line facet 0 with vertices \[6, 7\] lies inside the mesh"),
])
def test_bad_tags_are_refused(tag, message):
    mesh = gmsh_square(4, "mixed", extra_lines=np.array([[6, 7]]))
    mesh.source = "m.msh"
    with pytest.raises(MeshError, match=r"m\.msh: " + message):
        boundary(mesh, tag)


def test_a_facet_of_no_cell_and_a_surface_mesh_are_refused():
    mesh = gmsh_square(4, "quad", extra_lines=np.array([[0, 12]]))
    with pytest.raises(MeshError, match=r"line facet 0 with vertices \[0, 12\] bounds no cell"):
        boundary(mesh, "inner")
    pts, cells = square_mesh(2, "triangle")
    pts3 = np.c_[pts, pts[:, 0] * pts[:, 1]]
    surf = mesh_from_arrays(pts3, cells + [("line", np.array([[0, 1]]))],
                            cell_data={"t": [np.zeros(8, int), np.ones(1, int)]})
    with pytest.raises(MeshError, match=r"a 2-D mesh in 3-D \(outward normals are not defined"):
        boundary(surf, "t=1")


def test_physical_names_survive_a_gmsh_file(tmp_path):
    mesh = gmsh_square(3, "triangle")
    out = meshio.Mesh(np.c_[mesh.pos.numpy(), np.zeros(len(mesh.pos))],
                      [(t, c.numpy()) for t, c in mesh.cells],
                      cell_data={"gmsh:physical": [c.numpy() for c in
                                                   mesh.cell_data["gmsh:physical"]],
                                 "gmsh:geometrical": [c.numpy() for c in
                                                      mesh.cell_data["gmsh:physical"]]},
                      field_data=mesh.field_data)
    meshio.write(tmp_path / "s.msh", out, file_format="gmsh22")
    read = read_mesh(tmp_path / "s.msh")
    assert abs(boundary(read, "top").measure.sum() - 1.0) < 1e-14


# --------------------------------------------------------------- command line
def _write_gmsh_folder(root: Path, n: int = 6) -> Path:
    """Gmsh files with a linear target u = 1 + a x + y (exact boundary integrals)."""
    root.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        pts, cells = square_mesh(4 + k % 2, "mixed", amount=0.2, seed=k)
        edges = _square_edges(4 + k % 2)
        lines = np.concatenate([edges["left"], edges["right"], edges["bottom"], edges["top"]])
        tags = np.repeat([1, 2, 3, 3], [len(edges[s]) for s in ("left", "right", "bottom", "top")])
        phys = [np.zeros(len(c), int) for _, c in cells] + [tags]
        u = 1 + (1 + 0.1 * k) * pts[:, 0] + pts[:, 1]
        meshio.write(root / f"s{k}.msh", meshio.Mesh(
            np.c_[pts, np.zeros(len(pts))], cells + [("line", lines)], point_data={"u": u},
            cell_data={"gmsh:physical": phys, "gmsh:geometrical": phys},
            field_data={"inlet": np.array([1, 1]), "outlet": np.array([2, 1]),
                        "wall": np.array([3, 1])}), file_format="gmsh22")
    return root


@pytest.fixture(scope="module")
def tag_run(tmp_path_factory):
    data = _write_gmsh_folder(tmp_path_factory.mktemp("tags") / "data")
    out = tmp_path_factory.mktemp("tagrun") / "run"
    assert cli.main(["train", "--data", str(data), "--inputs", "", "--targets", "u",
                     "--tags", "wall,inlet", "--model", "galerkin_transformer", "--model-config",
                     "width=8", "layers=1", "heads=2", "--epochs", "1", "--batch-size", "2",
                     "--out", str(out)]) == 0
    return data, out


def test_tags_become_input_channels_of_the_run(tag_run):
    _, out = tag_run
    from meshops.models import NeuralOperator
    model = NeuralOperator.from_checkpoint(out / "best.pt")
    meta = model.metadata
    assert meta["inputs"] == ["tag:wall", "tag:inlet", "tag:normal"]
    assert meta["tags"] == ["wall", "inlet"] and model.config["in_channels"] == 4
    assert meta["field_shapes"]["tag:normal"] == [2]


def test_evaluate_reports_boundary_integrals(tag_run, capsys):
    data, out = tag_run
    assert cli.main(["evaluate", str(out), "--data", str(data), "--integral", "inlet:u",
                     "--integral", "wall:u*n", "--json", "--no-baselines"]) == 0
    result = json.loads(capsys.readouterr().out)
    inlet, wall = result["integrals"]
    assert inlet["integral"] == "inlet:u" and wall["mode"] == "normal"
    for k, s in enumerate(inlet["samples"]):
        assert s["file"] == f"s{k}.msh"
        assert abs(s["true"][0] - 1.5) < 1e-12        # int_0^1 (1 + y) dy on x = 0
        assert s["abs_error"] == pytest.approx(abs(s["pred"][0] - s["true"][0]), abs=1e-12)
    for k, s in enumerate(wall["samples"]):
        # with a = 1 + 0.1 k, y = 0: -(int (1 + a x) dx) e_y, y = 1: +(int (2 + a x) dx) e_y
        assert np.allclose(s["true"], [0.0, 1.0], atol=1e-12)
        assert s["rel_error"] == pytest.approx(np.linalg.norm(np.subtract(s["pred"], s["true"])),
                                               abs=1e-12)
    # the text report has a row per integral
    assert cli.main(["evaluate", str(out), "--data", str(data), "--integral", "inlet:u",
                     "--no-baselines"]) == 0
    assert any(line.startswith("inlet:u ") for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("argv,message", [
    (["--integral", "wal:u"], "s0.msh: unknown tag 'wal'; tags in this file: names inlet, "
                              "outlet, wall"),
    (["--integral", "wall:v"], "--integral 'wall:v': 'v' is not a target of the model (u)"),
    (["--integral", "wall:u.n"], "--integral 'wall:u.n': .n takes the normal component of a "
                                 "vector field; 'u' is a scalar"),
    (["--integral", "wall"], "--integral 'wall': expected TAG:FIELD"),
])
def test_evaluate_refuses_bad_integrals(tag_run, capsys, argv, message):
    data, out = tag_run
    code = cli.main(["evaluate", str(out), "--data", str(data), "--no-baselines", *argv])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err) and message in err, err


def test_train_refuses_an_unknown_tag(tmp_path, capsys):
    data = _write_gmsh_folder(tmp_path / "data", 2)
    code = cli.main(["train", "--data", str(data), "--inputs", "", "--targets", "u",
                     "--tags", "wal", "--epochs", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err)
    assert "s0.msh: unknown tag 'wal'; tags in this file: names inlet, outlet, wall" in err


def test_predict_computes_the_tag_channels(tag_run, tmp_path):
    data, out = tag_run
    assert cli.main(["predict", str(out), str(data / "s1.msh"), "-o", str(tmp_path),
                     "--format", ".vtu"]) == 0
    from meshops.mesh.data import MeshData
    from meshops.models import NeuralOperator
    model = NeuralOperator.from_checkpoint(out / "best.pt")
    s = SampleLayout([], ["u"], tags=["wall", "inlet"]).view(read_mesh(data / "s1.msh"),
                                                               data / "s1.msh")
    x = torch.cat([s.fields["tag:wall"][:, None], s.fields["tag:inlet"][:, None],
                   s.fields["tag:normal"]], 1).float()
    want = model.predict(MeshData(pos=s.pos.float(), weight=s.weight.float(), x=x))
    got = read_mesh(tmp_path / "s1.vtu").fields["u_pred"]
    assert torch.allclose(got.float(), want[:, 0], atol=1e-6)
    assert "tag:wall" not in read_mesh(tmp_path / "s1.vtu").fields  # not written out


def test_info_lists_cell_data_and_physical_names(tmp_path, capsys):
    data = _write_gmsh_folder(tmp_path / "d", 1)
    assert cli.main(["info", "--json", str(data / "s0.msh")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["field_data"] == {"inlet": [1, 1], "outlet": [2, 1], "wall": [3, 1]}
    assert info["cell_fields"] == {"gmsh:physical": [], "gmsh:geometrical": []}
    assert cli.main(["info", str(data / "s0.msh")]) == 0
    assert "  field data inlet [1, 1], outlet [2, 1], wall [3, 1]" in capsys.readouterr().out
