"""The ``meshops`` command end to end: train, predict, evaluate, plot, config files,
errors (exit code 2, message on stderr naming the file), geometry-only training."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import meshio
import numpy as np
import pytest
import torch
import yaml
from _meshes import cube_mesh, square_mesh

from meshops import cli
from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh
from meshops.models import NeuralOperator

# A small transformer: the tests check the pipeline, not the accuracy.
SMALL = ["--model", "transformer_no", "--model-config", "width=16", "layers=1", "heads=2"]


def _sample(k: int):
    """Unit square of a different resolution/cell type per k; input f, target u =
    f * y + x^2 / 2, a vector field g for geometry-only training."""
    n = 4 + k % 4
    pts, cells = square_mesh(n, ("quad", "triangle", "mixed")[k % 3], amount=0.2, seed=k)
    x, y = pts[:, 0], pts[:, 1]
    f = np.sin((1 + 0.3 * k) * np.pi * x) * np.cos(np.pi * y)
    fields = {"f": f, "u": f * y + 0.5 * x ** 2, "g": np.stack([x * y, x + y], 1)}
    return mesh_from_arrays(pts, cells, fields)


def _write_dataset(root: Path, n: int = 8) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        write_mesh(root / f"s{k}.vtu", _sample(k))
    return root


def _errors_of(capsys, argv):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    code = cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u", *SMALL,
                     "--epochs", "2", "--batch-size", "3", "--val-fraction", "0.25",
                     "--seed", "3", "--out", str(out)])
    assert code == 0
    return out


def _data(pos, weight, x):
    from meshops.mesh.data import MeshData

    return MeshData(pos=pos, weight=weight, x=x)


def _model_predict(model, mesh):
    x = mesh.fields["f"].reshape(-1, 1).float()
    return model.predict(_data(mesh.pos.float(), mesh.weight.float(), x))


def _rel_l2(pred, truth, w):
    pred, truth = np.asarray(pred, np.float64).ravel(), np.asarray(truth, np.float64).ravel()
    return float(np.sqrt((w * (pred - truth) ** 2).sum() / (w * truth ** 2).sum()))


# ------------------------------------------------------------------- entry point
def test_console_script_and_help(capsys):
    exe = shutil.which("meshops") or str(Path(sys.executable).parent / "meshops")
    res = subprocess.run([exe, "train", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for flag in ("--data", "--inputs", "--targets", "--model-config", "--val-data",
                 "--no-quadrature-loss", "--resume", "--config", "examples:", "torchrun"):
        assert flag in res.stdout
    for command in ("train", "predict", "evaluate", "plot", "info"):
        with pytest.raises(SystemExit) as e:
            cli.main([command, "--help"])
        assert e.value.code == 0
        assert "usage: meshops " + command in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = capsys.readouterr().out
    assert all(c in top for c in ("train", "predict", "evaluate", "plot"))


# ------------------------------------------------------------------------- train
def test_train_writes_run_folder(run, data):
    for name in ("best.pt", "last.pt", "history.json", "config.yaml"):
        assert (run / name).is_file()
    history = json.loads((run / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"] == "transformer_no" and cfg["inputs"] == ["f"] and cfg["targets"] == ["u"]
    assert cfg["model_config"]["width"] == 16 and cfg["model_config"]["in_channels"] == 1
    assert cfg["epochs"] == 2 and cfg["val_fraction"] == 0.25 and cfg["seed"] == 3
    model = NeuralOperator.from_checkpoint(run / "best.pt")
    meta = model.metadata
    assert meta["inputs"] == ["f"] and meta["targets"] == ["u"]
    assert meta["field_shapes"] == {"f": [], "u": []} and meta["pos_dim"] == 2
    # The split: deterministic from the seed, disjoint, covering every file.
    train, val = meta["split"]["train"], meta["split"]["val"]
    assert len(val) == 2 and len(train) == 6 and not set(train) & set(val)
    assert sorted(train + val) == sorted(p.name for p in data.iterdir())
    idx = cli.split_files(8, 0.25, 3, "d")
    assert idx == cli.split_files(8, 0.25, 3, "d")
    assert sorted(f"s{i}.vtu" for i in idx[1]) == sorted(val)
    assert idx != cli.split_files(8, 0.25, 4, "d")


def test_train_refuses_to_overwrite_and_resumes_from_config(run, data, tmp_path, capsys):
    code, err = _errors_of(capsys, ["train", "--data", "x", "--inputs", "f", "--targets", "u",
                                    "--out", str(run)])
    assert code == 2 and "--resume" in err and str(run) in err
    # A constant rate (no schedule laid out over the epochs), so the run may be extended.
    const = tmp_path / "const"
    assert cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u", *SMALL,
                     "--epochs", "2", "--batch-size", "3", "--scheduler", "none",
                     "--out", str(const)]) == 0
    copy = tmp_path / "run"
    shutil.copytree(const, copy)
    # Everything but the epochs comes from copy/config.yaml (the scheduler included).
    assert cli.main(["train", "--out", str(copy), "--resume", "--epochs", "3"]) == 0
    old = json.loads((const / "history.json").read_text())
    new = json.loads((copy / "history.json").read_text())
    assert len(new) == 3 and [h["train_loss"] for h in new[:2]] == [h["train_loss"] for h in old]
    cfg = yaml.safe_load((copy / "config.yaml").read_text())
    assert cfg["epochs"] == 3 and cfg["scheduler"] is None


def test_train_resume_for_more_epochs_after_a_cosine_schedule_is_refused(run, tmp_path, capsys):
    """The run finished its 2-epoch cosine: 3 epochs would climb the rate back up.
    One error line naming last.pt and both counts; the folder is left as it was."""
    from _tiny_run import one_line_error

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    code = cli.main(["train", "--out", str(copy), "--resume", "--epochs", "3"])
    captured = capsys.readouterr()
    assert code == 2 and one_line_error(captured.err) and captured.out == ""
    assert f"{copy / 'last.pt'}: the run was started for 2 epochs (2 done)" in captured.err
    assert "cannot be resumed for 3 epochs; resume it with 2 epochs" in captured.err
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_geometry_only_training(data, tmp_path):
    files, samples, shapes, dim = cli.load_folder(data, [], ["g"], torch.float32)
    assert len(samples) == 8 and all(s.x.shape == (s.pos.shape[0], 0) for s in samples)
    assert shapes == {"g": [2]} and dim == 2
    out = tmp_path / "geo"
    assert cli.main(["train", "--data", str(data), "--inputs", "", "--targets", "g",
                     "--model", "galerkin_transformer", "--model-config", "width=16",
                     "layers=1", "heads=2", "--epochs", "1", "--val-fraction", "0",
                     "--out", str(out)]) == 0
    model = NeuralOperator.from_checkpoint(out / "best.pt")  # no validation: the last model
    assert model.config["in_channels"] == 0 and model.config["out_channels"] == 2
    assert model.metadata["inputs"] == [] and model.metadata["split"]["val"] == []
    assert cli.main(["predict", str(out), str(data / "s1.vtu"), "-o", str(tmp_path / "p")]) == 0
    mesh = read_mesh(tmp_path / "p" / "s1.vtu")
    assert mesh.fields["g_pred"].shape == (mesh.pos.shape[0], 2)
    from meshops.mesh.data import MeshData

    n = mesh.pos.shape[0]
    expected = model.predict(MeshData(pos=mesh.pos.float(), weight=mesh.weight.float(),
                                      x=torch.zeros(n, 0)))
    torch.testing.assert_close(mesh.fields["g_pred"], expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- configs
def test_config_files_resolve_like_flags(data, tmp_path, capsys):
    flags = ["--data", str(data), "--inputs", "f", "--targets", "u", "--model",
             "transformer_no", "--model-config", "width=16", "layers=1", "heads=2",
             "--epochs", "5", "--batch-size", "2", "--lr", "0.003", "--val-fraction", "0.25",
             "--no-quadrature-loss", "--out", str(tmp_path / "r")]
    (tmp_path / "c.yaml").write_text(
        f"data: {data}\ninputs: f\ntargets: [u]\nmodel: transformer_no\n"
        "model_config: {width: 16, layers: 1, heads: 2}\nepochs: 5\nbatch-size: 2\n"
        f"lr: 3e-3\nval_fraction: 0.25\nquadrature_loss: false\nout: {tmp_path / 'r'}\n")
    (tmp_path / "c.toml").write_text(
        f'data = "{data}"\ninputs = ["f"]\ntargets = ["u"]\nmodel = "transformer_no"\n'
        f'epochs = 5\nbatch_size = 2\nlr = 0.003\nval_fraction = 0.25\n'
        f'quadrature_loss = false\nout = "{tmp_path / "r"}"\n'
        "[model_config]\nwidth = 16\nlayers = 1\nheads = 2\n")
    resolved = []
    for argv in (flags, ["--config", str(tmp_path / "c.yaml")],
                 ["--config", str(tmp_path / "c.toml")]):
        assert cli.main(["train", "--dry-run", *argv]) == 0
        resolved.append(yaml.safe_load(capsys.readouterr().out))
    assert resolved[0] == resolved[1] == resolved[2]
    assert resolved[0]["lr"] == 0.003 and resolved[0]["quadrature_loss"] is False
    assert resolved[0]["model_config"]["width"] == 16 and not (tmp_path / "r").exists()
    # Flags override the file, model_config key by key.
    val = shutil.copytree(data, tmp_path / "val")
    assert cli.main(["train", "--dry-run", "--config", str(tmp_path / "c.yaml"), "--epochs", "7",
                     "--model-config", "layers=2", "--val-data", str(val)]) == 0
    over = yaml.safe_load(capsys.readouterr().out)
    assert over["epochs"] == 7 and over["model_config"]["layers"] == 2
    assert over["model_config"]["width"] == 16
    assert over["val_data"] == str(val) and over["val_fraction"] is None
    # Unknown keys are errors naming the key.
    (tmp_path / "bad.yaml").write_text(f"data: {data}\nepoch: 3\n")
    code, err = _errors_of(capsys, ["train", "--config", str(tmp_path / "bad.yaml")])
    assert code == 2 and "unknown key 'epoch'" in err and "'epochs'" in err
    code, err = _errors_of(capsys, ["train", "--dry-run", *flags[:6], "--model",
                                    "transformer_no", "--model-config", "widht=8"])
    assert code == 2 and "'widht'" in err and "transformer_no" in err


# ----------------------------------------------------------------------- predict
def test_predict_writes_fields_equal_to_model_predict(run, data, tmp_path):
    legacy = tmp_path / "in" / "legacy.vtk"  # another format: written back as .vtk
    legacy.parent.mkdir()
    mesh = read_mesh(data / "s2.vtu")
    del mesh.fields["g"]  # a 2-vector: legacy VTK cannot hold it (test_field_formats.py)
    write_mesh(legacy, mesh)
    out = tmp_path / "pred"
    assert cli.main(["predict", str(run), str(data / "s1.vtu"), str(legacy), "-o",
                     str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["legacy.vtk", "s1.vtu"]
    model = NeuralOperator.from_checkpoint(run / "best.pt")
    for src, dst in ((data / "s1.vtu", out / "s1.vtu"), (legacy, out / "legacy.vtk")):
        mesh, res = read_mesh(src), read_mesh(dst)
        n = mesh.pos.shape[0]
        assert res.fields["u_pred"].shape == (n,)
        for k in mesh.fields:
            assert torch.equal(res.fields[k], mesh.fields[k])
        assert torch.equal(res.pos, mesh.pos)
        torch.testing.assert_close(res.fields["u_pred"], _model_predict(model, mesh)[:, 0],
                                   rtol=1e-5, atol=1e-6)
    # --format, and the checkpoint path given directly
    assert cli.main(["predict", str(run / "best.pt"), str(legacy), "-o", str(out),
                     "--format", "vtu"]) == 0
    assert "u_pred" in meshio.read(out / "legacy.vtu").point_data


# ---------------------------------------------------------------------- evaluate
def test_evaluate_json_matches_relative_l2_of_predictions(run, data, tmp_path, capsys):
    png = tmp_path / "eval.png"
    assert cli.main(["evaluate", str(run), "--data", str(data), "--json", "--plot",
                     str(png)]) == 0
    res = json.loads(capsys.readouterr().out)
    model = NeuralOperator.from_checkpoint(run / "best.pt")
    files = sorted(data.iterdir(), key=lambda p: int(p.stem[1:]))
    weighted, plain = [], []
    for f in files:
        mesh = read_mesh(f)
        pred = _model_predict(model, mesh)[:, 0].double().numpy()
        truth = mesh.fields["u"].numpy()
        weighted.append(_rel_l2(pred, truth, mesh.weight.numpy()))
        plain.append(_rel_l2(pred, truth, np.ones(len(truth))))
    assert res["n"] == 8 and [s["file"] for s in res["samples"]] == [f.name for f in files]
    for key, ref in (("l2", weighted), ("l2_unweighted", plain)):
        st = res["fields"]["u"][key]
        assert st["mean"] == pytest.approx(np.mean(ref), rel=1e-5)
        assert st["median"] == pytest.approx(np.median(ref), rel=1e-5)
        assert st["max"] == pytest.approx(max(ref), rel=1e-5)
        assert st["worst_sample"] == files[int(np.argmax(ref))].name
    assert [s["u"]["l2"] for s in res["samples"]] == pytest.approx(weighted, rel=1e-5)
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The text table shows the same numbers.
    assert cli.main(["evaluate", str(run), "--data", str(data)]) == 0
    text = capsys.readouterr().out
    assert f"{np.mean(weighted):.4e}" in text and files[int(np.argmax(weighted))].name in text


# -------------------------------------------------------------------------- plot
def _check_png(path):
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 400
    rgb = (img[..., :3] * 255).astype(np.int64).reshape(-1, 3)
    colours = np.unique(rgb[:, 0] * 65536 + rgb[:, 1] * 256 + rgb[:, 2])
    assert len(colours) > 50 and float(img[..., :3].std()) > 0.05
    return img


def test_plot_prediction_png(run, data, tmp_path, capsys):
    assert cli.main(["predict", str(run), str(data / "s3.vtu"), "-o", str(tmp_path)]) == 0
    png = tmp_path / "s3.png"
    assert cli.main(["plot", str(tmp_path / "s3.vtu"), "--field", "u", "-o", str(png)]) == 0
    cmp_img = _check_png(png)
    assert not list(tmp_path.glob(".*.tmp*"))  # the atomic write left nothing behind
    assert cli.main(["plot", str(tmp_path / "s3.vtu"), "--truth", "u", "--pred", "u_pred",
                     "-o", str(tmp_path / "b.png")]) == 0
    assert np.array_equal(_check_png(tmp_path / "b.png"), cmp_img)
    assert cli.main(["plot", str(tmp_path / "s3.vtu"), "--field", "f,g", "-o",
                     str(tmp_path / "c.png")]) == 0
    assert _check_png(tmp_path / "c.png").shape[1] < cmp_img.shape[1]  # 2 panels, not 3
    code, err = _errors_of(capsys, ["plot", str(tmp_path / "s3.vtu"), "--field", "w", "-o",
                                    str(tmp_path / "d.png")])
    assert code == 2 and "s3.vtu" in err and "'w'" in err and not (tmp_path / "d.png").exists()


def test_triangulation_of_quads_and_clouds(tmp_path):
    from meshops.inference.plot import plot_comparison, plot_fields, triangulate
    from meshops.mesh.data import MeshData

    pts, cells = square_mesh(3, "mixed")
    mesh = mesh_from_arrays(pts, cells)
    n_quads = sum(len(c) for t, c in cells if t == "quad")
    n_tris = sum(len(c) for t, c in cells if t == "triangle")
    tri = triangulate(mesh)
    assert len(tri.triangles) == 2 * n_quads + n_tris
    # Quads split into two triangles cover the same area.
    p = pts[tri.triangles]
    a, b = p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]
    area = 0.5 * np.abs(a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]).sum()
    assert area == pytest.approx(1.0)
    # A point cloud with a hole: Delaunay triangles across the hole are masked.
    g = np.stack(np.meshgrid(np.linspace(0, 1, 30), np.linspace(0, 1, 30)), -1).reshape(-1, 2)
    g = g[np.linalg.norm(g - 0.5, axis=1) > 0.25]
    cloud = MeshData(pos=torch.from_numpy(g), weight=torch.ones(len(g)) / len(g))
    tri = triangulate(cloud)
    kept = tri.triangles[~tri.mask]
    centroids = g[kept].mean(1)
    assert tri.mask.any() and (np.linalg.norm(centroids - 0.5, axis=1) > 0.2).all()
    ring = np.linalg.norm(g[tri.triangles].mean(1) - 0.5, axis=1) > 0.3
    assert not tri.mask[ring].any()  # the solid part is not thinned out
    u = np.sin(3 * g[:, 0]) * g[:, 1]
    _check_png(plot_comparison(cloud, u, u + 0.1 * g[:, 0], tmp_path / "cloud.png"))
    # 3-D: a scatter of a volume mesh
    cpts, ccells = cube_mesh(2)
    vol = mesh_from_arrays(cpts, ccells)
    plot_fields(vol, [cpts[:, 0], cpts[:, 2]], ["x", "z"], tmp_path / "vol.png")
    assert (tmp_path / "vol.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------ errors
def test_errors_name_the_file(run, data, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = _errors_of(capsys, ["train", "--data", str(empty), "--inputs", "f",
                                    "--targets", "u", "--out", str(tmp_path / "r")])
    assert code == 2 and err.startswith("meshops: error:") and str(empty) in err
    assert "no mesh files" in err

    # One file lacks the input field.
    broken = _write_dataset(tmp_path / "broken", 4)
    m = _sample(2)
    m.fields = {k: v for k, v in m.fields.items() if k != "f"}
    write_mesh(broken / "s2.vtu", m)
    code, err = _errors_of(capsys, ["train", "--data", str(broken), "--inputs", "f",
                                    "--targets", "u", "--out", str(tmp_path / "r")])
    assert code == 2 and "s2.vtu" in err and "'f'" in err and not (tmp_path / "r").exists()

    # Field shapes that differ between files.
    m = _sample(3)
    m.fields["f"] = torch.stack([m.fields["f"], m.fields["f"]], 1)
    write_mesh(broken / "s2.vtu", m)
    code, err = _errors_of(capsys, ["train", "--data", str(broken), "--inputs", "f",
                                    "--targets", "u", "--out", str(tmp_path / "r")])
    assert code == 2 and "s2.vtu" in err and "2/1 channels" in err

    # predict: a mesh without the input field; a vector where the model took a scalar;
    # a 3-D mesh for a 2-D model.
    code, err = _errors_of(capsys, ["predict", str(run), str(broken / "s0.vtu"),
                                    str(broken / "s2.vtu"), "-o", str(tmp_path / "p")])
    assert code == 2 and "s2.vtu" in err and "'f'" in err and "scalar" in err
    nof = tmp_path / "nof.vtu"
    m = _sample(1)
    m.fields = {"u": m.fields["u"]}
    write_mesh(nof, m)
    code, err = _errors_of(capsys, ["predict", str(run), str(nof), "-o", str(tmp_path / "p")])
    assert code == 2 and "nof.vtu" in err and "input field 'f' not found" in err
    cpts, ccells = cube_mesh(2)
    write_mesh(tmp_path / "cube.vtu", mesh_from_arrays(cpts, ccells, {"f": cpts[:, 0]}))
    code, err = _errors_of(capsys, ["predict", str(run), str(tmp_path / "cube.vtu"), "-o",
                                    str(tmp_path / "p")])
    assert code == 2 and "cube.vtu" in err and "3-D" in err and "2-D" in err
    # a run folder without a checkpoint, and a file that is not a checkpoint
    code, err = _errors_of(capsys, ["predict", str(empty), str(nof), "-o", str(tmp_path / "p")])
    assert code == 2 and "best.pt" in err
    code, err = _errors_of(capsys, ["predict", str(nof), str(nof), "-o", str(tmp_path / "p")])
    assert code == 2 and "nof.vtu" in err

    # evaluate on data with other targets (v instead of u)
    other = tmp_path / "other"
    other.mkdir()
    for k in range(2):
        m = _sample(k)
        m.fields = {"f": m.fields["f"], "v": m.fields["u"]}
        write_mesh(other / f"o{k}.vtu", m)
    code, err = _errors_of(capsys, ["evaluate", str(run), "--data", str(other)])
    assert code == 2 and "o0.vtu" in err and "'u'" in err
    code, err = _errors_of(capsys, ["evaluate", str(run), "--data", str(other), "--targets", "v"])
    assert code == 2 and "best.pt" in err and "targets u" in err
