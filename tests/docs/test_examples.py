"""The example pipelines end to end in their quick mode, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import meshops
from meshops.models import NeuralOperator
from meshops.training import relative_lp

ROOT = Path(__file__).resolve().parents[2]


def _run_example(script: str, out: Path, cache: Path, *extra: str) -> str:
    """stdout and stderr of the example, redirected to one file (``> log 2>&1``)."""
    env = dict(os.environ, MESHOPS_CACHE=str(cache), MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    log = out.parent / f"{script}.log"
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--quick",
                               "--out", str(out), *extra],
                              cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                              timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-5000:]
    return text


@pytest.mark.parametrize("script, target, inputs, model", [
    ("elasticity.py", "sigma", 1, "pit"),  # the distance to the void; meshes vary
    # the free-stream direction; one C-grid and a parameter vector per sample: a
    # parametric study, so the default is a reduced basis, fitted rather than trained
    ("airfoil.py", "mach", 2, "reduced_basis"),
])
def test_example_quick_run(tmp_path, script, target, inputs, model):
    out = tmp_path / "run"
    stdout = _run_example(script, out, tmp_path / "cache")
    assert "STAND-IN" in stdout and "test relative L2" in stdout
    # Redirected to a file, no progress bars (they redraw with \r: 40 KB in a default
    # run; the stand-in generation, the mesh structures, each epoch): one line per epoch
    # or per candidate regression.
    assert "\r" not in stdout
    assert len(stdout.encode()) < 5_000, stdout
    lines = stdout.splitlines()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == model
    assert summary["num_train"] == 8 and summary["num_test"] == 4
    if model == "pit":
        assert sum(line.startswith("epoch 1/1 ") for line in lines) == 1
        assert summary["epochs"] == 1
    else:
        assert sum(line.startswith("  candidate ") for line in lines) >= 2
        assert summary["epochs"] is None and summary["recipe"]["minutes"] > 0
    errors = [summary[f"test_relative_l2_{k}"] for k in ("mean", "median", "worst")]
    assert all(np.isfinite(e) and e > 0 for e in errors)
    assert errors[1] <= errors[2] + 1e-12

    best = NeuralOperator.from_checkpoint(out / "best.pt")
    assert best.config["in_channels"] == inputs
    assert (out / "test_samples.png").stat().st_size > 10_000
    vtus = sorted((out / "predictions").glob("*.vtu"))
    assert len(vtus) == 4
    # each .vtu holds the truth and the saved model's prediction on that mesh, and
    # their error is the one the summary reports for that sample
    errs = []
    for f in vtus:
        mesh = meshops.read_mesh(f)
        truth, pred = mesh.fields[target], mesh.fields[f"{target}_pred"]
        assert truth.shape == pred.shape == (mesh.pos.shape[0],)
        errs.append(float(relative_lp(pred[:, None], truth[:, None], mesh.weight)))
    assert max(errs) == pytest.approx(summary["test_relative_l2_worst"], rel=1e-4)
    assert float(np.median(errs)) == pytest.approx(summary["test_relative_l2_median"], rel=1e-4)


def test_example_rejects_real_data_without_files(tmp_path):
    env = dict(os.environ, MESHOPS_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "elasticity.py"), "--quick",
                           "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "nowhere: no such folder" in proc.stderr
