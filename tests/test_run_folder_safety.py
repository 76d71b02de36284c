"""The run folder and the output folders are the user's (issue 28, lost data): a finished
run of any model is not replaced without ``--overwrite``, two runs never write one
folder at the same time, and ``predict --rollout`` deletes no folder it did not
write."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _folders import folder_bytes, run_cli
from _meshes import square_mesh
from _tiny_run import one_line_error

from meshops.io import mesh_from_arrays, write_mesh

pytestmark = pytest.mark.usefixtures("one_thread")


def write_study(root: Path, n: int = 12, seed: int = 0) -> Path:
    """A parametric study on one mesh: constant inputs a, b and a target u(x; a, b)."""
    root.mkdir(parents=True, exist_ok=True)
    pts, cells = square_mesh(6, "triangle")
    x, y = pts[:, 0], pts[:, 1]
    for k, (a, b) in enumerate(np.random.default_rng(seed).uniform([0.5, -1], [2, 1], (n, 2))):
        u = np.exp(-a * x) * np.sin(np.pi * y) + b * x * y
        write_mesh(root / f"s{k:02d}.vtu", mesh_from_arrays(
            pts, cells, {"a": np.full(len(pts), a), "b": np.full(len(pts), b), "u": u}))
    return root


def reduced_args(data: Path, out: Path, *extra) -> list:
    """``meshops train`` of a reduced basis with the spline alone (a second)."""
    return ["train", "--data", data, "--inputs", "a,b", "--targets", "u",
            "--model-config", "regressors=rbf", "--out", out, *extra]


# ------------------------------------------------------------ a finished run
def test_the_same_train_again_does_not_replace_a_finished_reduced_basis(tmp_path, capsys):
    """A reduced basis writes no last.pt; its best.pt is a finished run all the same."""
    data, run = write_study(tmp_path / "data"), tmp_path / "run"
    code, _, err = run_cli(capsys, reduced_args(data, run))
    assert code == 0, err
    before = folder_bytes(run)
    code, out, err = run_cli(capsys, reduced_args(data, run))
    assert code == 2 and one_line_error(err) and out == "", err
    assert f"{run}: already holds a trained model (best.pt)" in err
    assert "--overwrite" in err and "--resume" not in err
    assert folder_bytes(run) == before
    code, _, err = run_cli(capsys, reduced_args(data, run, "--overwrite"))
    assert code == 0, err
    # Without --model-config (the config recorded and the one given agree): the same.
    plain = ["train", "--data", data, "--inputs", "a,b", "--targets", "u", "--minutes",
             "0.02", "--out", tmp_path / "plain"]
    code, _, err = run_cli(capsys, plain)
    assert code == 0, err
    before = folder_bytes(tmp_path / "plain")
    code, _, err = run_cli(capsys, plain)
    assert code == 2 and "already holds a trained model (best.pt)" in err, err
    assert folder_bytes(tmp_path / "plain") == before
