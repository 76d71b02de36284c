"""The shared-data adapter (data_adapters.fem_npz) and the parametric folder writer,
on small archives the tests make themselves (the real data never enter the tests)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data_adapters import fem_npz
from data_adapters.parametric import (
    DATASET_FILE,
    PARAMS_FILE,
    permutation_split,
    prepare_parametric_folders,
    write_parametric_folders,
)
from meshops.errors import MeshError
from meshops.mesh.io import read_mesh


def _square(n=4):
    t = np.linspace(0.0, 1.0, n)
    X, Y = np.meshgrid(t, t, indexing="ij")
    pts = np.stack([X.ravel(), Y.ravel()], 1)
    tri = []
    for i in range(n - 1):
        for j in range(n - 1):
            a, b, c, d = i * n + j, (i + 1) * n + j, (i + 1) * n + j + 1, i * n + j + 1
            tri += [[a, b, c], [a, c, d]]
    return pts, np.asarray(tri, np.int32)


@pytest.fixture
def ns_archive(tmp_path):
    pts, tri = _square()
    rng = np.random.default_rng(1)
    S = 10
    path = tmp_path / "ns.npz"
    np.savez(path, params=rng.uniform(1, 80, (S, 1)), points=pts, triangles=tri,
             vx=rng.normal(size=(S, len(pts))), vy=rng.normal(size=(S, len(pts))),
             p=rng.normal(size=(S, len(pts))))
    return path


@pytest.fixture
def heat_archive(tmp_path):
    pts, tri = _square()
    rng = np.random.default_rng(2)
    path = tmp_path / "heat.npz"
    np.savez(path, params=rng.uniform(0, 10, (6, 2)), points=pts, triangles=tri,
             u=rng.normal(size=(6, 12, len(pts))))
    return path


def test_permutation_split_is_the_readmes():
    train, test = permutation_split(500, 400, seed=0)
    perm = np.random.default_rng(0).permutation(500)
    assert train == perm[:400].tolist() and test == perm[400:].tolist()
    with pytest.raises(MeshError, match="n_train must be in 1..9"):
        permutation_split(10, 10)


def test_navier_stokes_folders_hold_fields_params_and_split(ns_archive, tmp_path):
    ds = fem_npz.navier_stokes_set(ns_archive, n_train=7)
    root = write_parametric_folders(ds, tmp_path / "out", progress=False)
    d = np.load(ns_archive)
    desc = json.loads((root / DATASET_FILE).read_text())
    perm = np.random.default_rng(0).permutation(10)
    assert desc["train"] == [f"sample_{i:04d}.vtu" for i in perm[:7]]
    assert desc["test"] == [f"sample_{i:04d}.vtu" for i in perm[7:]]
    assert desc["inputs"] == ["mu0"] and desc["targets"] == ["vx", "vy", "p"]
    for split in ("train", "test"):
        sidecar = json.loads((root / split / PARAMS_FILE).read_text())
        assert sorted(sidecar) == sorted(desc[split])
        for name, values in sidecar.items():
            s = int(name[len("sample_"):-len(".vtu")])
            mesh = read_mesh(root / split / name)
            # the parameter: constant point field == sidecar == archive
            np.testing.assert_array_equal(mesh.fields["mu0"].numpy(),
                                          np.full(16, d["params"][s, 0]))
            assert values == {"mu0": float(d["params"][s, 0])}
            for k in ("vx", "vy", "p"):
                np.testing.assert_array_equal(mesh.fields[k].numpy(), d[k][s])
            assert len(mesh.cells[0][1]) == len(d["triangles"])


def test_heat_is_split_by_trajectory_with_the_step_as_parameter(heat_archive, tmp_path):
    ds = fem_npz.heat_set(heat_archive, n_train=4, every=5)
    steps = [0, 5, 10]
    assert ds.param_names == ["mu0", "mu1", "step"]
    assert len(ds.train) == 4 * len(steps) and len(ds.test) == 2 * len(steps)
    traj = lambda k: ds.ids[k] // 12  # noqa: E731
    assert not {traj(k) for k in ds.train} & {traj(k) for k in ds.test}
    assert sorted({ds.ids[k] % 12 for k in ds.test}) == steps
    train_traj, _ = permutation_split(6, 4, 0)
    assert sorted({traj(k) for k in ds.train}) == sorted(train_traj)
    d = np.load(heat_archive)
    root = write_parametric_folders(ds, tmp_path / "heat", progress=False)
    k = ds.test[-1]
    tr, st = divmod(ds.ids[k], 12)
    mesh = read_mesh(root / "test" / ds.file_name(k))
    np.testing.assert_array_equal(mesh.fields["u"].numpy(), d["u"][tr, st])
    np.testing.assert_array_equal(mesh.fields["step"].numpy(), np.full(16, float(st)))
    np.testing.assert_array_equal(mesh.fields["mu1"].numpy(), np.full(16, d["params"][tr, 1]))


def test_missing_array_and_existing_folder_are_refused(tmp_path, ns_archive):
    bad = tmp_path / "bad.npz"
    np.savez(bad, params=np.zeros((3, 1)))
    with pytest.raises(MeshError, match=r"bad.npz: missing array\(s\) \['points'"):
        fem_npz.navier_stokes_set(bad)
    ds = fem_npz.navier_stokes_set(ns_archive, n_train=7)
    (tmp_path / "out").mkdir()
    with pytest.raises(MeshError, match="out: already exists"):
        write_parametric_folders(ds, tmp_path / "out", progress=False)


def test_a_failed_write_leaves_nothing(tmp_path, ns_archive):
    ds = fem_npz.navier_stokes_set(ns_archive, n_train=7)
    del ds.samples[ds.test[-1]].fields["vy"]
    with pytest.raises(MeshError, match=r"no field\(s\) \['vy'\]"):
        write_parametric_folders(ds, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == [ns_archive]


def test_prepare_reuses_a_complete_folder_and_rebuilds_a_damaged_one(tmp_path, ns_archive):
    calls = []

    def build():
        calls.append(1)
        return fem_npz.navier_stokes_set(ns_archive, n_train=7)

    key = build().info["key"]
    calls.clear()
    root = prepare_parametric_folders(tmp_path / "ns", build, key, progress=False)
    prepare_parametric_folders(root, build, key, progress=False)
    assert len(calls) == 1
    next((root / "test").glob("*.vtu")).unlink()  # a missing file: written again
    prepare_parametric_folders(root, build, key, progress=False)
    assert len(calls) == 2 and len(list((root / "test").glob("*.vtu"))) == 3


def test_cli_writes_folders_and_fails_in_one_line(tmp_path, ns_archive, capsys):
    assert fem_npz.main(["navier_stokes", str(tmp_path / "o"), "--archive", str(ns_archive),
                         "--n-train", "8"]) == 0
    assert len(list((tmp_path / "o" / "train").glob("*.vtu"))) == 8
    assert fem_npz.main(["heat", str(tmp_path / "h"), "--archive",
                         str(tmp_path / "nope.npz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.npz: no such file" in err[0]
