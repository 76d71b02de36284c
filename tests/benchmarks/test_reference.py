"""The pieces of the side-by-side benchmark against the PiT reference code that run
without the reference's repository: the Geo-FNO file writers (read back by meshops'
adapters), the stand-in conversions, the script patcher and the config mapping."""

import os

import numpy as np
import pytest
import torch

from benchmarks.reference import (
    CASES,
    Case,
    meshops_kwargs,
    patch_script,
    reference_settings,
    step_body,
)
from benchmarks.reference.files import (
    SHAPE_FILE,
    elasticity_arrays_from_standin,
    isentropic_state,
    naca_arrays_from_standin,
    write_elasticity_files,
    write_naca_files,
)
from data_adapters import load_elasticity, load_naca, make_airfoil_standin, make_elasticity_standin
from data_adapters.naca import CHANNELS, Q_FILE, X_FILE, Y_FILE
from data_adapters.standins import void_radius

F64 = torch.float64


def _grids(S=4, n0=9, n1=5):
    """Annular sectors (valid, untangled quads), a different radius per sample."""
    t = np.linspace(0.2, 2.8, n0)[:, None]
    X, Y = np.empty((S, n0, n1)), np.empty((S, n0, n1))
    for s in range(S):
        r = (1 + 0.1 * s) * np.linspace(1.0, 3.0, n1)[None, :]
        X[s], Y[s] = r * np.cos(t), r * np.sin(t)
    rng = np.random.default_rng(0)
    Q = rng.normal(size=(S, 5, n0, n1))
    return X, Y, Q


def test_naca_writer_read_back(tmp_path):
    X, Y, Q = _grids()
    coords = np.random.default_rng(1).normal(size=(4, 7, 2))
    write_naca_files(tmp_path, X, Y, Q, coords)
    data = load_naca(tmp_path, "all", target=["mach", "p"], dtype=F64)
    assert len(data) == 4
    for s, m in enumerate(data):
        assert torch.equal(m.pos, torch.from_numpy(np.stack([X[s].ravel(), Y[s].ravel()], 1)))
        for c, name in enumerate(CHANNELS):
            assert torch.equal(m.fields[name], torch.from_numpy(Q[s, c].ravel()))
        assert torch.equal(m.y, torch.from_numpy(np.stack([Q[s, 4].ravel(), Q[s, 3].ravel()], 1)))
        assert m.grid_shape.tolist() == [[9, 5]]
    assert np.array_equal(np.load(tmp_path / SHAPE_FILE), coords)
    # the split the reference uses: train [:ntrain], test [-ntest:]
    test = load_naca(tmp_path, "test", n_train=3, n_test=1, dtype=F64)
    assert torch.equal(test[0].pos[:, 0], torch.from_numpy(X[-1].ravel()))


def test_naca_writer_rejects_mismatched_arrays_and_writes_nothing(tmp_path):
    X, Y, Q = _grids()
    with pytest.raises(ValueError, match=r"Q must be \(4, 5, 9, 5\)"):
        write_naca_files(tmp_path / "a", X, Y, Q[:, :4])
    with pytest.raises(ValueError, match="X and Y must be"):
        write_naca_files(tmp_path / "b", X, Y[:, :-1], Q)
    with pytest.raises(ValueError, match=r"shape_coords must be \[4, P, 2\]"):
        write_naca_files(tmp_path / "c", X, Y, Q, np.zeros((3, 7, 2)))
    assert not any((tmp_path / d / f).exists() for d in "abc" for f in (X_FILE, Y_FILE, Q_FILE))


def test_elasticity_writer_read_back(tmp_path):
    rng = np.random.default_rng(2)
    S, P = 5, 30
    xy = rng.uniform(0, 1, size=(S, P, 2))
    sigma = rng.normal(size=(S, P))
    rr = rng.uniform(0.2, 0.4, size=(S, 42))
    write_elasticity_files(tmp_path, xy, sigma, rr)
    data = load_elasticity(tmp_path, "all", with_params=True, measure="hull", dtype=F64)
    for s, m in enumerate(data):
        assert torch.equal(m.pos, torch.from_numpy(xy[s]))
        assert torch.equal(m.y[:, 0], torch.from_numpy(sigma[s]))
        assert torch.equal(m.params[0], torch.from_numpy(rr[s]))
    with pytest.raises(ValueError, match=r"rr must be \[5, R\]"):
        write_elasticity_files(tmp_path / "x", xy, sigma, rr[:4])


def test_isentropic_state():
    """Free-stream values at M = M_inf; p = rho^gamma; rho_0 at rest from the
    stagnation temperature ratio T0/T = 1 + (gamma-1)/2 M^2."""
    rho, p = isentropic_state(np.array([0.5, 0.0, 0.9]), 0.5)
    assert rho[0] == pytest.approx(1.0, abs=1e-15) and p[0] == pytest.approx(1.0, abs=1e-15)
    assert np.allclose(p, rho ** 1.4, rtol=1e-14)
    assert rho[1] == pytest.approx(1.05 ** 2.5, rel=1e-14)
    assert rho[2] < 1 < rho[1]


def test_airfoil_standin_to_naca_layout(tmp_path):
    n_side, n_wake, n1 = 21, 8, 12
    samples = make_airfoil_standin(3, seed=0, cache_dir=tmp_path / "cache", progress=False,
                                   dtype=F64, inputs=(), n_side=n_side, n_wake=n_wake, n1=n1,
                                   aoa_range=(0.0, 0.0))
    a = naca_arrays_from_standin(samples, n_wake=n_wake, shape_points=30)
    write_naca_files(tmp_path / "naca", a["X"], a["Y"], a["Q"], a["shape_coords"])
    back = load_naca(tmp_path / "naca", "all", dtype=F64)
    n0 = 2 * n_side - 1 + 2 * n_wake
    for m, s in zip(back, samples):
        assert torch.equal(m.pos, s.pos)
        assert torch.equal(m.y, s.fields["mach"][:, None])
        assert torch.equal(m.fields["u"], s.fields["u"])
        assert m.grid_shape.tolist() == [[n0, n1]]
    coords = np.load(tmp_path / "naca" / SHAPE_FILE)
    assert coords.shape == (3, 30, 2)
    # every shape point is an airfoil surface node (grid line j = 0 between the wakes),
    # the first and last the trailing edge
    surface = np.stack([a["X"][:, n_wake:n0 - n_wake, 0], a["Y"][:, n_wake:n0 - n_wake, 0]], -1)
    d = np.linalg.norm(coords[:, :, None] - surface[:, None], axis=-1).min(-1)
    assert d.max() == 0.0
    assert np.array_equal(coords[:, 0], coords[:, -1])  # the trailing edge, twice
    with pytest.raises(ValueError, match="shape_points=200 > 41 surface nodes"):
        naca_arrays_from_standin(samples, n_wake=n_wake, shape_points=200)


def test_elasticity_standin_to_geofno_layout(tmp_path):
    samples = make_elasticity_standin(2, seed=0, cache_dir=tmp_path / "cache", progress=False,
                                      dtype=F64)
    a = elasticity_arrays_from_standin(samples, num_points=900, seed=0)
    write_elasticity_files(tmp_path / "el", a["xy"], a["sigma"], a["rr"])
    back = load_elasticity(tmp_path / "el", "all", with_params=True, dtype=F64)
    theta = 2 * np.pi * np.arange(42) / 42
    for m, s in zip(back, samples):
        pos = s.pos.numpy()
        assert m.pos.shape == (900, 2)
        # the kept points are nodes of the sample, each with its own stress
        idx = np.linalg.norm(m.pos.numpy()[:, None] - pos[None], axis=-1).argmin(1)
        assert np.array_equal(pos[idx], m.pos.numpy()) and len(set(idx)) == 900
        assert np.array_equal(s.fields["sigma"].numpy()[idx], m.y[:, 0].numpy())
        assert np.allclose(m.params[0].numpy(), void_radius(theta, s.params.numpy().ravel()),
                           rtol=0, atol=0)
    with pytest.raises(ValueError, match="fewer than num_points=5000"):
        elasticity_arrays_from_standin(samples, num_points=5000)


FAKE = """import torch
from pit import *
x_train = load_data('./', ntrain, ntest)
ntrain      = 1000
ntest       = 200
batch_size  = 20
learning_rate = 0.001
model = net(hid_dim=128, n_head=1, n_blocks=4, x_downsample=4, y_downsample=4,
            out_dim=4, en_loc=0.02, de_loc=0.02).cuda()
Y = np.load(path)[:,:4,...]
model = torch.compile(model)
myloss = RelLpNorm(out_dim=4, p=2)
for ep in range(epochs):
    model.train()
    for x, ext, y in train_loader:
        x, y = x.cuda(), y.cuda()
        optimizer.zero_grad()
        loss = myloss(y, model(x))
        loss.backward()
        optimizer.step()
        train_l2 += loss.item()
    print(ep)
model = model.cuda()
"""


def test_patch_script_changes_only_what_the_comparison_needs():
    case = CASES["airfoil"]
    out = patch_script(case, FAKE, "/data/af", 200, 40)
    header, body = out.split("\n", 2)[1], out.split("\n", 2)[2]
    assert header == "DATA_DIR, NTRAIN, NTEST, DEVICE = '/data/af/', 200, 40, 'cpu'"
    assert "load_data(DATA_DIR, ntrain, ntest)" in body
    assert "ntrain      = NTRAIN" in body and "ntest       = NTEST" in body
    assert ").to(DEVICE)" in body and ".cuda()" not in body
    assert "[:,4:5,...]" in body and body.count("out_dim=1") == 2 and "out_dim=4" not in body
    assert "model = torch.compile(model)" in body
    assert "for ep in range" not in body and "print(ep)" not in body  # cut before the loop
    # the untouched lines are the script's own
    kept = [ln for ln in FAKE.split("for ep in range")[0].splitlines()
            if not any(k in ln for k in ("load_data", "ntrain ", "ntest ", "cuda", "out_dim",
                                         ":4,"))]
    assert all(ln in body.splitlines() for ln in kept)
    no_compile = patch_script(case, FAKE, "/d", 2, 1, compile=False)
    assert "model = torch.compile(model)" not in no_compile


def test_patch_script_refuses_a_changed_reference():
    case = CASES["airfoil"]
    with pytest.raises(ValueError, match=r"hid_dim=64 \(expected 128\)"):
        patch_script(case, FAKE.replace("hid_dim=128", "hid_dim=64"), "/d", 2, 1)
    with pytest.raises(ValueError, match=r"expected 1 match\(es\) of .*load_data"):
        patch_script(case, FAKE.replace("load_data('./'", "load_data(root"), "/d", 2, 1)
    with pytest.raises(ValueError, match="no 'for ep in range"):
        patch_script(case, FAKE.replace("for ep in range(epochs):", "while True:"), "/d", 2, 1)
    with pytest.raises(ValueError, match=r"out_dim is set to several values: \[1.0, 4.0\]"):
        reference_settings("out_dim=4\nout_dim=1", ["out_dim"])


def test_step_body_is_the_scripts_inner_loop():
    body = step_body(CASES["airfoil"], FAKE)
    assert body.splitlines() == [
        "x, y = x.to(DEVICE), y.to(DEVICE)", "optimizer.zero_grad()",
        "loss = myloss(y, model(x))", "loss.backward()", "optimizer.step()",
        "train_l2 += loss.item()"]
    with pytest.raises(ValueError, match="no backward/optimizer step"):
        step_body(CASES["airfoil"], FAKE.replace("loss.backward()", "pass"))


def test_meshops_config_matches_the_reference():
    """The issue's matched configurations: airfoil width 128, 1 head, 4 blocks,
    stride-4 grid latent, count quantiles 0.02/0.02; Elasticity the paper's
    hidden 256, 2 heads, latent = the input points."""
    assert meshops_kwargs(CASES["airfoil"]) == dict(
        width=128, heads=1, blocks=4, latent="grid", grid_shape=[221, 51], stride=4,
        quantile_in=0.02, quantile_out=0.02, ball="count")
    assert meshops_kwargs(CASES["elasticity"]) == dict(
        width=256, heads=2, blocks=4, latent="input", quantile_in=0.02, quantile_out=0.02,
        ball="count")
    assert CASES["airfoil"].expected["batch_size"] == 20
    assert CASES["elasticity"].expected["batch_size"] == 10
    odd = Case("x", "x.py", dict(CASES["airfoil"].expected, y_downsample=2), (), (221, 51))
    with pytest.raises(ValueError, match="stride per axis"):
        meshops_kwargs(odd)


def test_cli_names_a_missing_reference_checkout(tmp_path, capsys):
    from benchmarks.reference.__main__ import main
    with pytest.raises(SystemExit) as exc:
        main(["--reference-dir", str(tmp_path), "--cases", "elasticity"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'train_elasticity.py'}: no such file" in err
    with pytest.raises(SystemExit):
        main(["--reference-dir", str(tmp_path), "--cases", "naca"])
    assert "unknown case 'naca'; choose from airfoil, elasticity" in capsys.readouterr().err


def test_cli_refuses_a_device_it_cannot_use(tmp_path, capsys):
    """``--device`` is cpu or a visible CUDA device; anything else stops before data are
    written (no silent fallback to the CPU while the table says cuda)."""
    from benchmarks.reference.__main__ import main
    (tmp_path / "train_elasticity.py").write_text("")
    bad = ["mps", "cuda:0"] if not torch.cuda.is_available() else ["mps"]
    for device in bad:
        with pytest.raises(SystemExit) as exc:
            main(["--reference-dir", str(tmp_path), "--cases", "elasticity",
                  "--device", device, "--work", str(tmp_path / "work")])
        assert exc.value.code == 2
        assert f"--device {device}: only cpu or cuda[:i] with a CUDA device visible" in \
            capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_cuda_benchmarks_run_children_by_spawn():
    """A forked child of a process that has asked the driver for GPUs fails its first
    CUDA call ('initialization error', seen on an H100): CUDA runs use spawn."""
    from benchmarks.harness import Isolated
    assert Isolated(start_method="spawn").ctx.get_start_method() == "spawn"
    assert Isolated().ctx.get_start_method() == "forkserver"


def test_reference_commit_is_the_checkouts_own(tmp_path):
    """An exported snapshot inside another git checkout must not report that
    checkout's HEAD as the reference commit."""
    import subprocess

    from benchmarks.reference.__main__ import _reference_commit
    outer = tmp_path / "outer"
    (outer / "ref").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    assert _reference_commit(outer / "ref") == "unknown: not the root of a git checkout"
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    ref = outer / "ref"
    subprocess.run(["git", "init", "-q", str(ref)], check=True)
    (ref / "pit.py").write_text("")
    subprocess.run(["git", "-C", str(ref), "add", "pit.py"], check=True)
    subprocess.run(["git", "-C", str(ref), "commit", "-qm", "x"], check=True, env=env)
    head = subprocess.run(["git", "-C", str(ref), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert _reference_commit(ref) == head
