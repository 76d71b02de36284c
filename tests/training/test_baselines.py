"""The two baselines that need no training (meshops.training.baselines) on data where
the answer is known, scored like Trainer.evaluate, and in `meshops evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import square_mesh

from meshops import cli
from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays, write_mesh
from meshops.models import NeuralOperator, get_model
from meshops.training import Trainer
from meshops.training.baselines import correspondence, mean_field_baseline, nearest_sample_baseline
from meshops.training.splits import validation_split

F64 = torch.float64


def _rel_l2(pred, truth, w):
    """Plain reference: sqrt(sum_i w_i |p_i - t_i|^2 / sum_i w_i |t_i|^2), channels pooled."""
    pred, truth = np.asarray(pred, np.float64), np.asarray(truth, np.float64)
    w = np.asarray(w, np.float64)[:, None]
    return float(np.sqrt((w * (pred - truth) ** 2).sum() / (w * truth ** 2).sum()))


def _sample(pos, x, y, weight=None, **attrs):
    pos = torch.as_tensor(pos, dtype=F64)
    w = torch.as_tensor(weight, dtype=F64) if weight is not None else \
        torch.linspace(0.5, 1.5, pos.shape[0], dtype=F64)
    s = MeshData(pos=pos, weight=w, x=torch.as_tensor(x, dtype=F64),
                 y=torch.as_tensor(y, dtype=F64))
    for k, v in attrs.items():
        setattr(s, k, v)
    return s


def _fixed_mesh_set(n_samples, seed=0, n=40):
    """One fixed point cloud; input: two constant parameters (a, b); target
    u = a sin(pi x) + b y^2 and a second channel a * b."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0, 1, (n, 2))
    out = []
    for a, b in rng.uniform(0.5, 2.0, (n_samples, 2)):
        x = np.tile([a, b], (n, 1))
        y = np.stack([a * np.sin(np.pi * pos[:, 0]) + b * pos[:, 1] ** 2,
                      np.full(n, a * b)], 1)
        out.append(_sample(pos, x, y))
    return out


def test_mean_field_is_the_pointwise_training_mean():
    train, test = _fixed_mesh_set(6, seed=1), _fixed_mesh_set(4, seed=2)
    # The test set is drawn on another point cloud: move it onto the training one.
    for t in test:
        t.pos = train[0].pos.clone()
    res = mean_field_baseline(train, test)
    assert res.available and "fixed mesh of 40 points" in res.note
    mean = np.mean([s.y.numpy() for s in train], axis=0)
    for k, t in enumerate(test):
        w = t.weight.numpy()
        assert res.errors["l2"][k] == pytest.approx(_rel_l2(mean, t.y, w), rel=1e-12)
        assert res.errors["l2_unweighted"][k] == pytest.approx(
            _rel_l2(mean, t.y, np.ones_like(w)), rel=1e-12)
    assert res.summary()["l2"]["worst"] == pytest.approx(res.errors["l2"].max(), rel=1e-15)


def test_constant_targets_give_mean_error_zero():
    """Every sample has the same target field: the training mean is exact."""
    train = _fixed_mesh_set(5, seed=3)
    for s in train:
        s.y = train[0].y.clone()
    res = mean_field_baseline(train[:3], train[3:])
    assert res.available
    np.testing.assert_allclose(res.errors["l2"], 0.0, atol=1e-15)


def test_nearest_sample_by_input_means_is_exact_for_a_training_copy():
    train = _fixed_mesh_set(8, seed=4)
    test = [train[5].clone(), train[2].clone()]
    res = nearest_sample_baseline(train, test)
    assert res.nearest == [5, 2]
    np.testing.assert_allclose(res.errors["l2"], 0.0, atol=1e-15)
    np.testing.assert_allclose(res.errors["l2_unweighted"], 0.0, atol=1e-15)
    assert "2 input channel" in res.note


def test_nearest_sample_picks_the_closest_parameters():
    """Parameters (a, b) on two scales: the standardised distance decides, and the
    error is that of the chosen training sample's targets."""
    train = _fixed_mesh_set(10, seed=5)
    test = _fixed_mesh_set(3, seed=6)
    for t in test:
        t.pos = train[0].pos.clone()
    res = nearest_sample_baseline(train, test)
    d_tr = np.array([s.x[0].numpy() for s in train])
    d_te = np.array([s.x[0].numpy() for s in test])
    scale = d_tr.std(0)
    expect = [int(np.argmin(np.linalg.norm((d - d_tr) / scale, axis=1))) for d in d_te]
    assert res.nearest == expect
    for k, (t, i) in enumerate(zip(test, expect)):
        assert res.errors["l2"][k] == pytest.approx(
            _rel_l2(train[i].y, t.y, t.weight), rel=1e-12)


def test_meshes_that_differ():
    """Point clouds of different sizes: no mean field; geometry-only nearest sample by
    the Chamfer distance, exact for a training cloud given in another point order."""
    rng = np.random.default_rng(7)
    train = []
    for n in (30, 35, 40, 45):
        pos = rng.uniform(0, 1, (n, 2))
        train.append(_sample(pos, np.zeros((n, 0)), (pos[:, :1] + n) ** 2))
    perm = rng.permutation(40)
    test = [_sample(train[2].pos[perm], np.zeros((40, 0)), train[2].y[perm],
                    weight=train[2].weight[perm])]
    mean = mean_field_baseline(train, test)
    assert not mean.available and mean.note == "n/a: meshes differ: 30 to 45 points per sample"
    near = nearest_sample_baseline(train, test)
    assert near.nearest == [2] and "Chamfer" in near.note
    np.testing.assert_allclose(near.errors["l2"], 0.0, atol=1e-15)


def test_moved_points_and_structured_grids():
    """Same number of points at other positions: not one mesh, unless the samples are
    structured grids of one shape (matched node by node, as the NACA C-grids)."""
    pos = np.random.default_rng(8).uniform(0, 1, (12, 2))
    a = _sample(pos, np.zeros((12, 0)), pos[:, :1] + 1)
    b = _sample(pos + 0.1, np.zeros((12, 0)), pos[:, :1] + 2)
    how, why = correspondence([a, b])
    assert how is None and "points move by up to 0.1" in why
    # float32 round-off of the same positions is the same mesh
    c = _sample(torch.as_tensor(pos).float().double(), np.zeros((12, 0)), pos[:, :1] + 3)
    assert correspondence([a, c])[0] == "positions"
    for s in (a, b):
        s.grid_shape = torch.tensor([[4, 3]])
    how, why = correspondence([a, b])
    assert how == "grid" and "4 x 3" in why
    res = mean_field_baseline([a], [b])
    assert res.errors["l2"][0] == pytest.approx(_rel_l2(a.y, b.y, b.weight), rel=1e-12)
    # geometry-only nearest sample on grids: RMS distance between matched nodes
    far = _sample(pos + 0.5, np.zeros((12, 0)), pos[:, :1] + 9, grid_shape=a.grid_shape)
    near = nearest_sample_baseline([far, a], [b])
    assert near.nearest == [1] and "matched points" in near.note


def test_same_metric_as_trainer_evaluate():
    """A model that predicts exactly the training mean scores what the baseline scores
    under Trainer.evaluate (float64): the two use one metric."""
    train, test = _fixed_mesh_set(6, seed=9), _fixed_mesh_set(3, seed=10)
    for t in test:
        t.pos = train[0].pos.clone()
    res = mean_field_baseline(train, test)

    model = get_model("transformer_no", in_channels=2, out_channels=2, pos_dim=2, width=8,
                      layers=1, heads=2).double()
    mean = torch.stack([s.y for s in train]).mean(0)
    model.forward = lambda batch: mean.repeat(batch.num_graphs, 1)  # no normalisers
    trainer = Trainer(model, train, test, epochs=1, batch_size=2, normalize=False,
                      progress=False, log=None, device="cpu")
    val = trainer.evaluate()
    assert val["l2_mean"] == pytest.approx(res.errors["l2"].mean(), rel=1e-12)
    assert val["l2_max"] == pytest.approx(res.errors["l2"].max(), rel=1e-12)
    assert val["l2_unweighted_median"] == pytest.approx(
        np.median(res.errors["l2_unweighted"]), rel=1e-12)


def test_validation_split_is_deterministic_and_disjoint():
    tr, va = validation_split(50, 0.1, seed=3)
    assert len(va) == 5 and sorted(tr + va) == list(range(50))
    assert validation_split(50, 0.1, seed=3) == (tr, va)
    assert validation_split(50, 0.1, seed=4)[1] != va
    assert validation_split(7, 0.0) == (list(range(7)), [])
    with pytest.raises(ValueError, match="1 sample.*cannot be split"):
        validation_split(1, 0.5)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\), got 1.0"):
        validation_split(10, 1.0)


# ------------------------------------------------------------------ meshops evaluate
def _write_fixed_folder(root: Path, params) -> Path:
    """One square mesh; input field f = a (constant), target u = a sin(pi x) + y."""
    root.mkdir(parents=True, exist_ok=True)
    pts, cells = square_mesh(6, "triangle")
    for k, a in enumerate(params):
        f = np.full(len(pts), a)
        u = a * np.sin(np.pi * pts[:, 0]) + pts[:, 1]
        write_mesh(root / f"s{k:02d}.vtu", mesh_from_arrays(pts, cells, {"f": f, "u": u}))
    return root


def test_evaluate_reports_both_baselines(tmp_path, capsys):
    params = np.linspace(0.5, 3.0, 10)
    data = _write_fixed_folder(tmp_path / "train", params)
    test_params = [0.6, 2.9, 1.7]
    test = _write_fixed_folder(tmp_path / "test", test_params)
    run = tmp_path / "run"
    assert cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u",
                     "--model", "transformer_no", "--model-config", "width=8", "layers=1",
                     "heads=2", "--epochs", "1", "--val-fraction", "0.2", "--out",
                     str(run)]) == 0
    capsys.readouterr()
    assert cli.main(["evaluate", str(run), "--data", str(test), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)

    meta = NeuralOperator.from_checkpoint(run / "best.pt").metadata
    train_k = [int(Path(n).stem[1:]) for n in meta["split"]["train"]]
    assert len(train_k) == 8
    from meshops.mesh.io import read_mesh
    mesh = read_mesh(test / "s00.vtu")
    x, y, w = mesh.pos[:, 0].numpy(), mesh.pos[:, 1].numpy(), mesh.weight.numpy()
    truth = [a * np.sin(np.pi * x) + y for a in test_params]
    mean = np.mean([params[k] * np.sin(np.pi * x) + y for k in train_k], axis=0)
    ref_mean = [_rel_l2(mean[:, None], t[:, None], w) for t in truth]
    nearest = [min(train_k, key=lambda k: abs(params[k] - a)) for a in test_params]
    ref_near = [_rel_l2((params[k] * np.sin(np.pi * x) + y)[:, None], t[:, None], w)
                for k, t in zip(nearest, truth)]
    base = res["baselines"]
    assert base["training mean"]["u"]["l2"]["mean"] == pytest.approx(np.mean(ref_mean),
                                                                      rel=1e-6)
    assert base["training mean"]["u"]["l2"]["max"] == pytest.approx(max(ref_mean), rel=1e-6)
    assert base["nearest training sample"]["u"]["l2"]["mean"] == pytest.approx(
        np.mean(ref_near), rel=1e-6)
    assert base["nearest training sample"]["u"]["l2"]["worst_sample"] == \
        f"s{int(np.argmax(ref_near)):02d}.vtu"

    # The text table names both; --no-baselines leaves them out.
    assert cli.main(["evaluate", str(run), "--data", str(test)]) == 0
    text = capsys.readouterr().out
    assert "baseline: training mean" in text and "baseline: nearest training sample" in text
    assert f"{np.mean(ref_mean):.4e}" in text
    assert cli.main(["evaluate", str(run), "--data", str(test), "--json",
                     "--no-baselines"]) == 0
    assert "baselines" not in json.loads(capsys.readouterr().out)

    # Training data gone: the baselines say so instead of failing.
    data.rename(tmp_path / "moved")
    assert cli.main(["evaluate", str(run), "--data", str(test), "--json"]) == 0
    note = json.loads(capsys.readouterr().out)["baselines"]["training mean"]["note"]
    assert note == f"n/a: the training data {data} is not here"


def test_baseline_errors_leave_zero_targets_out_instead_of_raising():
    """A test sample whose target is zero everywhere has no relative error: the
    baselines' per-sample errors mark it NaN, and the statistics are over the other
    samples with the count left out (issue 12 item 6)."""
    import numpy as np

    from meshops.mesh.data import MeshData
    from meshops.training.baselines import error_stats, format_table, per_sample_errors

    pos = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    w = torch.full((3,), 1 / 3, dtype=torch.float64)
    f64 = torch.float64
    truth = [torch.tensor([[1.0], [2.0], [3.0]], dtype=f64), torch.zeros(3, 1, dtype=f64)]
    samples = [MeshData(pos=pos, weight=w, y=y) for y in truth]
    preds = [torch.tensor([[1.0], [2.0], [4.0]], dtype=f64), torch.ones(3, 1, dtype=f64)]
    err = per_sample_errors(preds, samples)
    expected = 1.0 / np.sqrt(1 + 4 + 9)          # ||(0,0,1)|| / ||(1,2,3)||, equal weights
    assert abs(err["l2"][0] - expected) < 1e-14 and np.isnan(err["l2"][1])
    st = error_stats(err["l2"])
    assert st["undefined"] == 1
    assert abs(st["mean"] - expected) < 1e-14 and abs(st["worst"] - expected) < 1e-14
    assert "1 samples with a zero target left out" in format_table([("m", st, "")], "l2")


def test_pod_rbf_with_one_training_sample_is_not_available():
    # issue 28: one training sample (e.g. the TensorBoard logger's baselines of a tiny
    # run) raised "pod_basis: need snapshots [S >= 2, M, C]"
    from meshops.training.baselines import baselines

    train, test = _fixed_mesh_set(1, seed=1), _fixed_mesh_set(3, seed=1)[1:]
    mean, nearest, pod = baselines(train, test)
    assert not pod.available
    assert pod.note == "n/a: a POD needs at least 2 training samples, got 1"
    # the other two need no more than one: the training sample itself
    for b in (mean, nearest):
        assert b.available and torch.equal(b.predictions[0], train[0].y)
