"""read_mesh / write_mesh: round trips, dimension handling, errors, atomic writes."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import meshio
import numpy as np
import pytest
import torch
from _meshes import cube_mesh, cube_sphere, square_mesh
from scipy.spatial import ConvexHull
from torch_geometric.loader import DataLoader

from meshops import MeshData, MeshError
from meshops.cli import main as cli_main
from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh

ANNULUS = Path(__file__).parents[2] / "examples" / "meshes" / "annulus.vtu"


def _write_meshio(path, pts, cells, **kw):
    meshio.write(path, meshio.Mesh(pts, cells, **kw))
    return path


def test_2d_mesh_with_zero_z_column_comes_back_2d(tmp_path):
    pts, cells = square_mesh(3, "mixed", amount=0.2)
    p3 = np.column_stack([pts, np.zeros(len(pts))])
    f = _write_meshio(tmp_path / "sq.vtu", p3, cells, point_data={"T": pts[:, 0]})
    mesh = read_mesh(f)
    assert mesh.dim == 2 and mesh.pos.dtype == torch.float64
    assert mesh.measure == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(mesh.integrate(mesh.fields["T"]),
                               torch.tensor(0.5, dtype=torch.float64), rtol=0, atol=1e-12)


def test_surface_in_3d_keeps_three_columns(tmp_path):
    pts, cells = square_mesh(2, "triangle")
    p3 = np.column_stack([pts, pts[:, 0]])  # tilted plane, z not zero
    mesh = read_mesh(_write_meshio(tmp_path / "tilt.vtu", p3, cells))
    assert mesh.dim == 3 and mesh.measure == pytest.approx(math.sqrt(2), abs=1e-12)


@pytest.mark.parametrize("suffix", [".vtu", ".vtk", ".xdmf", ".msh"])
def test_round_trip_bit_for_bit(tmp_path, suffix):
    pts, cells = cube_mesh(2, amount=0.2, seed=4)
    rng = np.random.default_rng(0)
    fields = {"p": rng.standard_normal(len(pts)), "u": rng.standard_normal((len(pts), 3))}
    mesh = mesh_from_arrays(pts, cells, fields)
    f1 = write_mesh(tmp_path / f"a{suffix}", mesh)
    m1 = read_mesh(f1)
    m2 = read_mesh(write_mesh(tmp_path / f"b{suffix}", m1))
    for m in (m1, m2):
        assert torch.equal(m.pos, mesh.pos)
        assert [t for t, _ in m.cells] == [t for t, _ in mesh.cells]
        for (_, c), (_, c0) in zip(m.cells, mesh.cells):
            assert torch.equal(c, c0)
        for k in ("p", "u"):
            assert torch.equal(m.fields[k].reshape(mesh.fields[k].shape), mesh.fields[k])
        assert torch.equal(m.weight, mesh.weight)


def test_annulus_example_mesh():
    mesh = read_mesh(ANNULUS)
    assert mesh.dim == 2 and set(mesh.cell_counts()) == {"triangle", "quad"}
    # Inscribed polygons: the area is a little below pi (1 - 1/4).
    assert 0.999 * math.pi * 0.75 < mesh.measure < math.pi * 0.75
    # u = x^2 - y; integral over the annulus of x^2 is pi (1 - 1/16)/4, of y is 0.
    integral = float(mesh.integrate(mesh.fields["u"]))
    assert integral == pytest.approx(math.pi * (1 - 1 / 16) / 4, rel=5e-3)


def test_fields_selection_and_missing_field(tmp_path):
    pts, cells = square_mesh(2)
    f = _write_meshio(tmp_path / "m.vtu", pts, cells,
                      point_data={"a": pts[:, 0], "b": pts[:, 1]})
    assert read_mesh(f, fields=["b"]).field_names == ["b"]
    with pytest.raises(MeshError, match=r"m\.vtu: point field\(s\) \['c'\] not found; "
                                        r"available: \['a', 'b'\]"):
        read_mesh(f, fields=["c"])


def test_meshdata_batches_with_pyg(tmp_path):
    meshes = [mesh_from_arrays(*square_mesh(n), {"u": np.ones((n + 1) ** 2)}) for n in (2, 3)]
    batch = next(iter(DataLoader(meshes, batch_size=2)))
    assert batch.num_graphs == 2 and batch.pos.shape[0] == 9 + 16
    torch.testing.assert_close(batch.integrate(batch.fields["u"]),
                               torch.ones(2, dtype=torch.float64))


# ---------------------------------------------------------------- errors


def test_missing_file(tmp_path):
    with pytest.raises(MeshError, match=r"nope\.vtu: no such file"):
        read_mesh(tmp_path / "nope.vtu")


def test_unreadable_and_unknown_format(tmp_path):
    bad = tmp_path / "garbage.vtu"
    bad.write_text("this is not xml")
    with pytest.raises(MeshError, match=r"garbage\.vtu: cannot read mesh"):
        read_mesh(bad)
    unknown = tmp_path / "mesh.foo"
    unknown.write_text("1 2 3")
    with pytest.raises(MeshError, match=r"mesh\.foo: cannot read mesh"):
        read_mesh(unknown)


def test_nan_in_file_names_file_and_point(tmp_path):
    pts, cells = square_mesh(2)
    pts[3] = [np.inf, 0]
    f = _write_meshio(tmp_path / "nan.vtu", pts, cells)
    with pytest.raises(MeshError, match=r"nan\.vtu: point 3 has a non-finite coordinate"):
        read_mesh(f)


def test_tangled_cell_in_file(tmp_path):
    pts, cells = square_mesh(2)
    q = cells[0][1].copy()
    q[1] = q[1][[0, 2, 1, 3]]
    f = _write_meshio(tmp_path / "tangled.vtu", pts, [("quad", q)])
    with pytest.raises(MeshError, match=r"tangled\.vtu: quad cell 1 .*tangled"):
        read_mesh(f)


def test_field_length_mismatch():
    pts, cells = square_mesh(2)
    with pytest.raises(MeshError, match=r"m\.vtu: point field 'T' has 5 values but the mesh has "
                                        r"9 points"):
        mesh_from_arrays(pts, cells, {"T": np.zeros(5)}, source="m.vtu")


def test_unsupported_cell_type_in_file(tmp_path):
    pts = np.array([[0, 0], [1, 0], [0, 1], [0.5, 0], [0.5, 0.5], [0, 0.5]])
    f = _write_meshio(tmp_path / "p2.vtu", pts, [("triangle6", np.arange(6)[None])])
    with pytest.raises(MeshError, match=r"p2\.vtu: unsupported cell type 'triangle6'"):
        read_mesh(f)


def test_unreferenced_duplicate_point(tmp_path):
    pts, cells = square_mesh(2)
    pts = np.vstack([pts, pts[4]])
    with pytest.raises(MeshError, match=r"dup: point 9 .* is used by no cell and duplicates"):
        mesh_from_arrays(pts, cells, source="dup")


def test_unreferenced_point_warns_and_gets_zero_weight():
    pts, cells = square_mesh(2)
    pts = np.vstack([pts, [[5.0, 5.0]]])
    with pytest.warns(UserWarning, match="1 points are used by no cell"):
        mesh = mesh_from_arrays(pts, cells)
    assert mesh.weight[-1] == 0 and mesh.measure == pytest.approx(1.0)


def test_failed_write_leaves_nothing_and_keeps_old_file(tmp_path):
    pts, cells = cube_mesh(1)
    mesh = mesh_from_arrays(pts, cells)
    target = tmp_path / "out.vtu"
    target.write_text("previous content")
    # meshio fails half-way through the XML when it meets a string array.
    with pytest.raises(MeshError, match=r"out\.vtu: writing failed"):
        write_mesh(target, mesh, point_data={"label": np.array(["a"] * len(pts))})
    assert target.read_text() == "previous content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.vtu"]


def test_write_rejects_bad_point_data_and_unknown_suffix(tmp_path):
    mesh = mesh_from_arrays(*square_mesh(2))
    with pytest.raises(MeshError, match=r"point_data 'pred' has 3 values but the mesh has 9"):
        write_mesh(tmp_path / "a.vtu", mesh, point_data={"pred": np.zeros(3)})
    with pytest.raises(MeshError, match="cannot tell the mesh format"):
        write_mesh(tmp_path / "a.unknownext", mesh)
    assert list(tmp_path.iterdir()) == []


def test_write_predictions_back(tmp_path):
    mesh = read_mesh(ANNULUS)
    pred = torch.randn(mesh.num_nodes, dtype=torch.float64)
    out = read_mesh(write_mesh(tmp_path / "pred.vtu", mesh, point_data={"u_pred": pred}))
    assert torch.equal(out.fields["u_pred"], pred)
    assert torch.equal(out.fields["u"], mesh.fields["u"])


# ---------------------------------------------------------------- CLI


def test_cli_info_json(capsys):
    assert cli_main(["info", "--json", str(ANNULUS)]) == 0
    info = json.loads(capsys.readouterr().out)
    mesh = read_mesh(ANNULUS)
    assert info["points"] == mesh.num_nodes and info["dimension"] == 2
    assert info["cells"] == mesh.cell_counts()
    assert info["measure"] == pytest.approx(mesh.measure, rel=1e-15)
    assert info["fields"] == {"u": [mesh.num_nodes]}
    assert info["bounding_box"]["max"][0] == pytest.approx(1.0)


def test_cli_info_text_and_error_exit_code(tmp_path):
    out = subprocess.run([sys.executable, "-m", "meshops", "info", str(ANNULUS)],
                         capture_output=True, text=True, check=True).stdout
    assert "area" in out and "triangle" in out and "quad" in out
    bad = subprocess.run([sys.executable, "-m", "meshops", "info", str(tmp_path / "x.vtu")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "x.vtu: no such file" in bad.stderr


def test_cli_info_of_a_folder_says_what_its_meshes_share(tmp_path, capsys):
    """Issue 38: ``meshops info FOLDER`` said "no such file"; it counts the meshes and
    names the fields all of them have (and those only some have)."""
    for k, n in enumerate((3, 4, 5)):
        pts, cells = square_mesh(n, "triangle")
        fields = {"f": pts[:, 0], "u": np.stack([pts[:, 0], pts[:, 1]], 1)}
        if k == 2:
            fields["p"] = pts[:, 1]
        write_mesh(tmp_path / "d" / f"s{k}.vtu", mesh_from_arrays(pts, cells, fields))
    (tmp_path / "d" / "notes.txt").write_text("not a mesh")
    assert cli_main(["info", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == [f"{tmp_path / 'd'}: a folder of 3 mesh file(s)",
                       "  points     16 to 36 per mesh (dimension 2)",
                       "  fields     in every mesh: f, u [2]",
                       "             in some: p (1 of 3)"]
    assert cli_main(["info", "--json", str(tmp_path / "d")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["meshes"] == 3 and info["fields"] == {"f": [], "u": [2]}
    assert info["fields_in_some"] == {"p": 1} and info["points"] == {"min": 16, "max": 36}
    (tmp_path / "empty").mkdir()
    assert cli_main(["info", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'empty'}: a folder without mesh files" in err and "no such" not in err


def test_point_cloud_round_trip_keeps_weights(tmp_path):
    rng = np.random.default_rng(1)
    pts = rng.random((50, 2))
    w = torch.from_numpy(rng.random(50))
    cloud = MeshData(pos=torch.from_numpy(pts), weight=w, fields={"s": torch.ones(50)})
    back = read_mesh(write_mesh(tmp_path / "cloud.vtu", cloud))
    assert torch.equal(back.pos, cloud.pos) and torch.equal(back.weight, w)
    assert back.field_names == ["s"]
    # Without stored weights a cloud gets the documented kNN estimate, with a warning.
    meshio.write(tmp_path / "bare.vtu", meshio.Mesh(pts, [("vertex", np.arange(50)[:, None])]))
    with pytest.warns(UserWarning, match="kNN volume estimate"):
        bare = read_mesh(tmp_path / "bare.vtu")
    assert bare.measure == pytest.approx(float(ConvexHull(pts).volume), rel=1e-12)


# ------------------------------------------------------------- fields kept or refused
@pytest.mark.parametrize("suffix", [".stl", ".obj", ".off", ".ply"])
def test_write_refuses_formats_that_drop_fields(tmp_path, suffix):
    pts, cells = square_mesh(2, "triangle")
    mesh = mesh_from_arrays(np.hstack([pts, np.zeros((len(pts), 1))]), cells)
    fmt = suffix[1:]
    with pytest.raises(MeshError, match=rf"a{suffix}: the {fmt} format cannot hold fields, so "
                                        r"point field 'u_pred' would be lost; write \.msh, "
                                        r"\.vtk, \.vtu, \.xdmf instead"):
        write_mesh(tmp_path / f"a{suffix}", mesh, point_data={"u_pred": np.zeros(len(pts))})
    assert list(tmp_path.iterdir()) == []
    # The geometry alone is fine in these formats, and comes back.
    back = read_mesh(write_mesh(tmp_path / f"a{suffix}", mesh))
    assert back.measure == pytest.approx(1.0, rel=1e-12)


def test_write_refuses_cell_fields_too_but_not_reader_tags(tmp_path):
    pts, cells = square_mesh(2, "triangle")
    mesh = mesh_from_arrays(pts, cells, cell_data={"material": [np.arange(8)]})
    with pytest.raises(MeshError, match="cell field 'material' would be lost"):
        write_mesh(tmp_path / "a.stl", mesh)
    # Gmsh's bookkeeping (read back from a .msh) is not the user's data.
    msh = read_mesh(write_mesh(tmp_path / "a.msh", mesh_from_arrays(pts, cells)))
    assert any(k.startswith("gmsh:") for k in list(msh.fields) + list(msh.cell_data))
    assert read_mesh(write_mesh(tmp_path / "a.stl", msh)).measure == pytest.approx(1.0)


@pytest.mark.parametrize("suffix", [".vtu", ".vtk", ".xdmf", ".msh"])
def test_field_formats_keep_scalar_and_vector_fields(tmp_path, suffix):
    pts, cells = square_mesh(3, "mixed")
    mesh = mesh_from_arrays(pts, cells)
    rng = np.random.default_rng(0)
    u, v = rng.random(len(pts)), rng.random((len(pts), 3))
    back = read_mesh(write_mesh(tmp_path / f"a{suffix}", mesh, point_data={"u": u, "v": v}))
    assert np.array_equal(back.fields["u"].numpy().reshape(-1), u)
    assert np.array_equal(back.fields["v"].numpy(), v)


@pytest.mark.parametrize("binary", [True, False])
def test_vtu_array_that_does_not_fit_its_components_is_refused(tmp_path, binary):
    pts, cells = square_mesh(2, "triangle")
    path = tmp_path / "bad.vtu"
    meshio.write(path, meshio.Mesh(np.hstack([pts, np.zeros((9, 1))]), cells,
                                   point_data={"u": np.zeros(9), "v": np.zeros((9, 3))}),
                 binary=binary)
    text = path.read_text()
    assert text.count('Name="v" NumberOfComponents="3"') == 1
    path.write_text(text.replace('Name="v" NumberOfComponents="3"',
                                 'Name="v" NumberOfComponents="5"'))
    with pytest.raises(MeshError, match=r"bad\.vtu: .*data array 'v' is 27 which doesn't fit "
                                        r"the number of components 5"):
        read_mesh(path)


@pytest.mark.parametrize("scale, problem", [(1e30, "overflow"), (1e-30, "underflow")])
def test_coordinates_whose_weights_float32_cannot_hold_are_refused(tmp_path, capsys, scale,
                                                                   problem):
    # Unit square in units 1e30 (1e-30): cell areas 1e60 (1e-60), which are inf (0)
    # in the models' float32; float64 computes them exactly.
    pts, cells = square_mesh(2, "triangle")
    path = _write_meshio(tmp_path / "far.vtu", np.hstack([pts * scale, np.zeros((9, 1))]),
                         cells, point_data={"u": np.ones(9)})
    with pytest.raises(MeshError, match=rf"far\.vtu: quadrature weights .* {problem} float32"):
        read_mesh(path)
    assert cli_main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshops: error: ") and "far.vtu" in err and "Traceback" not in err
    # Just inside float32's range (area 1e36, 1e-36 per cell, ~1e-37 per node) is fine.
    ok = 1e18 if scale > 1 else 1e-18
    w = mesh_from_arrays(pts * ok, cells).weight
    assert w.sum().item() == pytest.approx(ok * ok, rel=1e-12)
    assert torch.isfinite(w.float()).all() and (w.float() > 0).all()


def test_write_after_a_killed_write_removes_its_temporary_file(tmp_path):
    # A writer killed with SIGKILL mid-write cannot clean up after itself.
    script = ("import os, signal, sys\n"
              "from meshops.utils.atomic import atomic_write\n"
              "def write(tmp):\n"
              "    open(tmp, 'wb').write(b'x' * 1000)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "atomic_write(sys.argv[1], write)\n")
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "mesh.vtu")])
    assert r.returncode == -9
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".mesh.") and left[0].endswith(".tmp.vtu")
    write_mesh(tmp_path / "next.vtu", mesh_from_arrays(*square_mesh(2)))
    assert [p.name for p in tmp_path.iterdir()] == ["next.vtu"]
    # A live writer's temporary file (this process's, by its name) and files that
    # are not ours stay.
    from meshops.utils.atomic import _host, clean_stale_temporaries
    live = tmp_path / f".other.meshops-{_host()}-{os.getpid()}-abc.tmp.vtu"
    live.write_text("being written")
    (tmp_path / ".mesh.notours.tmp.vtu").write_text("someone else's")
    assert clean_stale_temporaries(tmp_path) == []
    assert len(list(tmp_path.iterdir())) == 3


def test_cli_info_names_the_measure_by_the_cells_dimension(tmp_path, capsys):
    # A sphere's surface in 3-D has an area (4 pi), a parabola arc in 2-D a length.
    pts, cells = cube_sphere(8)
    sphere = write_mesh(tmp_path / "sphere.vtu", mesh_from_arrays(pts, cells))
    t = np.linspace(0, 1, 65)
    arc = write_mesh(tmp_path / "arc.vtu", mesh_from_arrays(
        np.stack([t, t ** 2], 1), [("line", np.stack([np.arange(64), np.arange(1, 65)], 1))]))
    length = (math.sqrt(5) / 2 + math.asinh(2) / 4)  # exact arc length of y = x^2, 0..1
    assert cli_main(["info", str(sphere), str(arc)]) == 0
    out = capsys.readouterr().out.splitlines()
    measure_lines = [ln.split() for ln in out if "sum of quadrature weights" in ln]
    assert [m[0] for m in measure_lines] == ["area", "length"]
    assert float(measure_lines[0][1]) == pytest.approx(4 * math.pi, rel=1e-2)
    assert float(measure_lines[1][1]) == pytest.approx(length, rel=1e-4)
    assert cli_main(["info", "--json", str(sphere)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["dimension"] == 3 and info["cell_dimension"] == 2
