"""What a run records about its data, and what it refuses when that data or its options
change (issue 20, items 2, 3 and 6): absolute data paths and a fingerprint of the files
in every checkpoint; ``evaluate`` and ``--resume`` from another folder read the run's
data; a changed file, or a changed option under ``--resume``, is refused naming it;
``--val-data`` that is the training folder is refused, and copies of training files in
it are reported."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from _folders import folder_bytes, run_cli, train, write_folder
from _tiny_run import one_line_error

from meshops.models import NeuralOperator

pytestmark = pytest.mark.usefixtures("one_thread")

# Resumable with another epoch count: no learning-rate schedule.
CONST = ["--scheduler", "none", "--val-fraction", "0.25"]


@pytest.fixture()
def project(tmp_path, monkeypatch, capsys):
    """``a/`` with data/ and a run trained there with the relative --data data (1 epoch),
    and ``b/`` with a data/ of its own (other values)."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_folder(a / "data", n=6)
    write_folder(b / "data", n=6, scale=-3.0, input_scale=0.5)
    monkeypatch.chdir(a)
    code, _, err = train(capsys, Path("data"), Path("run"), *CONST)
    assert code == 0, err
    return a, b


def test_a_run_records_absolute_paths_and_a_fingerprint(project):
    a, _ = project
    meta = NeuralOperator.from_checkpoint(a / "run" / "best.pt").metadata
    assert meta["data"] == str(a / "data")
    assert yaml.safe_load((a / "run" / "config.yaml").read_text())["data"] == str(a / "data")
    import hashlib
    for name in ("s0.vtu", "s5.vtu"):
        size, mtime, sha = meta["data_files"][name]
        path = a / "data" / name
        assert size == path.stat().st_size and mtime == path.stat().st_mtime_ns
        assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sorted(meta["data_files"]) == sorted(p.name for p in (a / "data").iterdir())
    assert meta["train_config"]["batch_size"] == 2


def test_evaluate_from_another_folder_reads_the_runs_training_data(project, monkeypatch,
                                                                    capsys):
    a, b = project
    args = ["evaluate", a / "run", "--data", a / "data", "--json"]
    code, here, err = run_cli(capsys, args)
    assert code == 0, err
    monkeypatch.chdir(b)  # which has a data/ of its own
    code, there, err = run_cli(capsys, args)
    assert code == 0, err
    here, there = json.loads(here), json.loads(there)
    assert there["baselines"] == here["baselines"]
    nearest = there["baselines"]["nearest training sample"]["u"]["l2"]
    assert nearest["median"] == 0.0  # the test files are the training files
    # and evaluate says that they are: by content, wherever they are
    assert "of the 6 files have the content of training files" in here["note"]


def test_resume_from_another_folder_continues_on_the_runs_data(project, monkeypatch,
                                                               capsys):
    a, b = project
    ref = a.parent / "ref"
    shutil.copytree(a / "run", ref)
    code, _, err = run_cli(capsys, ["train", "--out", ref, "--resume", "--epochs", "2"])
    assert code == 0, err
    monkeypatch.chdir(b)
    code, _, err = run_cli(capsys, ["train", "--out", a / "run", "--resume", "--epochs", "2"])
    assert code == 0, err
    got = json.loads((a / "run" / "history.json").read_text())
    want = json.loads((ref / "history.json").read_text())
    assert [h["train_loss"] for h in got] == [h["train_loss"] for h in want]


@pytest.mark.parametrize("change", ["content", "new file", "missing", "touched"])
def test_resume_refuses_a_run_whose_data_changed(project, capsys, change):
    a, _ = project
    data = a / "data"
    before = folder_bytes(a / "run")
    name = NeuralOperator.from_checkpoint(a / "run" / "best.pt").metadata["split"]["train"][0]
    if change == "content":  # a training file
        write_folder(a / "other", n=6, scale=2.0)
        shutil.copy(a / "other" / name, data / name)
    elif change == "new file":
        shutil.copy(data / "s0.vtu", data / "s9.vtu")
    elif change == "missing":
        (data / "s4.vtu").unlink()
    else:  # the same bytes with a new time stamp (a copy): not a change
        os.utime(data / "s2.vtu", ns=(1, 1))
    code, _, err = run_cli(capsys, ["train", "--out", a / "run", "--resume", "--epochs", "2"])
    if change == "touched":
        assert code == 0, err
        return
    assert code == 2 and one_line_error(err), err
    expect = {"content": f"{name}: content changed", "new file": "s9.vtu: new file",
              "missing": "s4.vtu: missing"}[change]
    assert f"{a / 'run' / 'last.pt'}: the data behind this run changed" in err
    assert expect in err
    assert folder_bytes(a / "run") == before
    # the baselines of evaluate say that they cannot be trusted any more
    if change == "content":
        code, out, _ = run_cli(capsys, ["evaluate", a / "run", "--data", data, "--json"])
        note = json.loads(out)["baselines"]["training mean"]["note"]
        assert "changed since the run was trained" in note and name in note


@pytest.mark.parametrize("flags,label", [
    (["--batch-size", "3"], "--batch-size is 3 (the run: 2)"),
    (["--seed", "5"], "--seed is 5 (the run: 0)"),
    (["--val-fraction", "0.5"], "--val-fraction is 0.5 (the run: 0.25)"),
    (["--lr", "0.01"], "--lr is 0.01 (the run: "),
    (["--model-config", "width=16"], "--model-config is width=16 (the run: 8)"),
    (["--dtype", "float64"], "--dtype is float64 (the run: float32)"),
    (["--data", "DATA2"], "--data is "),
    (["--val-data", "DATA2"], "--val-data is "),
])
def test_resume_refuses_every_changed_option_naming_it(project, capsys, flags, label):
    a, b = project
    flags = [str(b / "data") if f == "DATA2" else f for f in flags]
    before = folder_bytes(a / "run")
    code, out, err = run_cli(capsys, ["train", "--out", a / "run", "--resume", *flags])
    assert code == 2 and one_line_error(err) and out == "", err
    assert f"{a / 'run' / 'last.pt'}: --resume continues the run exactly, but {label}" in err
    assert folder_bytes(a / "run") == before


def test_resume_refuses_an_edited_config_yaml_and_allows_device_and_epochs(project, capsys):
    a, _ = project
    cfg = a / "run" / "config.yaml"
    original = cfg.read_text()
    cfg.write_text(original.replace("batch_size: 2", "batch_size: 4"))
    code, _, err = run_cli(capsys, ["train", "--out", a / "run", "--resume"])
    assert code == 2 and f"{cfg}: batch_size is 4 (the run: 2)" in err
    cfg.write_text(original)
    code, _, err = run_cli(capsys, ["train", "--out", a / "run", "--resume", "--device", "cpu",
                                    "--epochs", "2", "--minutes", "3"])
    assert code == 0, err


def test_val_data_that_is_the_training_folder_is_refused(tmp_path, capsys):
    data = write_folder(tmp_path / "data")
    link = tmp_path / "link"
    link.symlink_to(data)
    for val in (data, link, Path(str(data) + "/")):
        code, out, err = train(capsys, data, tmp_path / "run", "--val-data", val)
        assert code == 2 and one_line_error(err), err
        assert "is the training folder --data" in err
        assert not (tmp_path / "run").exists()


def test_val_data_holding_copies_of_training_files_is_reported(tmp_path, capsys):
    data = write_folder(tmp_path / "data")
    val = write_folder(tmp_path / "val", n=2, scale=2.0)
    shutil.copy(data / "s1.vtu", val / "copy.vtu")
    code, _, err = train(capsys, data, tmp_path / "run", "--val-data", val)
    assert code == 0
    assert ("meshops: warning: 1 of the 3 validation files have the same content as "
            "training files (copy.vtu = s1.vtu)") in err
