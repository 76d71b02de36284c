"""Nothing the user has is replaced without being asked (issue 20, items 7 and 8):
``predict -o DIR`` refuses to replace a file it did not write, ``train --out`` refuses a
non-empty folder that is not a run of the same config, and neither touches anything
before refusing; ``--overwrite`` allows it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _folders import data, folder_bytes, run, run_cli, sample, train  # noqa: F401 (fixtures)
from _tiny_run import one_line_error

from meshops.mesh.io import read_mesh, write_mesh
from meshops.models import NeuralOperator

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------- predict
def test_predict_does_not_replace_a_file_it_did_not_write(run, tmp_path, capsys):
    """The issue's case: a.vtk predicted with --format .vtu into the folder that holds
    the ground truth a.vtu."""
    folder = tmp_path / "case"
    folder.mkdir()
    write_mesh(folder / "a.vtu", sample(0))
    write_mesh(folder / "a.vtk", sample(1))
    before = folder_bytes(folder)
    code, out, err = run_cli(capsys, ["predict", run, folder / "a.vtk", "-o", folder,
                                      "--format", ".vtu"])
    assert code == 2 and one_line_error(err) and out == "", err
    assert f"{folder / 'a.vtu'}: exists; predict does not replace files" in err
    assert "--overwrite" in err
    assert folder_bytes(folder) == before
    code, _, err = run_cli(capsys, ["predict", run, folder / "a.vtk", "-o", folder,
                                    "--format", ".vtu", "--overwrite"])
    assert code == 0, err
    assert "u_pred" in read_mesh(folder / "a.vtu").fields


def test_predict_checks_every_file_before_writing_any(run, data, tmp_path, capsys):
    out = tmp_path / "pred"
    out.mkdir()
    (out / "s3.vtu").write_text("the user's own file")
    code, _, err = run_cli(capsys, ["predict", run, data, "-o", out])
    assert code == 2 and f"{out / 's3.vtu'}: exists" in err
    assert sorted(p.name for p in out.iterdir()) == ["s3.vtu"]
    assert (out / "s3.vtu").read_text() == "the user's own file"
    # an empty output folder, or a new one, is no problem
    code, _, err = run_cli(capsys, ["predict", run, data, "-o", tmp_path / "new"])
    assert code == 0, err


# ------------------------------------------------------------------------- train
def test_train_refuses_a_folder_with_a_hand_written_config(data, tmp_path, capsys,
                                                           monkeypatch):
    """The issue's case: ``train --config config.yaml --out .`` in the folder of that
    hand-written config.yaml."""
    monkeypatch.chdir(tmp_path)
    text = (f"data: {data}\ninputs: [f]\ntargets: [u]\nmodel: transformer_no\n"
            "model_config: {width: 8, layers: 1, heads: 2}\nepochs: 1\nbatch_size: 2\n")
    Path("config.yaml").write_text(text)
    code, _, err = run_cli(capsys, ["train", "--config", "config.yaml", "--out", "."])
    assert code == 2 and one_line_error(err), err
    assert "the folder is not empty (config.yaml) and is not a meshops run" in err
    assert Path("config.yaml").read_text() == text and sorted(Path(".").iterdir()) == [
        Path("config.yaml")]


def test_train_refuses_a_folder_of_otherfolder_bytes(data, tmp_path, capsys):
    out = tmp_path / "results"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = train(capsys, data, out)
    assert code == 2 and "(notes.txt) and is not a meshops run" in err
    assert folder_bytes(out) == {"notes.txt": b"mine"}
    code, _, err = train(capsys, data, out, "--overwrite")
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine" and (out / "best.pt").is_file()


def test_train_never_replaces_the_best_pt_of_another_run(run, data, tmp_path, capsys):
    """A run folder whose last.pt was deleted, and a new run of another config."""
    old = tmp_path / "old"
    shutil.copytree(run, old)
    (old / "last.pt").unlink()
    before = folder_bytes(old)
    code, _, err = train(capsys, data, old, "--seed", "7")
    assert code == 2 and one_line_error(err), err
    assert "holds a meshops run of another config (seed: 0 there, 7 now)" in err
    assert folder_bytes(old) == before
    # the same config again (a relaunch): allowed
    code, _, err = train(capsys, data, old)
    assert code == 0, err
    assert NeuralOperator.from_checkpoint(old / "best.pt").metadata["train_config"]["seed"] == 0
    # --overwrite: a new config replaces the run, and leaves none of the old one behind
    (old / "best.pt").write_bytes(b"stale")
    code, _, err = train(capsys, data, old, "--seed", "7", "--overwrite")
    assert code == 0, err
    assert NeuralOperator.from_checkpoint(old / "best.pt").metadata["train_config"]["seed"] == 7


def test_train_over_a_run_with_last_pt_names_resume_and_overwrite(run, data, tmp_path,
                                                                  capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    before = folder_bytes(copy)
    code, _, err = train(capsys, data, copy)
    assert code == 2 and "pass --resume to continue it, --overwrite to replace it" in err
    assert folder_bytes(copy) == before
