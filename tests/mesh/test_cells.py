"""Cell-centred fields (issue 21.1): the midpoint rule on the cells' true centroids
(exact for linear fields, second order under refinement, mixed cell types), the
point -> cell transfer of inputs, the sample layout's refusals, and ``meshops train /
predict / evaluate`` on cell data end to end."""

from pathlib import Path

import meshio
import numpy as np
import pytest
import torch
from _meshes import annulus_quads, cube_mesh, square_mesh, tetra_cube
from _tiny_run import one_line_error

from meshops import cli
from meshops.datasets.folder import MeshFolderDataset
from meshops.datasets.layout import SampleLayout
from meshops.errors import MeshError
from meshops.mesh.cells import cell_field, cell_points, cells_to_blocks, point_to_cells
from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh
from meshops.models import NeuralOperator

MESHES_2D = [("quad", 0.25), ("triangle", 0.25), ("mixed", 0.25)]


def _cells_of(pts, cells):
    return cell_points(mesh_from_arrays(pts, cells))


@pytest.mark.parametrize("kind,amount", MESHES_2D)
def test_midpoint_rule_is_exact_for_linear_fields_2d(kind, amount):
    # Distorted quads: the vertex mean is not the centroid, and the rule with it is
    # off by O(h^2) per cell; with the true centroid it is exact.
    pts, cells = square_mesh(5, kind, amount=amount, seed=3)
    cp = _cells_of(pts, cells)
    f = 1.0 + 2.0 * cp.centroid[:, 0] - 3.0 * cp.centroid[:, 1]
    assert abs(cp.measure.sum() - 1.0) < 1e-14
    assert abs((cp.measure * f).sum() - 0.5) < 1e-13   # 1 + 1 - 1.5


def test_vertex_mean_is_not_the_centroid_of_distorted_quads():
    # what the test above guards against: the vertex mean misses linear exactness
    pts, cells = square_mesh(5, "quad", amount=0.25, seed=3)
    cp = _cells_of(pts, cells)
    vmean = pts[cells[0][1]].mean(1)
    f = lambda c: 1.0 + 2.0 * c[:, 0] - 3.0 * c[:, 1]  # noqa: E731
    assert abs((cp.measure * f(vmean)).sum() - 0.5) > 1e-6


@pytest.mark.parametrize("gen", [cube_mesh, tetra_cube])
def test_midpoint_rule_is_exact_for_linear_fields_3d(gen):
    pts, cells = gen(3, amount=0.2, seed=1)   # hexahedra, pyramids, wedges / tetrahedra
    cp = _cells_of(pts, cells)
    c = cp.centroid
    f = 1.0 + c[:, 0] - 2.0 * c[:, 1] + 4.0 * c[:, 2]
    assert abs(cp.measure.sum() - 1.0) < 1e-13
    assert abs((cp.measure * f).sum() - 2.5) < 1e-12


def _order(ns, errs):
    return -np.polyfit(np.log(ns), np.log(errs), 1)[0]


@pytest.mark.parametrize("kind", ["quad", "triangle", "mixed"])
def test_midpoint_rule_converges_at_second_order_2d(kind):
    # a smooth field on distorted meshes refined 4 -> 32 cells per side: the midpoint
    # rule's error is O(h^2) (measured 1.98-2.02); first order would give 1
    f = lambda p: np.exp(p[:, 0]) * np.sin(np.pi * p[:, 1])  # noqa: E731
    exact = (np.e - 1) * 2 / np.pi
    ns = [4, 8, 16, 32]
    errs = []
    for n in ns:
        cp = _cells_of(*square_mesh(n, kind, amount=0.25, seed=n))
        errs.append(abs((cp.measure * f(cp.centroid)).sum() - exact))
    assert 1.85 < _order(ns, errs) < 2.3, errs


@pytest.mark.parametrize("gen", [cube_mesh, tetra_cube])
def test_midpoint_rule_converges_at_second_order_3d(gen):
    f = lambda p: np.exp(p[:, 0]) * np.sin(np.pi * p[:, 1]) * np.cos(p[:, 2])  # noqa: E731
    exact = (np.e - 1) * 2 / np.pi * np.sin(1.0)
    ns = [2, 4, 8]
    errs = []
    for n in ns:
        cp = _cells_of(*gen(n, amount=0.2, seed=n))
        errs.append(abs((cp.measure * f(cp.centroid)).sum() - exact))
    assert 1.85 < _order(ns, errs) < 2.3, errs


def test_midpoint_rule_on_a_curved_domain_converges():
    # the annulus 0.5 < r < 1 meshed by quads: the polygonal domain's area error is
    # O(h^2) too, and the integral of r^2 converges to 2 pi (1 - 1/16) / 4
    exact = 2 * np.pi * (1 - 0.5 ** 4) / 4
    ns = [8, 16, 32]
    errs = []
    for n in ns:
        cp = _cells_of(*annulus_quads(n // 4, 4 * n))
        errs.append(abs((cp.measure * (cp.centroid ** 2).sum(1)).sum() - exact))
    assert 1.85 < _order(ns, errs) < 2.3, errs


def test_point_to_cells_is_the_value_at_the_centroid_for_linear_fields():
    pts, cells = square_mesh(4, "mixed", amount=0.3, seed=2)
    cp = _cells_of(pts, cells)
    lin = lambda p: np.stack([1 + p[:, 0], 2 * p[:, 1] - p[:, 0]], 1)  # noqa: E731
    got = point_to_cells(torch.from_numpy(lin(pts)), cp)
    assert got.shape == (cp.num_cells, 2)
    assert torch.allclose(got, torch.from_numpy(lin(cp.centroid)), atol=1e-13, rtol=0)


def test_point_to_cells_names_a_non_finite_point():
    pts, cells = square_mesh(3, "quad")
    cp = _cells_of(pts, cells)
    f = np.zeros(len(pts))
    f[7] = np.nan
    with pytest.raises(MeshError, match=r"s\.vtu: point field 'f' has a non-finite value at "
                                        r"point 7"):
        point_to_cells(f, cp, "f", "s.vtu")


def _tagged_square(n=4, kind="mixed"):
    """A square with its boundary lines as a cell block (a Gmsh-style 2-D mesh)."""
    pts, cells = square_mesh(n, kind, amount=0.2, seed=1)
    idx = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    lines = np.concatenate([np.stack([idx[0, :-1], idx[0, 1:]], 1),
                            np.stack([idx[-1, :-1], idx[-1, 1:]], 1)])
    return pts, cells + [("line", lines)]


def test_cell_data_round_trip_through_blocks_with_boundary_lines():
    pts, cells = _tagged_square()
    mesh = mesh_from_arrays(pts, cells)
    cp = cell_points(mesh)
    assert cp.num_cells == sum(len(c) for t, c in cells if t != "line")
    values = torch.arange(cp.num_cells, dtype=torch.float64)
    blocks = cells_to_blocks(values, cp)
    assert [len(b) for b in blocks] == [len(c) for _, c in cells]
    assert np.isnan(blocks[-1]).all()        # the boundary lines are not sample points
    mesh.cell_data = {"p": [torch.from_numpy(b) for b in blocks]}
    assert torch.equal(cell_field(mesh, "p", cp), values)


def test_cell_field_errors_name_block_and_cell():
    pts, cells = _tagged_square()
    mesh = mesh_from_arrays(pts, cells)
    cp = cell_points(mesh)
    blocks = cells_to_blocks(np.ones(cp.num_cells), cp)
    blocks[1][2] = np.inf
    mesh.cell_data = {"p": blocks}
    with pytest.raises(MeshError, match=r"cell field 'p' has a non-finite value at triangle "
                                        r"cell 2 \(block 1"):
        cell_field(mesh, "p", cp, "m.vtu")
    mesh.cell_data = {"p": [b[:-1] for b in cells_to_blocks(np.ones(cp.num_cells), cp)]}
    with pytest.raises(MeshError, match=r"cell field 'p' has \d+ values in cell block 0"):
        cell_field(mesh, "p", cp, "m.vtu")


def test_point_cloud_has_no_cells():
    mesh = mesh_from_arrays(np.random.default_rng(0).random((20, 2)), [],
                            {"meshops:weight": np.full(20, 0.05)})
    with pytest.raises(MeshError, match="cell data needs a mesh with cells"):
        cell_points(mesh)


# ------------------------------------------------------------------ the layout
def _cell_mesh(k: int, with_point_p: bool = False):
    """A square (its boundary lines included) with a point input f, a cell target p
    (exact per-cell values of 1 + x + k y at the centroids) and a point target u."""
    pts, cells = _tagged_square(4 + k % 3, ("quad", "triangle", "mixed")[k % 3])
    mesh = mesh_from_arrays(pts, cells, {"f": pts[:, 0] * pts[:, 1], "u": pts[:, 0]})
    cp = cell_points(mesh)
    p = 1 + cp.centroid[:, 0] + k * cp.centroid[:, 1]
    mesh.cell_data = {"p": [torch.from_numpy(b) for b in cells_to_blocks(p, cp)],
                      "q": [torch.from_numpy(b) for b in cells_to_blocks(2 * p, cp)]}
    if with_point_p:
        mesh.fields["p"] = torch.zeros(len(pts), dtype=torch.float64)
    return mesh


def test_a_cell_target_makes_a_cell_sample():
    mesh = _cell_mesh(1)
    layout = SampleLayout(["f"], ["p"])
    s = layout.view(mesh, "m.vtu")
    cp = cell_points(mesh)
    assert layout.location == "cells"
    assert torch.equal(s.pos, torch.from_numpy(cp.centroid))
    assert torch.equal(s.weight, torch.from_numpy(cp.measure))
    assert torch.allclose(s.fields["f"], torch.from_numpy(
        np.asarray(cp.transfer @ (mesh.pos[:, 0] * mesh.pos[:, 1]).numpy())))
    assert torch.equal(s.fields["p"], cell_field(mesh, "p", cp))
    assert "cells" in dir(mesh) and mesh.fields.keys() == {"f", "u"}   # not changed


def test_point_targets_keep_the_points():
    mesh = _cell_mesh(1)
    s = SampleLayout(["f"], ["u"]).view(mesh, "m.vtu")
    assert torch.equal(s.pos, mesh.pos) and torch.equal(s.weight, mesh.weight)


@pytest.mark.parametrize("inputs,targets,message", [
    (["p"], ["u"], r"input 'p' is cell data but the targets are point data"),
    ([], ["p", "u"], r"target 'p' is cell data but target 'u' is point data"),
    (["f"], ["nope"], r"target field 'nope' not found; available point fields: f, u; "
                      r"cell fields: p, q"),
])
def test_layout_refuses_what_is_not_well_defined(inputs, targets, message):
    with pytest.raises(MeshError, match=r"m\.vtu: " + message):
        SampleLayout(inputs, targets).view(_cell_mesh(1), "m.vtu")


def test_a_point_and_a_cell_field_of_one_name_is_refused():
    with pytest.raises(MeshError, match=r"m\.vtu: 'p' is both a point field and a cell field"):
        SampleLayout(["f"], ["p"]).view(_cell_mesh(1, with_point_p=True), "m.vtu")
    # a clash in a field that is not used does not matter
    SampleLayout(["f"], ["u"]).view(_cell_mesh(1, with_point_p=True), "m.vtu")


def test_files_must_agree_on_where_the_targets_are():
    layout = SampleLayout(["f"], ["p"])
    layout.view(_cell_mesh(0), "a.vtu")
    mesh = _cell_mesh(1)
    mesh.fields["p"] = mesh.fields.pop("u")
    mesh.cell_data = {"q": mesh.cell_data["q"]}
    with pytest.raises(MeshError, match=r"b\.vtu: the targets p are point data here but cell "
                                        r"data in a\.vtu"):
        layout.view(mesh, "b.vtu")


# ------------------------------------------------------------ command line
def _write_cell_folder(root: Path, n: int = 6) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        write_mesh(root / f"c{k}.vtu", _cell_mesh(k))
    return root


@pytest.fixture(scope="module")
def cell_run(tmp_path_factory):
    data = _write_cell_folder(tmp_path_factory.mktemp("cells") / "data")
    out = tmp_path_factory.mktemp("cellrun") / "run"
    code = cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "p",
                     "--model", "transformer_no", "--model-config", "width=8", "layers=1",
                     "heads=2", "--epochs", "2", "--batch-size", "2", "--out", str(out)])
    assert code == 0
    return data, out


def test_train_on_cells_records_the_location(cell_run):
    _, out = cell_run
    model = NeuralOperator.from_checkpoint(out / "best.pt")
    assert model.metadata["location"] == "cells"
    assert model.metadata["inputs"] == ["f"] and model.metadata["targets"] == ["p"]


def test_predict_writes_cell_data_equal_to_the_model(cell_run, tmp_path):
    data, out = cell_run
    assert cli.main(["predict", str(out), str(data / "c2.vtu"), "-o", str(tmp_path)]) == 0
    written = meshio.read(tmp_path / "c2.vtu")
    assert "p_pred" in written.cell_data and "p_pred" not in written.point_data
    model = NeuralOperator.from_checkpoint(out / "best.pt")
    sample = SampleLayout(["f"], ["p"]).view(read_mesh(data / "c2.vtu"), data / "c2.vtu")
    x = sample.fields["f"].reshape(-1, 1).float()
    from meshops.mesh.data import MeshData
    want = model.predict(MeshData(pos=sample.pos.float(), weight=sample.weight.float(), x=x))
    got = np.concatenate([b for b, c in zip(written.cell_data["p_pred"], written.cells)
                          if c.type != "line"])
    assert np.allclose(got, want[:, 0].numpy(), atol=1e-6, rtol=0)
    lines = [b for b, c in zip(written.cell_data["p_pred"], written.cells) if c.type == "line"]
    assert lines and all(np.isnan(b).all() for b in lines)


def test_evaluate_on_cells_and_a_folder_of_point_targets_is_refused(cell_run, tmp_path,
                                                                    capsys):
    data, out = cell_run
    assert cli.main(["evaluate", str(out), "--data", str(data), "--json"]) == 0
    import json
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 6
    # the same file with p as point data: the run was trained on cells
    other = tmp_path / "points"
    other.mkdir()
    mesh = _cell_mesh(0)
    mesh.fields["p"] = mesh.fields.pop("u")
    mesh.cell_data = {}
    write_mesh(other / "c0.vtu", mesh)
    code = cli.main(["evaluate", str(out), "--data", str(other)])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err)
    assert "c0.vtu: the targets p are point data here but cell data in the run's training" in err


def test_train_refuses_a_name_that_is_a_point_and_a_cell_field(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):
        write_mesh(data / f"c{k}.vtu", _cell_mesh(k, with_point_p=True))
    code = cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "p",
                     "--epochs", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err)
    assert "c0.vtu: 'p' is both a point field and a cell field" in err
    assert not (tmp_path / "run").exists()


def test_dataset_reads_cell_samples(tmp_path):
    data = _write_cell_folder(tmp_path / "d", 3)
    ds = MeshFolderDataset(data, ["f"], ["p"])
    s = ds[1]
    assert ds.layout.location == "cells"
    assert s.x.shape == (cell_points(read_mesh(data / "c1.vtu")).num_cells, 1)
    assert s.y.shape[0] == s.pos.shape[0] == s.weight.shape[0]
