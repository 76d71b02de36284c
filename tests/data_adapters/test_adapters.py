"""Geo-FNO readers (Elasticity, NACA) on small files of the exact benchmark layout,
the folder data set and export_to_folder."""

from __future__ import annotations

import warnings

import meshio
import numpy as np
import pytest
import torch

from data_adapters import (
    ElasticityDataset,
    MeshFolderDataset,
    NacaDataset,
    export_to_folder,
    load_elasticity,
    load_naca,
    split_indices,
)
from data_adapters.elasticity import (
    RR_FILE,
    SIGMA_FILE,
    XY_FILE,
    void_area_from_points,
    void_area_from_rr,
)
from data_adapters.folder import list_mesh_files
from data_adapters.naca import CHANNELS, Q_FILE, X_FILE, Y_FILE
from data_adapters.standins.cgrid import c_grid
from data_adapters.standins.naca4 import naca4
from meshops.errors import MeshError
from meshops.mesh.io import read_mesh

F64 = torch.float64

# ---------------------------------------------------------------------------------
# Elasticity files: 20 samples of 972 points, points-first, like the benchmark.
# ---------------------------------------------------------------------------------
P, S_EL, R = 972, 20, 42


def _radius(theta, s):
    """Void radius of test sample s: a circle with a 3-lobe perturbation."""
    return 0.25 + 0.005 * s + 0.05 * np.cos(3 * theta + 0.3 * s)


def _exact_void_area(s):
    r0, a = 0.25 + 0.005 * s, 0.05
    return np.pi * (r0 ** 2 + a ** 2 / 2)


def _cell_points(s, rng):
    """972 points of the unit cell minus the void: 96 on the void, 100 on the sides,
    a dense band near the void and uniform points elsewhere."""
    th = np.linspace(0, 2 * np.pi, 96, endpoint=False)
    r = _radius(th, s)
    void = np.stack([0.5 + r * np.cos(th), 0.5 + r * np.sin(th)], 1)
    u = np.arange(25) / 25
    sides = np.concatenate([np.stack([u, 0 * u], 1), np.stack([1 + 0 * u, u], 1),
                            np.stack([1 - u, 1 + 0 * u], 1), np.stack([0 * u, 1 - u], 1)])
    th2 = rng.uniform(0, 2 * np.pi, 300)
    band_r = _radius(th2, s) + rng.uniform(0.003, 0.06, 300)
    band = np.stack([0.5 + band_r * np.cos(th2), 0.5 + band_r * np.sin(th2)], 1)
    rest = []
    while len(rest) < P - len(void) - len(sides) - len(band):
        q = rng.uniform(0.01, 0.99, 2)
        d = q - 0.5
        if np.hypot(*d) > _radius(np.arctan2(d[1], d[0]), s) + 0.06:
            rest.append(q)
    return np.concatenate([void, sides, band, np.array(rest)])


def _sigma(points, s):
    return s + points[:, 0] + 2 * points[:, 1]


@pytest.fixture(scope="module")
def elasticity_arrays():
    rng = np.random.default_rng(0)
    XY = np.stack([_cell_points(s, rng) for s in range(S_EL)], axis=2)  # (972, 2, 20)
    sigma = np.stack([_sigma(XY[:, :, s], s) for s in range(S_EL)], axis=1)  # (972, 20)
    theta = np.linspace(0, 2 * np.pi, R)  # closed: first = last
    rr = np.stack([_radius(theta, s) for s in range(S_EL)], axis=1)  # (42, 20)
    return XY, sigma, rr


def _write_elasticity(root, XY, sigma, rr=None):
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / XY_FILE, XY)
    np.save(root / SIGMA_FILE, sigma)
    if rr is not None:
        np.save(root / RR_FILE, rr)
    return root


@pytest.fixture
def elasticity_dir(tmp_path, elasticity_arrays):
    return _write_elasticity(tmp_path / "el", *elasticity_arrays)


def test_elasticity_points_targets_params(elasticity_dir, elasticity_arrays):
    XY, sigma, rr = elasticity_arrays
    ds = ElasticityDataset(elasticity_dir, "all", with_params=True, dtype=F64)
    assert len(ds) == S_EL
    for s in (0, 7, 19):
        m = ds[s]
        assert m.pos.shape == (P, 2) and m.pos.dtype == F64
        assert torch.equal(m.pos, torch.from_numpy(XY[:, :, s]))  # XY[:, :, s] <-> sample s
        assert torch.equal(m.fields["sigma"], torch.from_numpy(sigma[:, s]))
        assert torch.equal(m.y[:, 0], m.fields["sigma"]) and m.x.shape == (P, 0)
        assert torch.equal(m.params, torch.from_numpy(rr[:, s])[None])
        assert m.sample_id == s and m.standin is False
        assert not hasattr(m, "cells") or not m.cells
    # float32 by default, every floating tensor
    m = ElasticityDataset(elasticity_dir, "all")[3]
    assert {m.pos.dtype, m.weight.dtype, m.y.dtype, m.fields["sigma"].dtype} == {torch.float32}
    assert not hasattr(m, "params")


def test_samples_batch_with_pyg(elasticity_dir, naca_dir):
    from torch_geometric.loader import DataLoader
    el = ElasticityDataset(elasticity_dir, "all", with_params=True)
    b = next(iter(DataLoader(el, batch_size=3)))
    assert b.sample_id.tolist() == [0, 1, 2] and b.params.shape == (3, R)  # ids not shifted
    assert b.y.shape == (3 * P, 1) and b.batch.tolist()[P - 1:P + 1] == [0, 1]
    assert torch.allclose(b.integrate(torch.ones(3 * P)), torch.tensor([el[k].measure
                                                                        for k in range(3)]))
    nc = NacaDataset(naca_dir, "all")
    b = next(iter(DataLoader(nc, batch_size=2, shuffle=False)))
    assert b.grid_shape.tolist() == [[N0, N1]] * 2 and b.x.shape == (2 * N0 * N1, 0)


def test_elasticity_splits(elasticity_dir):
    # The benchmark's index arithmetic ...
    assert split_indices(2000, "train", 1000, 200, test_at_end=True) == range(0, 1000)
    assert split_indices(2000, "test", 1000, 200, test_at_end=True) == range(1800, 2000)
    # ... and a small configurable split on the 20-sample files: test = [-4:]
    tr = ElasticityDataset(elasticity_dir, "train", n_train=12, n_test=4)
    te = ElasticityDataset(elasticity_dir, "test", n_train=12, n_test=4)
    assert tr.indices == range(0, 12) and te.indices == range(16, 20)
    assert [m.sample_id for m in load_elasticity(elasticity_dir, "test", n_train=12,
                                                    n_test=4)] == [16, 17, 18, 19]
    assert te[-1].sample_id == 19
    with pytest.raises(MeshError, match=r"split 'train' = samples \[:1000\] needs 1000 samples "
                                        r"but the files hold 20"):
        ElasticityDataset(elasticity_dir, "train")
    with pytest.raises(MeshError, match=r"train \[:15\] and test \[-10:\] overlap"):
        ElasticityDataset(elasticity_dir, "test", n_train=15, n_test=10)
    with pytest.raises(MeshError, match="unknown split 'val'"):
        ElasticityDataset(elasticity_dir, "val")


def test_elasticity_weights_measure(elasticity_dir, elasticity_arrays, tmp_path):
    XY, sigma, rr = elasticity_arrays
    ds = ElasticityDataset(elasticity_dir, "all", dtype=F64)
    for s in (0, 11):
        m = ds[s]
        # rr is a trigonometric polynomial of degree 3: the trapezoid rule is exact.
        assert m.weight.sum().item() == pytest.approx(1 - _exact_void_area(s), rel=1e-12)
        assert (m.weight > 0).all()
        # kNN weights follow the density: the dense band near the void gets smaller
        # weights than the sparse points far from it.
        assert m.weight[196:496].mean() < 0.5 * m.weight[496:].mean()
    # Without rr the void area comes from the points (96 boundary nodes, 32 sectors).
    no_rr = _write_elasticity(tmp_path / "no_rr", XY, sigma)
    m = ElasticityDataset(no_rr, "all", dtype=F64)[5]
    assert m.weight.sum().item() == pytest.approx(1 - _exact_void_area(5), rel=0.01)
    assert void_area_from_points(XY[:, :, 5]) == pytest.approx(_exact_void_area(5), rel=0.03)
    assert void_area_from_rr(rr[:, 5]) == pytest.approx(_exact_void_area(5), rel=1e-12)
    # Open sampling (no repeated endpoint) gives the same area.
    open_rr = _radius(np.linspace(0, 2 * np.pi, 42, endpoint=False), 5)
    assert void_area_from_rr(open_rr) == pytest.approx(_exact_void_area(5), rel=1e-12)
    # Explicit measures.
    assert ElasticityDataset(elasticity_dir, "all", measure=0.5, dtype=F64)[0].measure \
        == pytest.approx(0.5)
    uni = ElasticityDataset(elasticity_dir, "all", weights="uniform", dtype=F64)[0].weight
    assert torch.allclose(uni, uni[0].expand_as(uni))
    # rr that are not radii: "auto" falls back to the points, with a warning.
    bad = _write_elasticity(tmp_path / "bad_rr", XY, sigma, rr - 1.0)
    with pytest.warns(UserWarning, match="not void radii"):
        m = ElasticityDataset(bad, "all", dtype=F64)[5]
    assert m.weight.sum().item() == pytest.approx(1 - _exact_void_area(5), rel=0.01)
    with pytest.raises(MeshError, match=r"sample 5 has rr values in .*not void radii"):
        ElasticityDataset(bad, "all", measure="rr")[5]


@pytest.mark.parametrize("case, match", [
    ("xy_shape", rf"{XY_FILE}: expected shape \(\*, 2, \*\) \(points, xy, samples\), "
                 r"got \(972, 3, 20\)"),
    ("xy_samples_first", r"got \(20, 972, 2\); this looks samples-first"),
    ("sigma_shape", rf"{SIGMA_FILE}: expected shape \(972, 20\) .*got \(972, 19\)"),
    ("rr_shape", rf"{RR_FILE}: expected shape \(\*, 20\) .*got \(42, 18\)"),
    ("sigma_nan", rf"{SIGMA_FILE}: sample 17 has NaN at point 3 "),
    ("xy_inf", rf"{XY_FILE}: sample 5 has \+inf at point 10 "),
    ("rr_nan", rf"{RR_FILE}: sample 2 has NaN at rr entry 40 "),
    ("object", rf"{SIGMA_FILE}: contains a Python-object \(pickled\) array"),
    ("int", rf"{XY_FILE}: has dtype int64; expected a floating-point array"),
    ("truncated", rf"{SIGMA_FILE}: not a readable .npy file"),
    ("npz", rf"{XY_FILE}: is an .npz archive"),
    ("missing", rf"{SIGMA_FILE}: no such file"),
])
def test_elasticity_corrupt_files(tmp_path, elasticity_arrays, case, match):
    XY, sigma, rr = (a.copy() for a in elasticity_arrays)
    root = _write_elasticity(tmp_path / case, XY, sigma, rr)
    if case == "xy_shape":
        np.save(root / XY_FILE, np.concatenate([XY, XY[:, :1]], axis=1))
    elif case == "xy_samples_first":
        np.save(root / XY_FILE, XY.transpose(2, 0, 1))
    elif case == "sigma_shape":
        np.save(root / SIGMA_FILE, sigma[:, :19])
    elif case == "rr_shape":
        np.save(root / RR_FILE, rr[:, :18])
    elif case == "sigma_nan":
        sigma[3, 17] = np.nan
        sigma[8, 18] = np.nan
        np.save(root / SIGMA_FILE, sigma)
    elif case == "xy_inf":
        XY[10, 1, 5] = np.inf
        np.save(root / XY_FILE, XY)
    elif case == "rr_nan":
        rr[40, 2] = np.nan
        np.save(root / RR_FILE, rr)
    elif case == "object":
        np.save(root / SIGMA_FILE, sigma.astype(object), allow_pickle=True)
    elif case == "int":
        np.save(root / XY_FILE, XY.astype(np.int64))
    elif case == "truncated":
        data = (root / SIGMA_FILE).read_bytes()
        (root / SIGMA_FILE).write_bytes(data[:100])
    elif case == "npz":
        (root / XY_FILE).unlink()
        np.savez(root / "tmp.npz", XY=XY)
        (root / "tmp.npz").rename(root / XY_FILE)
    elif case == "missing":
        (root / SIGMA_FILE).unlink()
    with pytest.raises(MeshError, match=match):
        ElasticityDataset(root, "all")


def test_elasticity_lazy_checks(tmp_path, elasticity_arrays):
    XY, sigma, rr = (a.copy() for a in elasticity_arrays)
    sigma[3, 17] = np.nan
    root = _write_elasticity(tmp_path / "lazy", XY, sigma)
    # The split scan only covers the split's samples; the NaN is in the test block.
    ds = ElasticityDataset(root, "train", n_train=12, n_test=4)
    assert len(ds) == 12
    ds = ElasticityDataset(root, "all", validate=False)
    ds[16]
    with pytest.raises(MeshError, match=rf"{SIGMA_FILE}: sample 17 has NaN at point 3"):
        ds[17]
    with pytest.raises(MeshError, match=rf"{RR_FILE}: no such file \(needed for with_params"):
        ElasticityDataset(root, "all", with_params=True)
    with pytest.raises(IndexError):
        ds[20]


# ---------------------------------------------------------------------------------
# NACA files: 12 samples on a real algebraic 221 x 51 C-grid (sample 0: NACA 0012;
# then thicker, some cambered), layout
# X, Y (N, 221, 51), Q (N, 5, 221, 51).
# ---------------------------------------------------------------------------------
N_NACA, N0, N1, N_WAKE = 12, 221, 51, 40


def _q_value(c, s, X, Y):
    return c + 0.01 * s + (c + 1) * X - 0.5 * Y


@pytest.fixture(scope="module")
def naca_arrays():
    X = np.zeros((N_NACA, N0, N1))
    Y = np.zeros_like(X)
    for s in range(N_NACA):
        X[s], Y[s] = c_grid(naca4(0.01 * (s % 3), 0.4, 0.12 + 0.004 * s, 71), N_WAKE, N1)
    Q = np.stack([_q_value(c, np.arange(N_NACA)[:, None, None], X, Y)
                  for c in range(5)], axis=1)
    return X, Y, Q


def _write_naca(root, X, Y, Q):
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / X_FILE, X)
    np.save(root / Y_FILE, Y)
    np.save(root / Q_FILE, Q)
    return root


@pytest.fixture
def naca_dir(tmp_path, naca_arrays):
    return _write_naca(tmp_path / "naca", *naca_arrays)


def _boundary_loop(X, Y):
    """Closed boundary of the grid's index rectangle: j=0, i=n0-1, j=n1-1, i=0."""
    xs = np.concatenate([X[:, 0], X[-1, 1:], X[-2::-1, -1], X[0, -2:0:-1]])
    ys = np.concatenate([Y[:, 0], Y[-1, 1:], Y[-2::-1, -1], Y[0, -2:0:-1]])
    return xs, ys


def test_naca_points_fields_targets(naca_dir, naca_arrays):
    X, Y, Q = naca_arrays
    ds = NacaDataset(naca_dir, "all", dtype=F64)
    assert len(ds) == N_NACA
    for s in (0, 5, 11):
        m = ds[s]
        assert torch.equal(m.pos, torch.from_numpy(np.stack([X[s].ravel(), Y[s].ravel()], 1)))
        for c, name in enumerate(CHANNELS):
            assert torch.equal(m.fields[name], torch.from_numpy(Q[s, c].ravel()))
        assert torch.equal(m.y[:, 0], torch.from_numpy(Q[s, 4].ravel()))  # Mach by default
        assert m.x.shape == (N0 * N1, 0)
        assert m.grid_shape.tolist() == [[N0, N1]] and m.sample_id == s
    m = NacaDataset(naca_dir, "all", target="p", dtype=F64)[2]
    assert torch.equal(m.y[:, 0], torch.from_numpy(Q[2, 3].ravel()))
    m = NacaDataset(naca_dir, "all", target=["density", 1], dtype=F64)[2]
    assert torch.equal(m.y, torch.from_numpy(np.stack([Q[2, 0].ravel(), Q[2, 1].ravel()], 1)))
    with pytest.raises(MeshError,
                       match="unknown target 'Mach'; channels are density, u, v, p, mach"):
        NacaDataset(naca_dir, "all", target="Mach")
    with pytest.raises(MeshError, match="target channel 5 out of range"):
        NacaDataset(naca_dir, "all", target=5)


def test_naca_cgrid_wake_cut_and_weights(naca_dir, naca_arrays):
    X, Y, _ = naca_arrays
    m = NacaDataset(naca_dir, "all", dtype=F64)[4]
    # The wake-cut nodes (and the trailing edge) are doubled at j = 0 ...
    i = np.arange(N_WAKE + 1)
    assert np.array_equal(X[4, i, 0], X[4, N0 - 1 - i, 0])
    assert np.array_equal(Y[4, i, 0], Y[4, N0 - 1 - i, 0])
    # ... both copies are used by cells and get weight; no cell is dropped (none is
    # degenerate or tangled, also at the trailing edge).
    assert m.cells[0][0] == "quad" and m.cells[0][1].shape == ((N0 - 1) * (N1 - 1), 4)
    assert (m.weight > 0).all()
    w = m.weight.numpy().reshape(N0, N1)
    assert (w[i, 0] > 0).all() and (w[N0 - 1 - i, 0] > 0).all()
    # The quads tile the polygon bounded by the grid's outer lines: the weights add up
    # to its area and integrate x exactly (Green: int x dA = 1/2 oint x^2 dy).
    xs, ys = _boundary_loop(X[4], Y[4])
    xn, yn = np.roll(xs, -1), np.roll(ys, -1)
    area = 0.5 * abs(np.sum(xs * yn - xn * ys))
    int_x = abs(np.sum((xs ** 2 + xs * xn + xn ** 2) * (yn - ys)) / 6)
    assert m.weight.sum().item() == pytest.approx(area, rel=1e-12)
    assert (m.weight * m.pos[:, 0]).sum().item() == pytest.approx(int_x, rel=1e-10)


def test_naca_splits(naca_dir):
    assert split_indices(1200, "train", 1000, 200, test_at_end=False) == range(0, 1000)
    assert split_indices(1200, "test", 1000, 200, test_at_end=False) == range(1000, 1200)
    tr = NacaDataset(naca_dir, "train", n_train=8, n_test=3)
    te = NacaDataset(naca_dir, "test", n_train=8, n_test=3)
    assert tr.indices == range(0, 8) and te.indices == range(8, 11)
    assert [m.sample_id for m in load_naca(naca_dir, "test", n_train=8, n_test=3)] == [8, 9, 10]
    with pytest.raises(MeshError, match=r"split 'test' = samples \[1000:1200\] needs 1200 "
                                        r"samples but the files hold 12"):
        NacaDataset(naca_dir, "test")


def test_naca_degenerate_and_tangled_cells(tmp_path, naca_arrays):
    X, Y, Q = (a[:2].copy() for a in naca_arrays)
    ref = NacaDataset(_write_naca(tmp_path / "ref", X, Y, Q), "all", dtype=F64)[1]
    # Repeat grid line i = 100: the cells between the two copies have zero area.
    Xd, Yd, Qd = (np.insert(a, 101, a[:, 100] if a.ndim == 3 else a[:, :, 100], axis=a.ndim - 2)
                  for a in (X, Y, Q))
    root = _write_naca(tmp_path / "degenerate", Xd, Yd, Qd)
    with pytest.warns(UserWarning, match=r"dropping 50 zero-area cells, the first at grid "
                                         r"cell \(i=100, j=0\)"):
        m = NacaDataset(root, "all", dtype=F64)[1]
    assert m.cells[0][1].shape[0] == (N0 - 1) * (N1 - 1)  # (N0 + 1 - 1) - 1 columns kept
    w = m.weight.numpy().reshape(N0 + 1, N1)
    # Weights are unchanged: the two copies of line 100 split the original's weight.
    assert np.allclose(w[100] + w[101], ref.weight.numpy().reshape(N0, N1)[100], rtol=1e-12)
    assert m.weight.sum().item() == pytest.approx(ref.weight.sum().item(), rel=1e-12)
    with pytest.raises(MeshError, match=r"sample 0: 50 zero-area cells, the first at grid cell "
                                        r"\(i=100, j=0\); pass degenerate='drop'"):
        NacaDataset(root, "all", degenerate="raise")[0]
    # Fold a cell: swap two nodes of one grid line.
    Xt, Yt = X.copy(), Y.copy()
    Xt[0, 150, 10], Xt[0, 150, 11] = X[0, 150, 11], X[0, 150, 10]
    Yt[0, 150, 10], Yt[0, 150, 11] = Y[0, 150, 11], Y[0, 150, 10]
    root = _write_naca(tmp_path / "tangled", Xt, Yt, Q)
    with pytest.raises(MeshError, match=r"sample 0: grid cell \(i=1[45]\d, j=(9|10|11)\) .*"
                                        r"is tangled"):
        NacaDataset(root, "all")[0]


@pytest.mark.parametrize("case, match", [
    ("channels", rf"{Q_FILE}: expected shape \(12, 5, 221, 51\) \(samples, channels, n0, n1\) "
                 r"with channels density, u, v, p, mach.*got \(12, 4, 221, 51\)"),
    ("y_shape", rf"{Y_FILE}: expected shape \(12, 221, 51\) .*got \(12, 221, 50\)"),
    ("x_ndim", rf"{X_FILE}: expected shape \(\*, \*, \*\) \(samples, n0, n1\), got \(12, 11271\)"),
    ("q_nan", rf"{Q_FILE}: sample 7 has NaN at channel 4 \(mach\), grid node \(i=3, j=5\)"),
    ("x_inf", rf"{X_FILE}: sample 2 has -inf at grid node \(i=200, j=50\)"),
    ("object", rf"{Q_FILE}: contains a Python-object \(pickled\) array"),
    ("int", rf"{Y_FILE}: has dtype int32; expected a floating-point array"),
    ("missing", rf"{Q_FILE}: no such file"),
])
def test_naca_corrupt_files(tmp_path, naca_arrays, case, match):
    X, Y, Q = (a.copy() for a in naca_arrays)
    if case == "channels":
        Q = Q[:, :4]
    elif case == "y_shape":
        Y = Y[:, :, :50]
    elif case == "x_ndim":
        X = X.reshape(N_NACA, -1)
    elif case == "q_nan":
        Q[7, 4, 3, 5] = np.nan
    elif case == "x_inf":
        X[2, 200, 50] = -np.inf
    elif case == "int":
        Y = Y.astype(np.int32)
    root = _write_naca(tmp_path / case, X, Y, Q)
    if case == "object":
        np.save(root / Q_FILE, Q.astype(object), allow_pickle=True)
    elif case == "missing":
        (root / Q_FILE).unlink()
    with pytest.raises(MeshError, match=match):
        NacaDataset(root, "all")


# ---------------------------------------------------------------------------------
# Folder data set and export
# ---------------------------------------------------------------------------------
def test_export_roundtrip_point_clouds(tmp_path, elasticity_dir):
    samples = load_elasticity(elasticity_dir, "all", n_train=12, n_test=4)[:5]
    paths = export_to_folder(samples, tmp_path / "out")
    assert [p.name for p in paths] == [f"sample_{k:04d}.vtu" for k in range(5)]
    ds = MeshFolderDataset(tmp_path / "out", inputs=[], targets=["sigma"])
    assert len(ds) == 5
    for a, b in zip(samples, ds):
        assert b.pos.dtype == torch.float32 and b.x.shape == (P, 0)
        assert torch.equal(a.pos, b.pos) and torch.equal(a.y, b.y)
        assert torch.equal(a.weight, b.weight)  # a cloud's weights travel in the file
    assert ds.num_channels == (0, 1)


@pytest.mark.parametrize("fmt", [".vtu", ".vtk", ".xdmf", ".msh"])
def test_export_roundtrip_grids(tmp_path, naca_dir, fmt):
    samples = load_naca(naca_dir, "all", target="mach", dtype=F64)[:2]
    export_to_folder(samples, tmp_path / "out", fmt=fmt, prefix="naca")
    ds = MeshFolderDataset(tmp_path / "out", inputs=["u", "v"], targets=["mach", "p"],
                           dtype=F64)
    assert [p.name for p in ds.files] == [f"naca_0000{fmt}", f"naca_0001{fmt}"]
    for a, b in zip(samples, ds):
        assert torch.equal(a.pos, b.pos)
        assert torch.equal(b.x, torch.stack([a.fields["u"], a.fields["v"]], 1))
        assert torch.equal(b.y, torch.stack([a.fields["mach"], a.fields["p"]], 1))
        assert torch.allclose(a.weight, b.weight, rtol=1e-12, atol=0)  # recomputed from cells


def test_folder_errors(tmp_path, elasticity_dir):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no meshes here")
    with pytest.raises(MeshError, match=r"empty: no mesh files in this folder"):
        MeshFolderDataset(tmp_path / "empty", [], ["T"])
    with pytest.raises(MeshError, match=r"nowhere: no such folder"):
        MeshFolderDataset(tmp_path / "nowhere", [], ["T"])
    samples = load_elasticity(elasticity_dir, "all", n_train=12, n_test=4)[:2]
    export_to_folder(samples, tmp_path / "el")
    with pytest.raises(MeshError, match=r"sample_0000\.vtu: target field 'T' not found; "
                                        r"available point fields: sigma"):
        MeshFolderDataset(tmp_path / "el", [], ["T"])
    with pytest.raises(MeshError, match=r"sample_0000\.vtu: input field 'k' not found"):
        MeshFolderDataset(tmp_path / "el", ["k"], ["sigma"])
    with pytest.raises(MeshError, match="lists of field names"):
        MeshFolderDataset(tmp_path / "el", [], "sigma")
    # A field whose length is not N (read_mesh rejects it, naming the file).
    bad = tmp_path / "bad"
    bad.mkdir()
    mesh = meshio.Mesh(np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0.]]),
                       [("triangle", np.array([[0, 1, 2], [0, 2, 3]]))],
                       point_data={"T": np.array([10., 11., 12., 13.])})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh.write(bad / "a.vtu", binary=False)
    text = (bad / "a.vtu").read_text()
    (bad / "a.vtu").write_text(text.replace("1.30000000000e+01\n", ""))
    with pytest.raises(MeshError, match=r"a\.vtu: cannot read mesh .*point_data\[\"T\"\]\) = 3"):
        MeshFolderDataset(bad, [], ["T"])
    # Channel counts must agree across files.
    mixed = tmp_path / "mixed"
    export_to_folder(samples[:1], mixed)
    two = samples[1].clone()
    two.fields = {"sigma": torch.stack([two.fields["sigma"]] * 2, 1)}
    export_to_folder([samples[0], two], mixed, overwrite=True)
    ds = MeshFolderDataset(mixed, [], ["sigma"])
    with pytest.raises(MeshError, match=r"sample_0001\.vtu: inputs/targets have 0/2 channels "
                                        r"but sample_0000\.vtu has 0/1"):
        ds[1]


def test_folder_order_cache_and_export_guard(tmp_path, elasticity_dir):
    samples = load_elasticity(elasticity_dir, "all", n_train=12, n_test=4)[:3]
    root = tmp_path / "nat"
    root.mkdir()
    from meshops.mesh.io import write_mesh
    for k, name in zip(range(3), ["s_10.vtu", "s_2.vtu", "s_1.vtk"]):
        write_mesh(root / name, samples[k])
    (root / ".s_3.vtu.tmp").write_text("interrupted write")
    assert [p.name for p in list_mesh_files(root)] == ["s_1.vtk", "s_2.vtu", "s_10.vtu"]
    ds = MeshFolderDataset(root, [], ["sigma"], cache=True)
    assert torch.equal(ds[2].y, samples[0].y) and ds[0] is ds[0]
    # export refuses to mix two exports, and overwrite removes stale files.
    out = tmp_path / "out"
    export_to_folder(samples, out)
    with pytest.raises(MeshError, match="already holds 3 exported files"):
        export_to_folder(samples[:2], out)
    export_to_folder(samples[:2], out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["sample_0000.vtu", "sample_0001.vtu"]
    # samples without fields get their x/y written
    bare = samples[0].clone()
    del bare.fields
    export_to_folder([bare], tmp_path / "bare")
    m = read_mesh(tmp_path / "bare" / "sample_0000.vtu")
    assert set(m.fields) == {"y"} and np.allclose(m.fields["y"].ravel(), bare.y.ravel())


def _distance_to_curve(points, s, samples=200_000):
    """Reference: the smallest distance to 200k points on the exact void boundary."""
    th = np.linspace(0, 2 * np.pi, samples, endpoint=False)
    r = _radius(th, s)
    curve = np.stack([0.5 + r * np.cos(th), 0.5 + r * np.sin(th)], 1)
    tree = __import__("scipy.spatial", fromlist=["cKDTree"]).cKDTree(curve)
    return tree.query(points)[0]


def test_elasticity_void_distance(elasticity_dir, elasticity_arrays, tmp_path):
    XY, sigma, rr = elasticity_arrays
    ds = ElasticityDataset(elasticity_dir, "all", void_distance=True, dtype=F64)
    for s in (0, 13):
        m = ds[s]
        assert m.x.shape == (P, 1)
        assert torch.equal(m.x[:, 0], m.fields["void_distance"])
        ref = _distance_to_curve(XY[:, :, s], s)
        # The spline through 41 distinct radii of r = r0 + 0.05 cos(3 theta) is
        # accurate to O(h^4 r'''') ~ 1e-5; the reference's chords are 1e-5 apart.
        np.testing.assert_allclose(m.x[:, 0].numpy(), ref, atol=5e-5)
        assert m.x[:96, 0].abs().max() < 5e-5         # the nodes on the void
    with pytest.raises(MeshError, match=r"no such file \(needed for void_distance=True\)"):
        ElasticityDataset(_write_elasticity(tmp_path / "no_rr", XY, sigma), "all",
                          void_distance=True)
    bad = _write_elasticity(tmp_path / "bad_rr", XY, sigma, rr - 1.0)
    with pytest.raises(MeshError, match=r"sample 2 has rr values .*not void radii.*"
                                        r"void_distance=False"):
        ElasticityDataset(bad, "all", void_distance=True, measure="points")[2]


def test_polygon_distance_to_a_circle():
    """Distance to a regular M-gon inscribed in a circle of radius R: within the
    chord sag R (1 - cos(pi / M)) of | |p - c| - R |, exact at the vertices."""
    from data_adapters._geometry import polygon_distance, star_polygon
    R, M = 0.3, 1024
    poly = star_polygon(lambda t: np.full_like(t, R), (0.5, 0.5), M)
    rng = np.random.default_rng(1)
    p = rng.uniform(0, 1, (5000, 2))
    exact = np.abs(np.hypot(p[:, 0] - 0.5, p[:, 1] - 0.5) - R)
    d = polygon_distance(p, poly, chunk=777)
    sag = R * (1 - np.cos(np.pi / M))
    assert np.abs(d - exact).max() <= sag + 1e-15
    assert np.abs(d - exact).max() > 0.1 * sag          # the test can see the sag
    np.testing.assert_allclose(polygon_distance(poly, poly), 0, atol=1e-15)


# ---------------------------------------------------------------------------------
# Loading speed (issue 13, item 4): NACA grids take a vectorised path for their
# weights; it must give the per-cell path's results and leave bad grids to it.
# ---------------------------------------------------------------------------------
def test_naca_fast_weights_equal_per_cell_path(naca_dir, naca_arrays, monkeypatch):
    """On valid C-grids (wake cut, trailing edge) the sample is built without
    mesh_from_arrays' per-cell quadrature (it fails if called) and equals the per-cell
    path: the same positions, fields, cells and targets, weights to 1e-12 relative
    (the same 3 x 3 Gauss rule, summed in another order: rounding, ~1e-16 per cell,
    amplified by the cancellation in the Jacobians of thin cells)."""
    import data_adapters.naca as naca_mod
    X, Y, Q = naca_arrays
    ds = NacaDataset(naca_dir, "all", dtype=F64)
    per_cell = [ds._sample_per_cell(s, np.stack([X[s].ravel(), Y[s].ravel()], 1), Q[s],
                                    f"sample {s}") for s in (0, 4, 11)]

    def no_per_cell(*args, **kwargs):
        raise AssertionError("mesh_from_arrays called for a valid grid")

    monkeypatch.setattr(naca_mod, "mesh_from_arrays", no_per_cell)
    for s, ref in zip((0, 4, 11), per_cell):
        m = ds[s]
        np.testing.assert_allclose(m.weight.numpy(), ref.weight.numpy(), rtol=1e-12, atol=0)
        for key in ("pos", "x", "y", "grid_shape"):
            assert torch.equal(getattr(m, key), getattr(ref, key)), key
        assert m.fields.keys() == ref.fields.keys()
        assert all(torch.equal(m.fields[k], ref.fields[k]) for k in m.fields)
        assert [t for t, _ in m.cells] == ["quad"]
        assert torch.equal(m.cells[0][1], ref.cells[0][1])
        assert m.sample_id == ref.sample_id == s and m.standin is False


def test_naca_fast_weights_leave_bad_cells_to_the_per_cell_path(naca_arrays):
    """The vectorised weights decline (None) every grid the per-cell path would change
    or reject: a repeated grid line (zero-area cells), a folded cell, and a cell that
    is only a sliver (area 1e-11 h^2: zero measure for quadrature_weights); on a
    valid grid they sum to the domain area."""
    from data_adapters.naca import _GRID_RULE
    X, Y = naca_arrays[0][3].copy(), naca_arrays[1][3].copy()
    assert _GRID_RULE.weights(X, Y) is not None
    rep_x, rep_y = np.insert(X, 101, X[100], axis=0), np.insert(Y, 101, Y[100], axis=0)
    assert _GRID_RULE.weights(rep_x, rep_y) is None
    fx, fy = X.copy(), Y.copy()
    fx[150, [10, 11]], fy[150, [10, 11]] = X[150, [11, 10]], Y[150, [11, 10]]
    assert _GRID_RULE.weights(fx, fy) is None
    sx, sy = X.copy(), Y.copy()
    # move line i = 101 onto i = 100 up to a relative 1e-11 of the cell size
    sx[101] = X[100] + 1e-11 * (X[101] - X[100])
    sy[101] = Y[100] + 1e-11 * (Y[101] - Y[100])
    assert _GRID_RULE.weights(sx, sy) is None


def _square_with_fields(root, name, **fields):
    """A 5 x 5-node triangulated square with the given point fields, written by meshio."""
    xs = np.linspace(0, 1, 5)
    pts = np.array([[x, y, 0.0] for y in xs for x in xs])
    idx = np.arange(25).reshape(5, 5)
    q = np.stack([idx[:-1, :-1], idx[:-1, 1:], idx[1:, 1:], idx[1:, :-1]], -1).reshape(-1, 4)
    tri = np.concatenate([q[:, [0, 1, 2]], q[:, [0, 2, 3]]])
    meshio.Mesh(pts, [("triangle", tri)], point_data=fields).write(root / name)
    return root / name


def test_folder_refuses_non_finite_inputs_and_targets(tmp_path):
    """NaN/inf in an input or target field is refused when the file is read, naming
    the file, the field, the first point (and component) and the value; fields that
    are neither inputs nor targets are not checked."""
    root = tmp_path / "nf"
    root.mkdir()
    f = np.linspace(0.0, 1.0, 25)
    good = _square_with_fields(root, "a.vtu", f=f, u=2 * f, g=np.stack([f, f], 1))
    u = 2 * f
    u[[9, 20]] = [np.inf, np.nan]
    bad_target = _square_with_fields(root, "b.vtu", f=f, u=u, g=np.stack([f, f], 1))
    g = np.stack([f, f], 1)
    g[17, 1] = -np.inf
    bad_vector = _square_with_fields(root, "c.vtu", f=f, u=2 * f, g=g, other=np.full(25, np.nan))
    ds = MeshFolderDataset(root, inputs=["f"], targets=["u"])  # a.vtu is checked here
    assert ds[0].source == str(good) and torch.isfinite(ds[0].y).all()
    with pytest.raises(MeshError, match=rf"^{bad_target}: target field 'u' has a non-finite "
                                        r"value \(inf\) at point 9 \(2 non-finite values"):
        ds[1]
    assert torch.isfinite(ds[2].x).all()  # 'other' (NaN) is not an input or target
    with pytest.raises(MeshError, match=rf"^{bad_vector}: input field 'g' has a non-finite "
                                        r"value \(-inf\) at point 17, component 1$"):
        MeshFolderDataset(root, inputs=["g"], targets=["u"])[2]
    f_nan = f.copy()
    f_nan[17] = np.nan
    first = tmp_path / "first"
    first.mkdir()
    _square_with_fields(first, "a.vtu", f=f_nan, u=2 * f)
    with pytest.raises(MeshError, match=r"a\.vtu: input field 'f' has a non-finite value "
                                        r"\(nan\) at point 17$"):
        MeshFolderDataset(first, inputs=["f"], targets=["u"])  # checked at construction


def test_naca_fast_weights_leave_a_folded_grid_to_the_per_cell_path():
    """A grid line pushed past its neighbour turns a whole column of cells over while
    each stays convex: the vectorised weights must decline it (they summed to 1.2 on
    the unit square), and the per-cell path refuses the overlap."""
    from data_adapters.naca import _GRID_RULE
    from meshops.mesh.quadrature import quadrature_weights, structured_grid_cells

    X, Y = np.meshgrid(np.linspace(0, 1, 6), np.linspace(0, 1, 6), indexing="ij")
    assert abs(_GRID_RULE.weights(X, Y).sum() - 1.0) < 1e-12
    X = X.copy()
    X[2, :] = 0.7                      # line 2 (x = 0.4) moved past line 3 (x = 0.6)
    assert _GRID_RULE.weights(X, Y) is None
    cells = [("quad", structured_grid_cells((6, 6)))]
    with pytest.raises(MeshError, match="overlap"):
        quadrature_weights(np.stack([X.ravel(), Y.ravel()], 1), cells)
