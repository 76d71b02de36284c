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

from meshops.mesh.io import mesh_from_arrays, write_mesh

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
    assert f"{run}: already holds a fitted reduced basis (best.pt)" in err
    assert "--overwrite" in err and "--resume" not in err
    assert folder_bytes(run) == before
    code, _, err = run_cli(capsys, ["train", "--out", run, "--resume"])
    assert code == 2 and one_line_error(err), err
    assert "holds a fitted reduced basis (best.pt) and a reduced basis is fitted in one " \
           "go, there is nothing to resume" in err
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
    assert code == 2 and "already holds a fitted reduced basis (best.pt)" in err, err
    assert folder_bytes(tmp_path / "plain") == before


# ------------------------------------------------------------ one run at a time
def _hold_lock(out: Path):
    """Another process holding the run folder's lock until its stdin closes."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from meshops.runs.run_folder import run_lock\n"
            "with run_lock(Path(sys.argv[1])):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_on_a_locked_run_folder_is_refused(tmp_path, capsys):
    """The issue's case: a run (seed 0) still training, and the same folder trained again
    with --overwrite and seed 7. The second is refused, naming the folder and the pid of
    the first, and touches nothing; once the first has ended the folder is free."""
    data, run = write_study(tmp_path / "data"), tmp_path / "run"
    code, _, err = run_cli(capsys, reduced_args(data, run))
    assert code == 0, err
    before = folder_bytes(run)
    holder = _hold_lock(run)
    try:
        code, out, err = run_cli(capsys, reduced_args(data, run, "--overwrite", "--seed", "7"))
        assert code == 2 and one_line_error(err) and out == "", err
        assert f"{run}: another meshops train (pid {holder.pid}) is writing this run " \
               f"folder" in err
        assert {k: v for k, v in folder_bytes(run).items() if not k.startswith(".")} == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert folder_bytes(run) == before      # the holder leaves no lock file behind
    code, _, err = run_cli(capsys, reduced_args(data, run, "--overwrite", "--seed", "7"))
    assert code == 0, err
    assert sorted(p.name for p in run.iterdir()) == ["best.pt", "config.yaml", "history.json"]


def test_sigterm_leaves_a_resumable_run_and_no_stray_files(tmp_path):
    """Issue 38, item 12: SIGTERM (kill, Slurm) ended meshops train without cleaning up:
    the run folder's lock (and a temporary file) stayed, where Ctrl-C removes them.
    Now it ends as Ctrl-C does (exit 143) and --resume continues the run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import torch
    from _folders import SMALL, write_folder
    from _procs import kill_group

    data, out = write_folder(tmp_path / "data"), tmp_path / "run"
    argv = [sys.executable, "-m", "meshops", "train", "--data", str(data), *SMALL,
            "--scheduler", "none", "--logger", "none", "--threads", "1", "--out", str(out)]
    argv[argv.index("--epochs") + 1] = "100000"  # stopped by the signal long before
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "last.pt").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "no last.pt within 120 s"
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().endswith("meshops: terminated (SIGTERM)"), err
    left = sorted(p.name for p in out.iterdir())
    assert set(left) <= {"config.yaml", "best.pt", "last.pt", "history.json"}, left
    assert "last.pt" in left
    epoch = torch.load(out / "last.pt", weights_only=False)["training"]["epoch"]
    code = subprocess.run(argv[:argv.index("--epochs") + 1] + [str(epoch + 1)]
                          + argv[argv.index("--epochs") + 2:] + ["--resume"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert code.returncode == 0, code.stderr
    assert f"resumed from {out / 'last.pt'} after epoch {epoch}" in code.stdout
    assert sorted(p.name for p in out.iterdir()) == ["best.pt", "config.yaml",
                                                     "history.json", "last.pt"]


def test_a_refused_run_on_a_new_folder_leaves_no_folder(tmp_path, capsys):
    """The lock is taken in a folder made for it; a run refused after that (here: its
    data is no parametric study) removes the folder again."""
    data = write_study(tmp_path / "data")
    out = tmp_path / "new" / "run"
    code, _, err = run_cli(capsys, ["train", "--data", data, "--inputs", "", "--targets", "u",
                                    "--model", "reduced_basis", "--out", out])
    assert code == 2 and one_line_error(err) and "needs a parametric study" in err, err
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------ rollout folders
@pytest.fixture(scope="module")
def heat_run(tmp_path_factory):
    """Four heat series (numbered files in folders s00/ .. s03/) and a series run of one
    epoch trained on them."""
    import torch
    from _series import series_params, write_heat_series

    from meshops import cli

    root = tmp_path_factory.mktemp("heat")
    write_heat_series(root / "train", series_params(4), steps=5, fmt="folder")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = cli.main(["train", "--series", "--data", str(root / "train"), "--inputs", "",
                         "--targets", "u", "--params", "kappa,a", "--model", "transformer_no",
                         "--model-config", "width=8", "layers=1", "heads=2", "--epochs", "1",
                         "--out", str(root / "run")])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    return root


def test_a_rollout_never_deletes_a_folder_it_did_not_write(heat_run, tmp_path, capsys):
    """``-o`` the folder of the series itself: DIR/s00/ is the input series; and a user's
    folder DIR/s01/ beside an earlier DIR/s01.pvd. Neither is deleted, --overwrite or
    not; a rollout's own earlier output is replaced with --overwrite."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(heat_run / "train", data)
    run = heat_run / "run"
    before = folder_bytes(data)
    for extra in ([], ["--overwrite"]):
        code, out, err = run_cli(capsys, ["predict", run, data / "s00", "--rollout", "2",
                                          "-o", data, *extra])
        assert code == 2 and one_line_error(err) and out == "", err
        assert f"{data / 's00'}: holds the input series {data / 's00'}" in err
        assert folder_bytes(data) == before
    mine = tmp_path / "mine"
    (mine / "s01").mkdir(parents=True)
    (mine / "s01" / "notes.txt").write_text("mine")
    (mine / "s01.pvd").write_text("an earlier file")
    for extra in ([], ["--overwrite"]):
        code, _, err = run_cli(capsys, ["predict", run, data / "s01", "--rollout", "2",
                                        "-o", mine, *extra])
        assert code == 2 and one_line_error(err), err
        assert f"{mine / 's01'}: holds files that predict did not write (notes.txt)" in err
        assert (mine / "s01" / "notes.txt").read_text() == "mine"
    # An earlier rollout: replaced only with --overwrite.
    out = tmp_path / "rollouts"
    args = ["predict", run, data / "s02", "--rollout", "2", "-o", out]
    assert run_cli(capsys, args)[0] == 0
    code, _, err = run_cli(capsys, args)
    assert code == 2 and f"{out / 's02.pvd'}: already exists" in err, err
    code, _, err = run_cli(capsys, args + ["--overwrite"])
    assert code == 0, err
    assert sorted(p.name for p in (out / "s02").iterdir()) == [f"s02_000{k}.vtu"
                                                               for k in range(3)]
