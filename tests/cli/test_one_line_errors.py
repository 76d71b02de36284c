"""Bad input gets one line, not a traceback (issue 20, the raw-traceback and cosmetic
lists): seeds beyond the generators' range, flat point clouds, devices this machine does
not have, picture formats matplotlib cannot write, Trainer arguments that were truncated
or failed late, a string for read_mesh's field list; warnings without source locations,
the right words about points outside the top-dimensional cells, and a tetra mesh with a
tagged boundary face drawn as the volume it is."""

from __future__ import annotations

import json
import math
import warnings

import meshio
import numpy as np
import pytest
import torch
from _folders import SMALL, data, run, run_cli, tiny_model, tiny_samples, train  # noqa: F401
from _meshes import square_mesh, tetra_cube
from _tiny_run import one_line_error

from meshops import MeshError
from meshops.mesh.io import mesh_from_arrays, read_mesh
from meshops.training import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _one_line(capsys, argv):
    code, out, err = run_cli(capsys, argv)
    assert code == 2 and one_line_error(err), err
    return err


# ------------------------------------------------------------------------ seeds
def test_a_seed_beyond_the_generators_is_refused_before_reading_data(tmp_path, capsys):
    # --data does not exist: the seed is refused first, and no run folder is made
    err = _one_line(capsys, ["train", "--data", tmp_path / "none", *SMALL, "--seed",
                             str(2**64), "--out", tmp_path / "run"])
    assert "seed: must be <= 9223372036854775807" in err
    assert not (tmp_path / "run").exists()


def test_a_large_seed_trains(data, tmp_path, capsys):
    """A 15-digit seed overflowed the epoch seed after the data was read: now the run
    trains its epoch to a finite validation error, records the seed, and repeats exactly
    with it (one seed, one result)."""
    histories = []
    for out in ("run", "again"):
        code, _, err = train(capsys, data, tmp_path / out, "--seed", "123456789012345")
        assert code == 0, err
        assert "seed: 123456789012345\n" in (tmp_path / out / "config.yaml").read_text()
        histories.append(json.loads((tmp_path / out / "history.json").read_text()))
    assert len(histories[0]) == 1 and math.isfinite(histories[0][0]["val_l2"])
    first, again = ([(h["train_loss"], h["val_l2"]) for h in hist] for hist in histories)
    assert first == again


def test_trainer_arguments_are_checked_when_given():
    model, data = tiny_model(), tiny_samples(2)
    for kw, msg in (({"batch_size": 2.5}, "batch_size must be a positive integer, got 2.5"),
                    ({"epochs": 1.5}, "epochs must be a positive integer"),
                    ({"val_data": []}, "val_data is empty; pass val_data=None"),
                    ({"seed": 2**64}, "seed must be an integer in 0..9223372036854775807"),
                    ({"device": "foo"}, "'foo' is not a device name")):
        args = {"epochs": 1, "batch_size": 2, "progress": False, "log": None, **kw}
        with pytest.raises(ValueError, match=msg):
            Trainer(model, data, **args)


def test_read_mesh_refuses_a_string_of_field_names(data):
    with pytest.raises(TypeError, match=r"fields is a list of field names, e\.g\. \['uf'\]"):
        read_mesh(data / "s0.vtu", fields="uf")
    assert list(read_mesh(data / "s0.vtu", fields=["u"]).fields) == ["u"]


# ---------------------------------------------------------------- flat clouds
@pytest.mark.parametrize("kind", ["collinear", "coplanar", "one point", "two points"])
def test_a_flat_point_cloud_is_a_mesh_error(tmp_path, capsys, kind):
    rng = np.random.default_rng(0)
    t = rng.random(20)
    pts = {"collinear": np.stack([t, 2 * t + 1, 3 - t], 1),
           "coplanar": np.c_[rng.random((20, 2)), np.full(20, 0.5)] @ np.array(
               [[1, 0, 0], [0, 0.6, 0.8], [0, -0.8, 0.6]]),
           "one point": np.array([[0.1, 0.2, 0.3]]),
           "two points": np.array([[0.1, 0.2, 0.3], [1.0, 2.0, 0.5]])}[kind]
    path = tmp_path / "cloud.vtu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, meshio.Mesh(pts, [("vertex", np.arange(len(pts))[:, None])]))
    with pytest.raises(MeshError, match="lie on a line or plane: their convex hull has no "
                                        "volume"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no cells: the kNN estimate is announced)
        read_mesh(path)
    err = run_cli(capsys, ["info", path])[2]
    assert err.endswith("drop the constant coordinate\n") and "Traceback" not in err
    assert "QhullError" not in err


# --------------------------------------------------------------------- devices
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_on_a_machine_without_it(run, tmp_path, capsys, device):
    err = _one_line(capsys, ["train", "--data", tmp_path / "none", *SMALL, "--device", device,
                             "--out", tmp_path / "r"])
    assert f"--device: '{device}': CUDA is not available" in err and "machine has: cpu" in err
    for command in (["predict", run, tmp_path / "m.vtu", "-o", tmp_path / "p"],
                    ["evaluate", run, "--data", tmp_path / "none"]):
        err = _one_line(capsys, [*command, "--device", device])
        assert "CUDA is not available" in err and "checkpoint" not in err


def test_a_device_that_does_not_exist(run, tmp_path, capsys):
    for command in (["train", "--data", tmp_path / "none", *SMALL, "--out", tmp_path / "r"],
                    ["predict", run, tmp_path / "m.vtu", "-o", tmp_path / "p"],
                    ["evaluate", run, "--data", tmp_path / "none"]):
        err = _one_line(capsys, [*command, "--device", "foo"])
        assert "--device: 'foo' is not a device name; use cpu, cuda or cuda:N" in err
    assert not (tmp_path / "r").exists()


# -------------------------------------------------------------------- pictures
def test_a_picture_format_matplotlib_cannot_write_is_refused_before_working(
        run, data, tmp_path, capsys, monkeypatch):
    import meshops.inference.predict

    def no_work(*a, **k):
        raise AssertionError("evaluated before the picture's format was checked")

    monkeypatch.setattr(meshops.inference.predict, "predict_mesh", no_work)
    err = _one_line(capsys, ["evaluate", run, "--data", data, "--plot", tmp_path / "x.xyz"])
    assert "x.xyz: matplotlib cannot write '.xyz' pictures; use one of" in err
    assert ".png" in err
    err = _one_line(capsys, ["plot", data / "s0.vtu", "--field", "u", "-o",
                             tmp_path / "x.xyz"])
    assert "cannot write '.xyz' pictures" in err


def test_plot_into_a_folder_names_the_folder(data, tmp_path, capsys):
    err = _one_line(capsys, ["plot", data / "s0.vtu", "--field", "u", "-o", tmp_path])
    assert f"{tmp_path}: is a folder; give a picture file" in err and ".meshops-" not in err
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------- cosmetic
def test_warnings_are_one_line_without_source_locations(tmp_path, capsys):
    rng = np.random.default_rng(0)
    pts = rng.random((30, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(tmp_path / "c.vtu", meshio.Mesh(pts, [("vertex", np.arange(30)[:, None])]))
    code, _, err = run_cli(capsys, ["info", tmp_path / "c.vtu"])
    assert code == 0
    assert err == (f"meshops: warning: {tmp_path / 'c.vtu'}: a point cloud without cells or "
                   f"stored weights; using the kNN volume estimate "
                   f"(meshops.point_cloud_weights)\n")


def _tetra_with_a_face():
    pts, cells = tetra_cube(2)
    tets = cells[0][1]
    face = tets[:1, :3]  # a tagged boundary face, as Gmsh writes physical surfaces
    return pts, [("tetra", tets), ("triangle", face)]


def test_points_only_in_lower_dimensional_cells_are_not_said_to_be_in_no_cell():
    pts, cells = _tetra_with_a_face()
    extra = len(pts) + np.arange(3)
    pts = np.vstack([pts, [[5, 5, 5], [6, 5, 5], [5, 6, 5]]])
    cells.append(("triangle", extra[None]))  # a loose triangle outside the volume
    with pytest.warns(UserWarning) as record:
        mesh = mesh_from_arrays(pts, cells, source="m")
    text = str(record[0].message)
    assert "used by no cell" not in text
    assert "3 points are in no 3-D cell, only in triangle (3 points) cells" in text
    assert mesh.weight[-3:].tolist() == [0, 0, 0]


def test_a_tetra_mesh_with_a_tagged_face_is_drawn_as_its_points(tmp_path):
    from matplotlib.figure import Figure

    from meshops.inference.plot import _draw, _Panel

    pts, cells = _tetra_with_a_face()
    mesh = mesh_from_arrays(pts, cells)
    fig = Figure()
    ax = _draw(fig, (1, 1, 1), _Panel(mesh, pts[:, 0], "x"), 20000, 3.0)
    assert type(ax.collections[0]).__name__ == "Path3DCollection"
    assert len(ax.collections[0].get_offsets()) == len(pts)
    # a surface mesh in 3-D is still drawn as its surface
    flat, tris = square_mesh(3, "triangle")
    surface = mesh_from_arrays(np.c_[flat, flat[:, 0] * flat[:, 1]], tris)
    ax = _draw(Figure(), (1, 1, 1), _Panel(surface, flat[:, 0], "x"), 20000, 3.0)
    assert type(ax.collections[0]).__name__ == "Poly3DCollection"
