"""Parameters as a run records and reads them (issue 28): a cached sample follows the
values in params.csv, not only its column names; a run's fingerprint covers the
parameter files (and, for a time-series run, every file of every series), so that
``--resume`` refuses edited or added data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import square_mesh

from meshops.datasets.layout import SampleLayout
from meshops.mesh.io import mesh_from_arrays, write_mesh

pytestmark = pytest.mark.usefixtures("one_thread")


def write_param_folder(root: Path, values: dict, n: int = 4) -> Path:
    """``n`` meshes s0.vtu.. with a target u and ``root/params.csv`` of ``values``
    (``{name: [one value per file]}``)."""
    root.mkdir(parents=True, exist_ok=True)
    pts, cells = square_mesh(4, "triangle")
    for k in range(n):
        u = np.sin(np.pi * pts[:, 0]) * (1 + k) + pts[:, 1]
        write_mesh(root / f"s{k}.vtu", mesh_from_arrays(pts, cells, {"u": u}))
    write_params(root, values, n)
    return root


def write_params(root: Path, values: dict, n: int = 4) -> None:
    lines = ["file," + ",".join(values)] + [
        f"s{k}.vtu," + ",".join(repr(float(v[k])) for v in values.values()) for k in range(n)]
    (root / "params.csv").write_text("\n".join(lines) + "\n")


# -------------------------------------------------------------------- the cache
def test_a_cached_sample_follows_the_values_of_params_csv(tmp_path):
    """The cache key held the parameter names: after an edit of params.csv the cache
    gave the old values."""
    from meshops.datasets.lazy import load_folder_cached

    data = write_param_folder(tmp_path / "data", {"a": [1, 2, 3, 4]})

    def params():
        layout = SampleLayout([], ["u"], ["a"])
        _, ds, _, _ = load_folder_cached(data, [], ["u"], torch.float64, layout=layout,
                                         cache=tmp_path / "cache")
        return [float(ds[i].params) for i in range(len(ds))]

    assert params() == [1, 2, 3, 4]
    write_params(data, {"a": [1, 2, 30, 4]})
    assert params() == [1, 2, 30, 4]


# ------------------------------------------------------------ fingerprints
SMALL = ["--model", "transformer_no", "--model-config", "width=8", "layers=1", "heads=2",
         "--batch-size", "2", "--scheduler", "none"]


def test_resume_refuses_an_edited_parameter_file(tmp_path, capsys):
    """The run's fingerprint covered the mesh files only: --resume went on with the new
    values of an edited params.csv (here of the same size)."""
    from _folders import folder_bytes, run_cli
    from _tiny_run import one_line_error

    data = write_param_folder(tmp_path / "data", {"a": [1, 2, 3, 4]})
    run = tmp_path / "run"
    argv = ["train", "--data", data, "--inputs", "", "--targets", "u", "--params", "a",
            *SMALL, "--val-fraction", "0.25", "--out", run]
    code, _, err = run_cli(capsys, argv + ["--epochs", "1"])
    assert code == 0, err
    write_params(data, {"a": [1, 2, 5, 4]})
    before = folder_bytes(run)
    code, out, err = run_cli(capsys, argv + ["--epochs", "2", "--resume"])
    assert code == 2 and one_line_error(err), err
    assert "the data behind this run changed since it was trained (params.csv: content " \
           "changed)" in err
    assert folder_bytes(run) == before
    # evaluate's baselines, fitted on the training samples, are not fitted on others
    code, out, err = run_cli(capsys, ["evaluate", run, "--data", data, "--json"])
    assert code == 0, err
    notes = [b["note"] for b in json.loads(out)["baselines"].values()]
    assert notes and all("params.csv: content changed" in n for n in notes), notes
    write_params(data, {"a": [1, 2, 3, 4]})            # restored: the run goes on
    code, _, err = run_cli(capsys, argv + ["--epochs", "2", "--resume"])
    assert code == 0, err


def test_a_series_run_records_and_checks_its_files(tmp_path, capsys):
    """Series runs recorded no fingerprint: after a series was added, --resume redrew
    the split. Now an added series, an edited step and an edited params.csv are each
    refused, naming the file."""
    from _folders import run_cli
    from _series import series_params, write_heat_series
    from _tiny_run import one_line_error

    from meshops.models import NeuralOperator

    data, run = tmp_path / "data", tmp_path / "run"
    write_heat_series(data, series_params(4), steps=4, fmt="folder")
    argv = ["train", "--series", "--data", data, "--inputs", "", "--targets", "u",
            "--params", "kappa,a", *SMALL, "--val-fraction", "0.25", "--out", run]
    code, _, err = run_cli(capsys, argv + ["--epochs", "1"])
    assert code == 0, err
    recorded = NeuralOperator.from_checkpoint(run / "best.pt").metadata["data_files"]
    assert sorted(recorded) == ["params.csv"] + [f"s{i:02d}/u_{k:04d}.vtu" for i in range(4)
                                                 for k in range(4)]
    resume = argv + ["--epochs", "2", "--resume"]
    table = (data / "params.csv").read_text()
    def add_series():
        write_heat_series(tmp_path / "more", series_params(1, seed=5), steps=4, fmt="folder",
                          table=False)[0].rename(data / "s04")
        (data / "params.csv").write_text(table + "s04,0.1,1.0\n")

    edits = [
        (add_series, "s04: new series"),
        (lambda: (data / "s01" / "u_0002.vtu").write_bytes(
            (data / "s01" / "u_0003.vtu").read_bytes()), "s01/u_0002.vtu: "),
        (lambda: (data / "params.csv").write_text(table.replace("s02,0.", "s02,1.")),
         "params.csv: content changed"),
    ]
    for edit, named in edits:
        saved = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
        edit()
        code, _, err = run_cli(capsys, resume)
        assert code == 2 and one_line_error(err), err
        assert "the data behind this run changed since it was trained" in err and named in err
        for p in [p for p in data.rglob("*") if p.is_file() and p not in saved]:
            p.unlink()
        for p, content in saved.items():
            p.write_bytes(content)
        if (data / "s04").exists():
            (data / "s04").rmdir()
    code, _, err = run_cli(capsys, resume)
    assert code == 0, err


def test_a_layout_reads_params_csv_again_when_it_changes(tmp_path):
    """Issue 38, item 2: a layout (the one a Run predicts with) kept each folder's
    table, or its absence, for ever: after an edit of params.csv Run.predict gave the
    old values while a new Run gave the new ones."""
    from meshops.errors import MeshError
    from meshops.mesh.io import read_mesh

    data = write_param_folder(tmp_path / "data", {"a": [1, 2, 3, 4]})
    layout = SampleLayout([], ["u"], ["a"])

    def value():
        return float(layout.view(read_mesh(data / "s2.vtu"), data / "s2.vtu").params)

    assert value() == 3.0
    write_params(data, {"a": [1, 2, 30, 4]})
    assert value() == 30.0
    (data / "params.csv").unlink()
    with pytest.raises(MeshError, match="'a'"):
        value()
    write_params(data, {"a": [1, 2, 7, 4]})
    assert value() == 7.0
