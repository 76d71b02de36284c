"""The ``meshops`` command on bad field values: NaN/inf in inputs or targets (one-line
error naming file, field and point, exit 2), and targets that are zero everywhere
(relative error undefined: said, and the absolute error reported)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import square_mesh

import meshops.inference.predict
from meshops import cli
from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh
from meshops.models import NeuralOperator

SMALL = ["--model", "transformer_no", "--model-config", "width=8", "layers=1", "heads=2"]


def _sample(k: int, f_edit=None, u_edit=None):
    """Unit square (5 x 5 cells) with input f and target u = f * y + x^2 / 2."""
    pts, cells = square_mesh(5, ("quad", "triangle")[k % 2], amount=0.2, seed=k)
    x, y = pts[:, 0], pts[:, 1]
    f = np.sin((1 + 0.3 * k) * np.pi * x) * np.cos(np.pi * y)
    u = f * y + 0.5 * x ** 2
    if f_edit is not None:
        f = f_edit(f.copy())
    if u_edit is not None:
        u = u_edit(u.copy())
    return mesh_from_arrays(pts, cells, {"f": f, "u": u})


def _set(i, value):
    def edit(a):
        a[i] = value
        return a
    return edit


def _folder(root: Path, n: int = 4, **edits) -> Path:
    """``n`` samples; ``edits`` maps a file index to ``(f_edit, u_edit)``."""
    root.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        fe, ue = edits.get(f"s{k}", (None, None))
        write_mesh(root / f"s{k}.vtu", _sample(k, fe, ue))
    return root


def _run_cli(capsys, argv):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = _folder(tmp_path_factory.mktemp("data"))
    out = tmp_path_factory.mktemp("runs") / "run"
    assert cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u", *SMALL,
                     "--epochs", "1", "--batch-size", "2", "--val-fraction", "0.25",
                     "--out", str(out)]) == 0
    return out


# ------------------------------------------------------------------ non-finite values
def test_predict_refuses_a_nan_input_and_writes_nothing(run, tmp_path, capsys):
    src = _folder(tmp_path / "in", n=2, s1=(_set(17, np.nan), None))
    code, _, err = _run_cli(capsys, ["predict", str(run), str(src / "s0.vtu"),
                                     str(src / "s1.vtu"), "-o", str(tmp_path / "pred")])
    assert code == 2
    assert err == (f"meshops: error: {src / 's1.vtu'}: input field 'f' has a non-finite value "
                   f"(nan) at point 17\n")
    assert not (tmp_path / "pred" / "s1.vtu").exists()


def test_predict_refuses_a_non_finite_prediction(run, tmp_path, capsys, monkeypatch):
    """Finite inputs but a model that predicts NaN (e.g. a damaged checkpoint): an error
    naming the file and point, not a file of NaN with exit 0."""
    src = _folder(tmp_path / "in", n=1)

    def broken(model, spec, mesh):
        out = torch.zeros(mesh.pos.shape[0], 1)
        out[3, 0] = float("nan")
        return out

    monkeypatch.setattr(meshops.inference.predict, "predict_mesh", broken)
    code, _, err = _run_cli(capsys, ["predict", str(run), str(src), "-o", str(tmp_path / "p")])
    assert code == 2 and err.startswith(f"meshops: error: {src / 's0.vtu'}: the model in ")
    assert "predicts a non-finite value (nan) at point 3" in err
    assert not (tmp_path / "p" / "s0.vtu").exists()


def test_evaluate_refuses_an_infinite_target(run, tmp_path, capsys):
    data = _folder(tmp_path / "test", n=3, s2=(None, _set(5, -np.inf)))
    code, out, err = _run_cli(capsys, ["evaluate", str(run), "--data", str(data)])
    assert code == 2 and out == ""
    assert err == (f"meshops: error: {data / 's2.vtu'}: target field 'u' has a non-finite value "
                   f"(-inf) at point 5\n")


def test_train_names_the_file_with_a_nan_input(tmp_path, capsys):
    data = _folder(tmp_path / "data", n=4, s2=(_set(0, np.nan), None))
    out = tmp_path / "run"
    code, _, err = _run_cli(capsys, ["train", "--data", str(data), "--inputs", "f", "--targets",
                                     "u", *SMALL, "--epochs", "1", "--out", str(out)])
    assert code == 2
    assert err == (f"meshops: error: {data / 's2.vtu'}: input field 'f' has a non-finite value "
                   f"(nan) at point 0\n")
    assert not (out / "last.pt").exists()


# ----------------------------------------------------------------- all-zero targets
def _rel(pred, truth, w):
    return np.sqrt(np.sum(w * (pred - truth) ** 2) / np.sum(w * truth ** 2))


def test_evaluate_says_the_relative_error_is_undefined_for_a_zero_target(run, tmp_path,
                                                                          capsys):
    """A test mesh whose target is zero everywhere: a warning naming it, null relative
    errors in the JSON, relative statistics over the other meshes (with the count left
    out), and the quadrature-weighted absolute error sqrt(sum w |pred - u|^2) of every
    mesh."""
    data = _folder(tmp_path / "test", n=3, s1=(None, lambda u: np.zeros_like(u)))
    code, out, err = _run_cli(capsys, ["evaluate", str(run), "--data", str(data), "--json"])
    assert code == 0
    assert (f"meshops: warning: {data / 's1.vtu'}: target 'u' is zero everywhere; its relative "
            f"L2 error is undefined") in err
    res = json.loads(out)
    model = NeuralOperator.from_checkpoint(run / "best.pt")
    rel, absolute = [], []
    for k in range(3):
        mesh = read_mesh(data / f"s{k}.vtu")
        x = mesh.fields["f"].reshape(-1, 1).float()
        from meshops.mesh.data import MeshData
        pred = model.predict(MeshData(pos=mesh.pos.float(), weight=mesh.weight.float(), x=x))
        pred = pred[:, 0].double().numpy()
        truth, w = mesh.fields["u"].double().numpy(), mesh.weight.double().numpy()
        absolute.append(np.sqrt(np.sum(w * (pred - truth) ** 2)))
        rel.append(_rel(pred, truth, w) if k != 1 else None)
    samples = res["samples"]
    assert samples[1]["u"]["l2"] is None and samples[1]["u"]["l2_unweighted"] is None
    assert [s["u"]["abs_l2"] for s in samples] == pytest.approx(absolute, rel=1e-5)
    st = res["fields"]["u"]["l2"]
    assert st["n"] == 2 and st["undefined"] == ["s1.vtu"]
    assert st["mean"] == pytest.approx(np.mean([rel[0], rel[2]]), rel=1e-5)
    assert st["max"] < 1e3  # not the 1/eps of dividing by a clamped zero norm
    assert res["fields"]["u"]["abs_l2"]["mean"] == pytest.approx(np.mean(absolute), rel=1e-5)
    # the table says it too
    code, out, _ = _run_cli(capsys, ["evaluate", str(run), "--data", str(data)])
    assert code == 0
    assert "undefined for 1 of 3 meshes (target zero everywhere: s1.vtu)" in out
    assert "abs. L2 (quad)" in out and f"{np.mean(absolute):.4e}" in out


def test_train_refuses_a_zero_target_naming_the_file(tmp_path, capsys):
    data = _folder(tmp_path / "data", n=4, s3=(None, lambda u: np.zeros_like(u)))
    code, _, err = _run_cli(capsys, ["train", "--data", str(data), "--inputs", "f", "--targets",
                                     "u", *SMALL, "--epochs", "1", "--out", str(tmp_path / "r")])
    assert code == 2
    assert err.startswith(f"meshops: error: {data / 's3.vtu'}: the target field(s) u are zero "
                          f"everywhere") and err.count("\n") == 1
@pytest.mark.parametrize("lazy", [[], ["--lazy"]])
def test_train_refuses_one_zero_target_field_naming_file_and_field(tmp_path, capsys, lazy):
    """Issue 38, item 8: with --targets u,v each is its own field, but the check pooled
    the channels: a v zero in one mesh passed it and the loss raised a traceback.
    Joined as u+v, the mesh's field is not zero and trains."""
    from _folders import SMALL as FOLDER_SMALL
    from _folders import write_folder

    def add_v(k):
        def edit(fields):
            fields["v"] = fields["u"] * 0.0 if k == 3 else fields["u"] + 1.0
        return edit

    data = write_folder(tmp_path / "data", edits={k: add_v(k) for k in range(4)})
    flags = [a for a in FOLDER_SMALL if a not in ("--targets", "u")]
    cache = ["--cache", str(tmp_path / "cache")] if lazy else []
    code, _, err = _run_cli(capsys, ["train", "--data", str(data), *flags, "--targets", "u,v",
                                     *lazy, *cache, "--out", str(tmp_path / "r")])
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"meshops: error: {data / 's3.vtu'}: the target field(s) v are zero "
                          f"everywhere"), err
    assert "join v with the other components" in err
    code, _, err = _run_cli(capsys, ["train", "--data", str(data), *flags, "--targets", "u+v",
                                     *lazy, *cache, "--out", str(tmp_path / "joined")])
    assert code == 0, err


