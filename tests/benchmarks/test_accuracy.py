"""The accuracy benchmark's metric, classical predictors, reader and report
(benchmarks.accuracy); data made here, never the real sets."""

from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pytest
import torch

from benchmarks.accuracy import classical, metric
from benchmarks.accuracy.folder import Sample, list_files, read_split
from benchmarks.accuracy.report import markdown_table, verdict
from benchmarks.accuracy.run import run_dataset

SQUARE = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
TWO = np.array([[0, 1, 2], [0, 2, 3]])


def _grid(n):
    t = np.linspace(0.0, 1.0, n)
    X, Y = np.meshgrid(t, t, indexing="ij")
    pts = np.stack([X.ravel(), Y.ravel()], 1)
    tri = [[i * n + j, (i + 1) * n + j, (i + 1) * n + j + 1] for i in range(n - 1)
           for j in range(n - 1)]
    tri += [[i * n + j, (i + 1) * n + j + 1, i * n + j + 1] for i in range(n - 1)
            for j in range(n - 1)]
    return pts, np.asarray(tri)


# --------------------------------------------------------------------- metric
def test_lumped_weights_of_two_triangles_and_exact_for_linear_fields():
    np.testing.assert_allclose(metric.lumped_mass_weights(SQUARE, TWO),
                               [1 / 3, 1 / 6, 1 / 3, 1 / 6], rtol=1e-15)
    pts, tri = _grid(7)
    pts = pts * [2.0, 0.5] + [1.0, -3.0]
    w = metric.lumped_mass_weights(pts, tri)
    assert w.sum() == pytest.approx(1.0, rel=1e-14)
    # integral of x over [1, 3] x [-3, -2.5] = 0.5 * (9 - 1) / 2 = 2
    assert (w * pts[:, 0]).sum() == pytest.approx(2.0, rel=1e-14)


def _kuhn(n, keep=lambda centre: True):
    """The cube ``[0, 1]^3`` in ``n^3`` cubes of six tetrahedra each (Kuhn's: every path
    from a cube's corner 000 to 111 along its edges), the cubes whose centre ``keep``
    refuses left out (a cavity)."""
    from itertools import permutations

    t = np.linspace(0.0, 1.0, n + 1)
    pts = np.stack(np.meshgrid(t, t, t, indexing="ij"), -1).reshape(-1, 3)
    index = np.arange((n + 1) ** 3).reshape(n + 1, n + 1, n + 1)
    tets = []
    for corner in np.ndindex(n, n, n):
        if not keep((np.asarray(corner) + 0.5) / n):
            continue
        for order in permutations(range(3)):
            path, at = [np.asarray(corner)], np.asarray(corner).copy()
            for axis in order:
                at = at.copy()
                at[axis] += 1
                path.append(at)
            tets.append([index[tuple(v)] for v in path])
    return pts, np.asarray(tets)


def test_lumped_weights_of_tetrahedra_and_of_a_surface_in_space():
    """One cube in Kuhn's six tetrahedra of volume 1/6: the two corners on the diagonal
    are in all six (6 / 24 = 1/4), the other six corners in two each (1/12); a triangle
    in space gets its true area, not its shadow on the plane."""
    pts, tets = _kuhn(1)
    w = metric.lumped_mass_weights(pts, tets)
    diagonal = (pts == 0).all(1) | (pts == 1).all(1)
    np.testing.assert_allclose(w[diagonal], 1 / 4, rtol=1e-14)
    np.testing.assert_allclose(w[~diagonal], 1 / 12, rtol=1e-14)
    pts, tets = _kuhn(4)
    pts = pts * [2.0, 1.0, 0.5]
    w = metric.lumped_mass_weights(pts, tets)
    assert w.sum() == pytest.approx(1.0, rel=1e-14)
    assert (w * pts[:, 0]).sum() == pytest.approx(1.0, rel=1e-14)  # integral of x
    tilted = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    np.testing.assert_allclose(metric.lumped_mass_weights(tilted, [[0, 1, 2]]),
                               math.sqrt(2) / 2 / 3, rtol=1e-14)
    with pytest.raises(ValueError, match="tetrahedra"):
        metric.lumped_mass_weights(SQUARE, [[0, 1, 2, 3]])


def test_relative_l2_pools_the_channels_by_hand():
    """weights (1/3, 1/6, 1/3, 1/6); channel 1 true 1 everywhere, off by 1 at node 0;
    channel 2 true 3 at node 3 only, exact. Pooled: sqrt((1/3) / (1 + 9/6)) = sqrt(2/15);
    the mean of the per-channel errors would be sqrt(1/3) / 2."""
    w = metric.lumped_mass_weights(SQUARE, TWO)
    true = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 3.0]])
    pred = true.copy()
    pred[0, 0] = 2.0
    assert metric.relative_l2(pred, true, w) == pytest.approx(math.sqrt(2 / 15), rel=1e-14)
    rng = np.random.default_rng(0)
    t = rng.normal(size=(4, 3))
    assert metric.relative_l2(1.25 * t, t, w) == pytest.approx(0.25, rel=1e-14)
    assert math.isnan(metric.relative_l2(t, np.zeros((4, 3)), w))
    with pytest.raises(ValueError, match="differ in shape"):
        metric.relative_l2(np.zeros((4, 2)), np.zeros((4, 3)), w)


def test_summary_leaves_undefined_errors_out():
    s = metric.summarize([0.1, 0.3, float("nan"), 0.2])
    assert s == {"mean": pytest.approx(0.2), "median": pytest.approx(0.2),
                 "worst": pytest.approx(0.3), "n": 3, "undefined": 1}


# ------------------------------------------------------------------ classical
def _family(params, pts, tri, fields):
    """Samples with constant parameter fields and the given [N, C] targets."""
    w = metric.lumped_mass_weights(pts, tri)
    return [Sample(f"s{k}.vtu", pts, tri, np.tile(p, (len(pts), 1)), f, w)
            for k, (p, f) in enumerate(zip(params, fields))]


def test_pod_rbf_is_exact_on_a_rank_two_family_linear_in_the_parameters():
    """Targets a(mu) phi1 + b(mu) phi2 with a, b linear in mu: two modes carry the family
    and the thin-plate RBF reproduces linear functions, so POD + RBF (meshops', called on
    the benchmark's arrays) is exact; its note gives the rank."""
    pts, tri = _grid(6)
    phi1 = np.stack([np.sin(3 * pts[:, 0]), pts[:, 1] ** 2], 1)
    phi2 = np.stack([np.cos(pts[:, 1]), pts[:, 0] * pts[:, 1]], 1)
    rng = np.random.default_rng(1)
    P = rng.uniform(-1, 1, (40, 2))
    F = [(m[0] + 2 * m[1] + 3) * phi1 + (3 - m[1]) * phi2 for m in P]
    train, test = _family(P[:30], pts, tri, F[:30]), _family(P[30:], pts, tri, F[30:])
    for pred, s in zip(classical.pod_rbf(train, test), test):
        assert metric.relative_l2(pred, s.targets, s.weight) < 1e-8
    assert classical.LAST_NOTE[0].startswith("2 POD mode(s)")
    mean = classical.training_mean(train, test)[0]
    np.testing.assert_allclose(mean, np.mean(F[:30], axis=0), rtol=1e-12)


def test_nearest_sample_picks_by_standardised_parameters_and_moves_between_meshes():
    pts, tri = _grid(5)
    # parameter 2 spans 1000x the range of parameter 1: unstandardised it would decide
    P = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1000.0]])
    fields = [np.full((len(pts), 1), k + 1.0) for k in range(3)]
    train = _family(P, pts, tri, fields)
    test = _family(np.array([[0.9, 300.0]]), pts, tri, [np.zeros((len(pts), 1))])
    np.testing.assert_array_equal(classical.nearest_sample(train, test)[0], fields[1])
    # another mesh of the square: a linear field arrives exactly (P1 interpolation)
    lin = [(2 * pts[:, :1] - pts[:, 1:]) * (k + 1) for k in range(3)]
    train = _family(P, pts, tri, lin)
    p2, t2 = _grid(8)
    test = _family(np.array([[1.0, 10.0]]), p2, t2, [np.zeros((len(p2), 1))])
    np.testing.assert_allclose(classical.nearest_sample(train, test)[0],
                               2 * (2 * p2[:, :1] - p2[:, 1:]), atol=1e-12)
    with pytest.raises(classical.NotApplicable, match="meshes differ: 25 to 64 points"):
        classical.pod_rbf(train, test)
    # the mean of the training fields, each carried over to the test mesh: exact for
    # linear fields, (1 + 2 + 3) / 3 = 2 times the field
    np.testing.assert_allclose(classical.training_mean(train, test)[0],
                               2 * (2 * p2[:, :1] - p2[:, 1:]), atol=1e-12)


def test_nearest_sample_looks_up_by_the_global_inputs_when_the_training_set_says_so():
    """A family whose answer is the load times a fixed field, with four shape parameters
    that change nothing: looked up by all five parameters, the nearest sample is mostly
    the nearest shape; the training samples' own leave-one-out errors choose the load
    (the one input constant over each mesh), and the note says so."""
    pts, tri = _grid(5)
    rng = np.random.default_rng(4)
    phi = np.stack([1 + pts[:, 0], pts[:, 1] ** 2], 1)
    loads, shapes = rng.uniform(1, 10, 40), rng.uniform(-1, 1, (40, 4))

    def samples(idx):
        w = metric.lumped_mass_weights(pts, tri)
        return [Sample(f"s{k}.vtu", pts, tri, np.full((len(pts), 1), loads[k]),
                       loads[k] * phi, w, np.r_[shapes[k], loads[k]]) for k in idx]

    train, test = samples(range(30)), samples(range(30, 40))
    preds = classical.nearest_sample(train, test)
    assert classical.LAST_NOTE[0].startswith("by the global inputs (leave-one-out error")
    for pred, s in zip(preds, test):
        k = int(np.argmin(np.abs(loads[:30] - loads[int(s.name[1:-4])])))
        np.testing.assert_array_equal(pred, loads[k] * phi)
    # files of the same names whose answer is the first shape parameter's: their own
    # choice, not the last set's
    for s in train + test:
        s.targets = (2 + s.given_params[0]) * phi
    classical.nearest_sample(list(train), test)
    assert classical.LAST_NOTE[0].startswith("by the parameters (leave-one-out error")


# ----------------------------------------------------- folders and one data set
def _write_set(root, n=12, n_test=4):
    from data_adapters.parametric import ParametricSet, parametric_sample, write_parametric_folders

    pts, tri = _grid(5)
    rng = np.random.default_rng(3)
    P = rng.uniform(0.5, 2.0, (n, 2))
    samples = [parametric_sample(pts, tri, ["a", "b"], p,
                                 {"u": p[0] * pts[:, 0] + p[1], "v": p[1] * pts[:, 1]},
                                 f"test sample {k}", torch.float64, k)
               for k, p in enumerate(P)]
    ds = ParametricSet("tiny", samples, ["a", "b"], ["u", "v"], list(range(n - n_test)),
                       list(range(n - n_test, n)), description="tiny test set")
    return write_parametric_folders(ds, root, progress=False), P


def test_classical_predictors_are_computed_once_for_all_seeds(tmp_path, monkeypatch):
    """No seed enters the classical predictors: with ``--seeds`` (one ``classical_cache``
    shared by the seeds' arguments) the second seed reuses the first's scores."""
    root, _ = _write_set(tmp_path / "tiny")
    calls = []
    mean = classical.training_mean
    monkeypatch.setattr(classical, "training_mean",
                        lambda train, test: calls.append(len(test)) or mean(train, test))
    cache = {}
    res = [run_dataset("tiny", root, ["mean"], types.SimpleNamespace(
        minutes=0.1, threads=1, seed=seed, grace=1.2, peers_python="", classical_cache=cache),
        tmp_path / f"w{seed}", lambda line: None)["models"]["mean"] for seed in (0, 1)]
    assert calls == [4]
    assert res[1]["errors"] == res[0]["errors"] and res[1]["mean"] == res[0]["mean"]
    assert "computed once for every seed" in res[1]["note"] and "note" not in res[0]


def test_reuse_takes_back_a_kept_classical_result_only_for_the_same_arrays(tmp_path,
                                                                          monkeypatch):
    """With --keep, a classical predictor's result is written beside the runs; --reuse
    takes it back instead of recomputing it, unless an array it read has changed."""
    root, _ = _write_set(tmp_path / "tiny")
    calls = []
    mean = classical.training_mean
    monkeypatch.setattr(classical, "training_mean",
                        lambda train, test: calls.append(len(test)) or mean(train, test))

    def run(reuse):
        args = types.SimpleNamespace(minutes=0.1, threads=1, seed=0, grace=1.2,
                                     peers_python="", reuse=reuse)
        return run_dataset("tiny", root, ["mean"], args, tmp_path / "w",
                           lambda line: None)["models"]["mean"]

    first = run(False)
    assert calls == [4] and (tmp_path / "w" / "mean-result.json").is_file()
    again = run(True)
    assert calls == [4], "the kept result was recomputed"
    assert again["errors"] == first["errors"] and "reused from mean-result.json" in again["note"]
    assert run(False)["errors"] == first["errors"] and calls == [4, 4]
    # a changed truth on one test mesh: the kept result no longer applies
    import meshio
    f = root / "test" / "sample_0009.vtu"
    m = meshio.read(f)
    m.point_data["u"] = m.point_data["u"] + 1.0
    meshio.write(f, m)
    changed = run(True)
    assert calls == [4, 4, 4] and "note" not in changed
    assert changed["errors"] != first["errors"]


def test_the_deadline_holds_until_a_peer_says_it_has_trained():
    """A peer's process trains, then predicts the test and re-meshed files (minutes on a
    3-D family whatever the budget): the deadline stops it while it trains, never after
    it printed the end of training."""
    import os

    from benchmarks.accuracy.meshops_cli import run_subprocess
    from benchmarks.accuracy.peer_train import TRAINED

    lines = []
    after = f"import time; print('gino: {TRAINED}: 2 test', flush=True); time.sleep(2.5)"
    rc, wall, stopped = run_subprocess([sys.executable, "-c", after], dict(os.environ),
                                       lines.append, deadline_s=0.5, deadline_until=TRAINED)
    assert (rc, stopped) == (0, False) and wall >= 2.5 and TRAINED in lines[0]
    rc, wall, stopped = run_subprocess([sys.executable, "-c", "import time; time.sleep(20)"],
                                       dict(os.environ), lines.append, deadline_s=0.5,
                                       deadline_until=TRAINED)
    assert stopped and rc != 0 and wall < 10


def test_a_reused_peer_has_no_wall_time_rather_than_zero_seconds(tmp_path, monkeypatch):
    """--reuse takes back a peer's kept predictions without running it: its time was the
    earlier run's, so the result carries none (the table prints "-"), not 0 s."""
    from benchmarks.accuracy import run as run_mod
    from benchmarks.accuracy.report import console_table

    work = tmp_path / "w"
    work.mkdir()
    np.savez(work / "transolver.npz", a=np.zeros(3))
    keys = ("steps", "epochs", "batch", "accumulate", "validate_every", "best_step",
            "best_val", "stopped_at_budget", "threads", "torch")
    (work / "transolver.json").write_text(json.dumps(
        {"train_wall_s": 12.0, "parameters": 5, "config": {}, "history": [],
         **{k: 1 for k in keys}}))
    monkeypatch.setattr(run_mod, "run_subprocess",
                        lambda *a, **k: pytest.fail("a kept peer was run again"))
    monkeypatch.setattr(run_mod, "score", lambda own, test, columns: {
        "mean": 0.5, "median": 0.5, "worst": 1.0})
    monkeypatch.setattr(run_mod, "score_remeshed", lambda *a: None)
    args = types.SimpleNamespace(epochs=5, threads=1, seed=0, minutes=None,
                                 peers_python=sys.executable, reuse=True)
    out = run_mod._peer("transolver", tmp_path, {"inputs": ["a"], "targets": ["u"]}, [], [],
                        [], {}, args, work, lambda line: None, {})
    assert out["wall_s"] is None and out["train_wall_s"] == 12.0
    doc = _doc()
    doc["datasets"]["one"]["models"]["transolver"] = out
    line = next(x for x in console_table(doc).splitlines()
                if x.strip().startswith("Transolver"))
    assert line.split()[1:5] == ["0.5", "0.5", "1", "-"]


def test_meshops_and_the_peers_are_stopped_at_the_same_deadline(tmp_path, monkeypatch):
    """One stopping rule: under ``--minutes`` every trained model's process is stopped at
    grace x budget + the allowance for set-up, meshops' training and a peer's run alike;
    under ``--epochs`` none is stopped."""
    from benchmarks.accuracy import meshops_cli
    from benchmarks.accuracy import run as run_mod
    root, _ = _write_set(tmp_path / "tiny")
    seen = []

    def fake(cmd, env, log, deadline_s=None, deadline_until=None):
        seen.append((cmd[2] if cmd[2] != "-m" else cmd[3], deadline_s))
        return 1, 0.0, False

    monkeypatch.setattr(meshops_cli, "run_subprocess", fake)
    monkeypatch.setattr(run_mod, "run_subprocess", fake)
    for epochs in (None, 5):
        seen.clear()
        args = types.SimpleNamespace(minutes=0.5, threads=1, seed=0, grace=2.0,
                                     peers_python=sys.executable, epochs=epochs)
        res = run_dataset("tiny", root, ["meshops", "transolver"], args, tmp_path / "w",
                          lambda line: None)
        assert "exited 1" in res["models"]["meshops"]["note"]
        assert "exited 1" in res["models"]["transolver"]["note"]
        stops = [d for _, d in seen]
        assert len(stops) == 2
        expect = None if epochs else 0.5 * 60 * 2.0 + meshops_cli.ALLOWANCE_S
        assert stops == [expect, expect]


def test_read_split_gives_the_written_arrays_in_natural_order(tmp_path):
    root, P = _write_set(tmp_path / "tiny", n=12)
    names = list_files(root / "train")
    assert names == [f"sample_{k:04d}.vtu" for k in range(8)]
    s = read_split(root, "test", ["a", "b"], ["u", "v"])[1]
    assert s.name == "sample_0009.vtu"
    np.testing.assert_allclose(s.params, P[9], rtol=1e-15)
    np.testing.assert_allclose(s.targets[:, 0], P[9, 0] * s.points[:, 0] + P[9, 1], rtol=1e-14)


def test_run_dataset_scores_every_model_with_the_metric(tmp_path):
    root, _ = _write_set(tmp_path / "tiny")
    args = types.SimpleNamespace(minutes=0.1, threads=1, seed=0, grace=1.2, peers_python="")
    res = run_dataset("tiny", root, ["mean", "nearest", "pod_rbf"], args, tmp_path / "w",
                      lambda line: None)
    test = read_split(root, "test", ["a", "b"], ["u", "v"])
    train = read_split(root, "train", ["a", "b"], ["u", "v"])
    mean = np.mean([s.targets for s in train], axis=0)
    # every target field its own relative error (u, v), the sample's the mean of them
    per_field = np.array([[metric.relative_l2(mean[:, [c]], s.targets[:, [c]], s.weight)
                           for c in (0, 1)] for s in test])
    expect = per_field.mean(1)
    r = res["models"]["mean"]
    np.testing.assert_allclose(r["errors"], expect, rtol=1e-6)
    assert r["mean"] == pytest.approx(np.mean(expect), rel=1e-6)
    assert r["worst"] == pytest.approx(max(expect), rel=1e-6)
    for c, f in enumerate(("u", "v")):
        np.testing.assert_allclose(r["fields"][f]["errors"], per_field[:, c], rtol=1e-6)
    # pooled, the larger field would hide the other: the two fields' errors differ
    pooled = [metric.relative_l2(mean, s.targets, s.weight) for s in test]
    assert not np.allclose(pooled, expect, rtol=1e-3)
    # the family is linear in the parameters: POD + RBF nails it, the others do not
    assert res["models"]["pod_rbf"]["worst"] < 1e-6 < res["models"]["nearest"]["mean"]
    assert res["train"] == 8 and res["test"] == 4 and res["nodes"] == 25


def test_peer_validation_split_is_meshops_trains():
    from benchmarks.accuracy.meshops_cli import split_of_run
    from meshops.fitting.config import TrainConfig
    from meshops.training.splits import validation_split

    d = TrainConfig()
    assert split_of_run(None, 50) == validation_split(50, d.val_fraction, d.seed)
    assert split_of_run("val_fraction: 0.5\nseed: 3\n", 10) == validation_split(10, 0.5, 3)
    # a peer run without meshops beside it takes the split meshops' run of its seed draws
    assert split_of_run(None, 50, seed=2) == validation_split(50, d.val_fraction, 2)
    assert split_of_run(None, 50, seed=2) != split_of_run(None, 50)
    assert split_of_run("seed: 3\n", 10, seed=2) == validation_split(10, d.val_fraction, 3)


def test_peer_probe_trains_on_meshops_split_and_never_reads_the_test_files(tmp_path):
    """A peer's recipe probe: the training and validation files are those ``meshops train``
    uses, no test file, CPU seconds as the budget, the recipe in place of CONFIGS'."""
    from benchmarks.accuracy.meshops_cli import split_of_run
    from benchmarks.peer_probe import parse_args, probe_job

    root, _ = _write_set(tmp_path / "tiny")
    args = parse_args(["--data", str(root), "--model", "transolver", "--batch-size", "4",
                       "--lr", "3e-3", "--scheduler", "cosine", "--peers-python", "python",
                       "--out", str(tmp_path / "p.jsonl")])
    job = probe_job(root, args, tmp_path)
    tr, va = split_of_run(None, 8)
    names = list_files(root / "train")
    assert job["train"] == [names[i] for i in tr] and job["val"] == [names[i] for i in va]
    assert job["test"] == [] and job["clock"] == "cpu" and job["threads"] == 1
    assert job["config"] == {"batch": 4, "lr": 3e-3, "schedule": "cosine"}
    assert job["fields"] == {"u": [0], "v": [1]}


def test_peer_probe_shrinks_the_peer_by_known_keys_only(tmp_path, capsys):
    """``--set KEY=JSON`` changes the peer's configuration in the probe's job (the shrink a
    budget asks for); a key the peer's configuration lacks stops it by name, and a value
    that is no JSON is refused."""
    from benchmarks.peer_probe import main, parse_args, probe_job

    root, _ = _write_set(tmp_path / "tiny")
    base = ["--data", str(root), "--model", "gino", "--batch-size", "1", "--lr", "3e-3",
            "--scheduler", "step", "--peers-python", "python", "--out", str(tmp_path / "p")]
    args = parse_args(base + ["--set", "fno_hidden_channels=32",
                              "out_gno_channel_mlp_hidden_layers=[128,128]"])
    job = probe_job(root, args, tmp_path)
    assert job["config"] == {"fno_hidden_channels": 32,
                             "out_gno_channel_mlp_hidden_layers": [128, 128],
                             "batch": 1, "lr": 3e-3, "schedule": "step"}
    with pytest.raises(SystemExit, match=r"\['fno_width'\] are not keys of gino's"):
        main(base + ["--set", "fno_width=32"])
    with pytest.raises(SystemExit):
        parse_args(base + ["--set", "out_gno_channel_mlp_hidden_layers=[128"])
    assert "expected KEY=JSON" in capsys.readouterr().err


def test_a_variant_of_meshops_default_goes_to_its_model_config(tmp_path, monkeypatch):
    """``--meshops-config KEY=VALUE`` trains the default model with those keys changed:
    they reach ``meshops train --model-config``, and the result says so."""
    from benchmarks.accuracy import meshops_cli

    seen = []
    monkeypatch.setattr(meshops_cli, "run_subprocess",
                        lambda cmd, *a, **k: (seen.append(cmd), (1, 0.0, False))[1])
    for w in ("w", "v"):
        (tmp_path / w).mkdir()
    out = meshops_cli.run_meshops(tmp_path, ["a"], ["u"], 1.0, tmp_path / "w", {},
                                  lambda line: None, 1.2, model_config=["slices=8"])
    assert seen[0][-2:] == ["--model-config", "slices=8"]
    assert out["commands"][0].endswith("--model-config slices=8")
    plain = meshops_cli.run_meshops(tmp_path, ["a"], ["u"], 1.0, tmp_path / "v", {},
                                    lambda line: None, 1.2)
    assert "--model-config" not in plain["commands"][0]


# ------------------------------------------------------------------- report
def _doc():
    def r(m):
        return {"mean": m, "median": m, "worst": 2 * m, "errors": [m]}
    return {"schema": "meshops-accuracy-1", "command": "python -m benchmarks.accuracy",
            "minutes": 10, "threads": 2, "machine": {"cpu": "cpu"},
            "load": {"start": 1.0, "end": 1.5}, "started": "a", "finished": "b",
            "datasets": {
                "one": {"train": 4, "test": 2, "nodes": 9, "inputs": ["a"], "targets": ["u"],
                        "models": {"meshops": r(0.02), "mean": r(1.0), "pod_rbf": r(0.01),
                                   "gino": {"note": "gino runner exited 1"}}},
                "two": {"train": 4, "test": 2, "nodes": [9, 12], "inputs": ["a"],
                        "targets": ["u"],
                        "models": {"meshops": r(0.02), "mean": {"note": "n/a: one mesh per "
                                                                         "sample"},
                                   "pod_rbf": {"note": "n/a: one mesh per sample"}}}}}


def test_markdown_table_bolds_the_best_and_says_where_meshops_loses():
    md = markdown_table(_doc())
    rows = [line for line in md.splitlines() if line.startswith("| one")]
    assert "**0.01**" in rows[0] and "| 0.02 (median" in rows[0] and "| failed |" in rows[0]
    assert "| n/a |" in [line for line in md.splitlines() if line.startswith("| two")][0]
    assert "- one: meshops is behind POD + RBF by 2x (0.02 vs 0.01)" in md
    assert "- two: meshops: nothing to compare with" in md
    assert verdict(_doc()["datasets"]["one"]).startswith("meshops is behind POD + RBF")
    # the same method to 0.1 %: level, said as such, neither a loss nor a win
    tie = {"models": {"meshops": {"mean": 2.0680e-5}, "pod_rbf": {"mean": 2.0679e-5},
                      "nearest": {"mean": 0.0081}}}
    assert verdict(tie) == "meshops is level with POD + RBF (2.068e-05 vs 2.068e-05), within 0.1 %"
    # 0.33 % is no longer level (the Navier-Stokes step's 2.0680e-05 against 2.0611e-05)
    behind = {"models": {"meshops": {"mean": 2.0680e-5}, "pod_rbf": {"mean": 2.0611e-5}}}
    assert verdict(behind) == "meshops is behind POD + RBF by 0.33 % (2.068e-05 vs 2.061e-05)"


def test_several_fields_get_a_row_each_and_a_verdict_each():
    """A family with velocity and pressure: a row per field and one for their mean, each
    with its own best and verdict (meshops may win the pressure and lose the velocity)."""
    def r(uv, p):
        m = (uv + p) / 2
        return {"mean": m, "median": m, "worst": m, "errors": [m],
                "fields": {"u+v": {"mean": uv, "median": uv, "worst": uv},
                           "p": {"mean": p, "median": p, "worst": p}}}
    doc = _doc()
    doc["datasets"] = {"flow": {
        "train": 4, "test": 2, "nodes": [9, 12], "inputs": ["sdf"], "targets": ["u", "v", "p"],
        "fields": ["u+v", "p"],
        "models": {"meshops": r(0.4, 0.03), "nearest": r(0.125, 0.086),
                   "transolver": {**r(0.024, 0.016),
                                  "run": {"best_val": 0.03}},
                   "pod_rbf": {"note": "n/a: one mesh per sample"}}}}
    doc["datasets"]["flow"]["models"]["meshops"]["history"] = [
        {"s": 60.0, "val": 0.5}, {"s": 240.0, "val": 0.2}]
    md = markdown_table(doc)
    lines = md.splitlines()
    row = {k: next(x for x in lines if x.startswith(f"| flow: {k}"))
           for k in ("u+v", "p", "mean of fields")}
    assert "**0.024**" in row["u+v"] and "| 0.4 (median" in row["u+v"]
    assert "**0.016**" in row["p"] and "| n/a |" in row["p"]
    assert "- flow: u+v: meshops is behind Transolver by 16.7x (0.4 vs 0.024), nearest" in md
    assert "- flow: p: meshops is behind Transolver by 88 % (0.03 vs 0.016)" in md
    # meshops never reached Transolver's best validation error: said, with its own best
    assert "not reached by meshops (its best 0.2)" in md
    doc["datasets"]["flow"]["models"]["meshops"]["history"].append({"s": 300.0, "val": 0.029})
    assert "reached by meshops after 5.0 min of training" in markdown_table(doc)


def test_a_peer_no_better_than_a_trivial_prediction_did_not_learn(tmp_path, capsys):
    """The heat case: both peers near 1.0, the zero field's error. Their cells say "did not
    learn", they are neither best nor in the verdict's comparison, and the verdict says
    so; a peer 5 % or more below the training mean's error (and 1.0) learned."""
    from benchmarks.accuracy.__main__ import main
    from benchmarks.accuracy.report import TRIVIAL_RTOL, did_not_learn

    doc = _doc()
    row = doc["datasets"]["one"]["models"]
    row["mean"] = {"mean": 0.517, "median": 0.5, "worst": 1.0}
    row["transolver"] = {"mean": 0.998, "median": 0.99, "worst": 1.0}
    row["gino"] = {"mean": 0.517 * (1 - TRIVIAL_RTOL) - 1e-9, "median": 0.4, "worst": 0.6}
    row["pod_rbf"] = {"mean": 0.03, "median": 0.03, "worst": 0.06}
    assert did_not_learn("transolver", row) and not did_not_learn("gino", row)
    assert not did_not_learn("mean", row)  # a baseline is what it is
    # without a training mean: the zero field alone is the bar
    assert did_not_learn("transolver", {"transolver": {"mean": 0.96}})
    assert not did_not_learn("transolver", {"transolver": {"mean": 0.94}})
    md = markdown_table(doc)
    line = next(x for x in md.splitlines() if x.startswith("| one"))
    assert "| did not learn (0.998) |" in line and "**0.02**" in line
    text = verdict(doc["datasets"]["one"])
    assert text.startswith("meshops is ahead: the closest, POD + RBF, is 50 % above")
    assert text.endswith("Transolver (0.998) did not learn (no better than the zero field or "
                         "the training mean), so say nothing of meshops")
    # --plot: the trained models' validation histories, a panel per data set that has one
    doc["datasets"]["one"]["models"]["meshops"]["history"] = [{"s": 30.0, "val": 0.5},
                                                              {"s": 90.0, "val": 0.1}]
    stored = tmp_path / "r.json"
    stored.write_text(json.dumps(doc))
    assert main(["--plot", str(stored)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'r.png'} (1 data sets)"
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_a_result_scored_before_the_fields_is_pooled_not_a_field_error():
    """A stored peer result without per-field errors (scored over all channels together)
    is neither a field's error nor the mean of the fields' errors: its cells say
    "pooled", and it is left out of those rows' verdicts."""
    def r(uv, p):
        return {"mean": (uv + p) / 2, "median": uv, "worst": p,
                "fields": {"u+v": {"mean": uv, "median": uv, "worst": uv},
                           "p": {"mean": p, "median": p, "worst": p}}}
    doc = _doc()
    doc["datasets"] = {"step": {
        "train": 4, "test": 2, "nodes": 9, "inputs": ["mu"], "targets": ["u", "v", "p"],
        "fields": ["u+v", "p"],
        "models": {"meshops": r(0.02, 0.04), "transolver": {"mean": 0.01, "median": 0.01,
                                                            "worst": 0.02}}}}
    lines = markdown_table(doc).splitlines()
    for label in ("u+v", "p"):
        row = next(x for x in lines if x.startswith(f"| step: {label}"))
        assert "| pooled only |" in row
    row = next(x for x in lines if x.startswith("| step: mean of fields"))
    assert "| pooled 0.01 |" in row and "**0.03**" in row
    assert "- step: mean of fields: meshops: nothing to compare with" in lines


def test_table_option_reads_a_stored_result_or_fails_in_one_line(tmp_path, capsys):
    from benchmarks.accuracy.__main__ import main

    good = tmp_path / "r.json"
    good.write_text(json.dumps(_doc()))
    assert main(["--table", str(good)]) == 0
    assert "| data | meshops default | training mean | POD + RBF | GINO |" in \
        capsys.readouterr().out
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"schema": "meshops-bench-1"}))
    assert main(["--table", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an accuracy result" in err[0]


def test_merged_runs_take_every_model_and_the_later_result(tmp_path, capsys):
    from benchmarks.accuracy.__main__ import main

    ours, peers = _doc(), _doc()
    ours["command"], peers["command"] = "python -m benchmarks.accuracy A", "... B"
    peers["datasets"]["one"]["models"] = {"transolver": {"mean": 0.005, "median": 0.005,
                                                         "worst": 0.01}}
    del peers["datasets"]["two"]
    rerun = _doc()
    rerun["command"] = "... C"
    rerun["datasets"] = {"one": {**rerun["datasets"]["one"],
                                 "models": {"meshops": {"mean": 0.001, "median": 0.001,
                                                        "worst": 0.002}}}}
    files = []
    for k, d in enumerate((ours, peers, rerun)):
        files.append(tmp_path / f"{k}.json")
        files[-1].write_text(json.dumps(d))
    out = tmp_path / "merged.json"
    assert main(["--merge", *map(str, files), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    one = merged["datasets"]["one"]["models"]
    assert one["meshops"]["mean"] == 0.001 and one["transolver"]["mean"] == 0.005
    assert one["pod_rbf"]["mean"] == 0.01 and set(merged["datasets"]) == {"one", "two"}
    md = markdown_table(merged)
    assert all(f"`{c}`" in md for c in ("python -m benchmarks.accuracy A", "... B", "... C"))
    assert "- one: meshops is ahead: the closest, Transolver, is 5x above (0.005 vs 0.001)" in md
    # runs of another budget are not comparable
    rerun["minutes"] = 5
    files[2].write_text(json.dumps(rerun))
    capsys.readouterr()
    assert main(["--merge", *map(str, files), "--out", str(out)]) == 2
    assert "cannot merge a 5 min 2-thread run" in capsys.readouterr().err


def test_a_model_given_its_own_epochs_merges_and_is_named_beside_it(tmp_path, capsys):
    """A peer run with ``--model-epochs gino=13`` merges with the others' 60-epoch run and
    the tables name its 13 epochs; a second run giving it 20 does not merge."""
    from benchmarks.accuracy.__main__ import parse_args
    from benchmarks.accuracy.report import budget_words, merge, model_budget
    from benchmarks.accuracy.run import epochs_of

    args = parse_args(["--epochs", "60", "--model-epochs", "gino=13"])
    assert (epochs_of(args, "gino"), epochs_of(args, "meshops")) == (13, 60)
    for bad, says in ((["--model-epochs", "gino=13"], "needs --epochs"),
                      (["--epochs", "5", "--model-epochs", "mean=3"], "expected MODEL=N"),
                      (["--epochs", "5", "--model-epochs", "gino=0"], "expected MODEL=N")):
        with pytest.raises(SystemExit):
            parse_args(bad)
        assert says in capsys.readouterr().err
    ours, gino = _doc(), _doc()
    ours["epochs"] = gino["epochs"] = 60
    gino["model_epochs"] = {"gino": 13}
    gino["datasets"] = {"one": {**gino["datasets"]["one"],
                                "models": {"gino": {"mean": 0.5, "median": 0.5, "worst": 1}}}}
    merged = merge([ours, gino])
    assert budget_words(merged) == "60 epochs, GINO 13 epochs"
    assert (model_budget(merged, "gino"), model_budget(merged, "meshops")) == \
        ("13 epochs", "60 epochs")
    assert merged["datasets"]["one"]["models"]["gino"]["mean"] == 0.5
    other = {**gino, "model_epochs": {"gino": 20}}
    with pytest.raises(ValueError, match="gave GINO 13 and 20 epochs"):
        merge([ours, gino, other])


@pytest.mark.parametrize("python", ["/nonexistent/python", "SELF"])
def test_peers_without_their_environment_fail_in_one_line(python, capsys):
    import sys

    from benchmarks.accuracy.__main__ import main

    python = sys.executable if python == "SELF" else python
    if python == sys.executable:  # the library's environment, which has no peers
        try:
            import neuralop  # noqa: F401
            pytest.skip("the peers are importable here")
        except ImportError:
            pass
    assert main(["--models", "mean,gino", "--peers-python", python]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{python} cannot import physicsnemo and neuralop" in err[0]


# ------------------------------------------------------------ peer harness
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_fast_segment_csr_equals_the_row_loop(batched, reduction):
    """The index_add_ replacement of neuraloperator's fallback, in float64, against a
    plain loop over the rows (empty rows included)."""
    from benchmarks.accuracy.peer_train import _fast_segment_csr

    g = torch.Generator().manual_seed(0)
    counts = torch.tensor([3, 0, 1, 4, 0, 2])
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    src = torch.randn((2, 10, 3) if batched else (10, 3), generator=g, dtype=torch.float64)
    out = _fast_segment_csr(torch)(src, indptr[None] if batched else indptr, reduction)
    ref = torch.zeros((2, 6, 3) if batched else (6, 3), dtype=torch.float64)
    for i in range(6):
        rows = src[..., indptr[i]:indptr[i + 1], :]
        if counts[i]:
            ref[..., i, :] = rows.sum(-2) / (counts[i] if reduction == "mean" else 1)
    torch.testing.assert_close(out, ref, rtol=1e-14, atol=1e-14)


def _holed_square(n=11, hole=(0.4, 0.6)):
    """A P1 mesh of the unit square on an ``n x n`` grid without the cells inside the
    square ``hole``."""
    pts, tri = _grid(n)
    c = pts[tri].mean(1)
    tri = tri[~((c > hole[0]) & (c < hole[1])).all(1)]
    used = np.unique(tri)  # the node at the hole's centre goes
    return pts[used], np.searchsorted(used, tri)


def test_gino_latent_grid_keeps_the_aspect_ratio_at_one_spacing():
    """A 4 x 1 box gets 64 x 16 points for 1,024 (the old grid squashed it to 32 x 32),
    the unit square 32 x 32; the spacings agree within 7 %; a flat box is refused."""
    from benchmarks.accuracy.peer_train import latent_axes

    axes = latent_axes([1.0, 0.25], 1024)
    assert [len(t) for t in axes] == [64, 16]
    assert [t[-1] for t in axes] == [1.0, 0.25] and [t[0] for t in axes] == [0.0, 0.0]
    h = [t[1] - t[0] for t in axes]
    assert abs(h[0] / h[1] - 1) < 0.07
    assert [len(t) for t in latent_axes([1.0, 1.0], 1024)] == [32, 32]
    with pytest.raises(ValueError, match="positive extents"):
        latent_axes([1.0, 0.0], 1024)


def test_positions_scaled_by_one_factor_keep_the_aspect_ratio():
    from benchmarks.accuracy.peer_train import statistics

    s = Sample("a", np.array([[1.0, 2.0], [5.0, 3.0]]), TWO[:0], np.zeros((2, 1)),
               np.zeros((2, 1)), np.ones(2))
    assert statistics([s])["p_span"].tolist() == [4.0, 1.0]
    assert statistics([s], keep_aspect=True)["p_span"].tolist() == [4.0, 4.0]


def test_distance_on_grid_is_p1_in_the_mesh_and_signed_in_the_hole():
    """A linear field comes out exact at the grid points in the mesh; the distance to a
    square hole continues, at the hole's centre, as minus the distance to the nearest
    node (-0.1, the signed distance there)."""
    from benchmarks.accuracy.peer_train import distance_on_grid

    pts, tri = _holed_square()
    dist = np.maximum(np.abs(pts - 0.5).max(1) - 0.1, 0.0)  # to the hole, in the L-inf sense
    vals = np.stack([2 * pts[:, 0] + 3 * pts[:, 1], dist], 1)
    axes = [np.linspace(0.0, 1.0, 21), np.linspace(0.0, 1.0, 17)]
    out = distance_on_grid(pts, tri, vals, axes)
    assert out.shape == (21, 17, 2)
    X, Y = np.meshgrid(*axes, indexing="ij")
    in_hole = (np.abs(X - 0.5) < 0.1 - 1e-9) & (np.abs(Y - 0.5) < 0.1 - 1e-9)
    np.testing.assert_allclose(out[~in_hole, 0], (2 * X + 3 * Y)[~in_hole], atol=1e-12)
    assert in_hole[10, 8] and out[10, 8, 1] == pytest.approx(-0.1)
    assert (out[in_hole, 1] < 0).all() and (out[~in_hole, 1] >= -1e-12).all()


def test_gino_layout_puts_distances_on_the_latent_grid_and_the_rest_in_the_gno():
    """The obstacle's ``sdf`` becomes the latent features and the input GNO integrates
    its kernel alone into 3 channels (the car example); inputs that are no distance go
    to the input GNO as its channels (the 2-D example); modes half the points per axis,
    radii two (the larger) spacings, NeRF frequencies below the grid's Nyquist bound."""
    import copy

    from benchmarks.accuracy.peer_train import CONFIGS, gino_layout

    cfg = copy.deepcopy(CONFIGS["gino"])
    obstacle = gino_layout(cfg, [1.0, 0.25], ["sdf"], 1)
    kw = obstacle["kwargs"]
    assert obstacle["shape"] == [64, 16] and obstacle["grid"].shape == (1024, 2)
    assert obstacle["latent_columns"] == [0] and obstacle["x_columns"] == []
    assert (kw["in_channels"], kw["fno_in_channels"], kw["latent_feature_channels"]) == (0, 3, 1)
    assert kw["fno_n_modes"] == (32, 8)
    assert kw["in_gno_radius"] == kw["out_gno_radius"] == pytest.approx(2 * 0.25 / 15)
    assert 2 ** (kw["gno_embed_channels"] - 1) < 64 / 2 <= 2 ** kw["gno_embed_channels"]
    airfoil = gino_layout(cfg, [1.0, 0.8], ["u_inf", "v_inf"], 2)
    assert airfoil["x_columns"] == [0, 1] and airfoil["latent_columns"] == []
    assert (airfoil["kwargs"]["fno_in_channels"], airfoil["kwargs"]["latent_feature_channels"]) \
        == (2, None)
    with pytest.raises(ValueError, match="cannot tell their columns"):
        gino_layout(cfg, [1.0, 1.0], ["sdf", "velocity"], 3)


def test_gino_data_carries_the_distance_onto_the_latent_grid_of_each_sample():
    """The latent features of a sample are its distance input on the grid, standardised
    with the training statistics (the runner read them off a field the samples no longer
    had once tetrahedra came); a sample in space is refused by name."""
    import copy

    import torch

    from benchmarks.accuracy.peer_train import (
        CONFIGS,
        Data,
        distance_on_grid,
        gino_layout,
        statistics,
    )

    pts, tri = _holed_square()
    dist = np.maximum(np.abs(pts - 0.5).max(1) - 0.1, 0.0)[:, None]
    s = Sample("holed.vtu", pts, tri, dist, np.zeros((len(pts), 1)), np.ones(len(pts)))
    stats = statistics([s], keep_aspect=True)
    layout = gino_layout(copy.deepcopy(CONFIGS["gino"]), [1.0, 1.0], ["sdf"], 1)
    lat = Data(torch, [s], stats, layout).batch([0])[4]
    axes = [stats["p_lo"][d] + layout["axes"][d] * stats["p_span"][d] for d in range(2)]
    ref = (distance_on_grid(pts, tri, dist, axes) - stats["x_mu"]) / stats["x_sd"]
    assert lat.shape == (1, *layout["shape"], 1)
    np.testing.assert_allclose(lat[0].numpy(), ref, rtol=1e-6, atol=1e-6)
    surface = Sample("skin.vtu", np.eye(3), np.array([[0, 1, 2]]), np.zeros((3, 1)),
                     np.zeros((3, 1)), np.ones(3))
    with pytest.raises(ValueError, match="skin.vtu does not fill its domain"):
        Data(torch, [surface], stats, layout)


def _holed_cube(n=6, hole=(0.35, 0.65)):
    """Tetrahedra of the unit cube (each grid cube in 6 around its main diagonal) without
    those whose centre lies in the cube ``hole``: with the defaults, the cavity is the
    grid cube [0.4, 0.6]^3."""
    import itertools

    t = np.linspace(0.0, 1.0, n)
    pts = np.stack(np.meshgrid(t, t, t, indexing="ij"), -1).reshape(-1, 3)
    idx = np.arange(n ** 3).reshape(n, n, n)
    tets = []
    for i, j, k in itertools.product(range(n - 1), repeat=3):
        c = [idx[i + a, j + b, k + e] for a, b, e in itertools.product((0, 1), repeat=3)]
        for perm in itertools.permutations(range(3)):  # the 6 paths from corner 0 to 7
            at, path = [0, 0, 0], [c[0]]
            for axis in perm:
                at[axis] = 1
                path.append(c[4 * at[0] + 2 * at[1] + at[2]])
            tets.append(path)
    tets = np.asarray(tets)
    centre = pts[tets].mean(1)
    tets = tets[~((centre > hole[0]) & (centre < hole[1])).all(1)]
    used = np.unique(tets)
    return pts[used], np.searchsorted(used, tets)


def test_distance_on_grid_is_p1_in_tetrahedra_and_signed_in_a_cavity():
    """In 3-D (cavity3d's ``sdf``): a linear field is exact at the grid points in the
    tetrahedra; at the cavity's centre the distance continues as minus the distance to
    the nearest node (a corner of the cavity [0.4, 0.6]^3, 0.1 * sqrt(3) away)."""
    from benchmarks.accuracy.peer_train import distance_on_grid

    pts, tets = _holed_cube()
    dist = np.maximum(np.abs(pts - 0.5).max(1) - 0.1, 0.0)
    vals = np.stack([pts @ [1.0, -2.0, 0.5], dist], 1)
    axes = [np.linspace(0.0, 1.0, m) for m in (9, 7, 5)]
    out = distance_on_grid(pts, tets, vals, axes)
    assert out.shape == (9, 7, 5, 2)
    G = np.stack(np.meshgrid(*axes, indexing="ij"), -1)
    in_hole = (np.abs(G - 0.5) < 0.1 - 1e-9).all(-1)
    np.testing.assert_allclose(out[~in_hole, 0], (G @ [1.0, -2.0, 0.5])[~in_hole], atol=1e-12)
    assert in_hole[4, 3, 2] and out[4, 3, 2, 1] == pytest.approx(-0.1 * np.sqrt(3))
    assert in_hole.sum() == 1 and (out[~in_hole, 1] >= -1e-12).all()


def test_p1_transfer_takes_triangulations_matplotlib_refuses():
    """A C-grid duplicates the nodes of its wake cut, which matplotlib's triangle finder
    refuses: the search fallback gives the same P1 values on a valid mesh (1e-12) and
    exact linear fields on one with a duplicated node."""
    from scipy.spatial import Delaunay, cKDTree

    from benchmarks.accuracy import classical

    rng = np.random.default_rng(0)
    p = rng.random((300, 2))
    t = Delaunay(p).simplices
    y = np.stack([2 * p[:, 0] + p[:, 1], np.sin(3 * p[:, 0])], 1)

    class S:
        pass

    s = S()
    s.points, s.cells, s.targets = p, t, y
    q = rng.random((2000, 2)) * 1.2 - 0.1  # some outside: the nearest node's value
    near = cKDTree(p).query(q)[1]
    np.testing.assert_allclose(classical._values_by_search(s, q, near),
                               classical._values_at(s, q), atol=1e-12)
    # a node duplicated as on a wake cut: half of its triangles use the copy, which
    # matplotlib's finder refuses, so the values come from the search
    import matplotlib.tri as mtri

    k = int(np.argmin(np.abs(p - 0.5).sum(1)))
    half = np.where((t == k).any(1))[0]
    half = half[: len(half) // 2]
    tri = t.copy()
    tri[half] = np.where(tri[half] == k, len(p), tri[half])
    s.points, s.cells = np.concatenate([p, p[k:k + 1]]), tri
    s.targets = np.concatenate([y, y[k:k + 1]])
    with pytest.raises(RuntimeError, match="Triangulation is invalid"):
        mtri.Triangulation(s.points[:, 0], s.points[:, 1], tri).get_trifinder()
    inside = Delaunay(p).find_simplex(q) >= 0
    got = classical._values_at(s, q)
    np.testing.assert_allclose(got[inside, 0], 2 * q[inside, 0] + q[inside, 1], atol=1e-12)


def test_p1_transfer_in_tetrahedra_is_exact_for_linear_fields_and_nearest_in_a_cavity():
    """On a block of tetrahedra with a cubic cavity, P1 interpolation at points in the
    material reproduces a linear field exactly; a point in the cavity, held by no
    tetrahedron, gets its nearest node's value."""
    from scipy.spatial import cKDTree

    def solid(c):
        return not (np.abs(c - 0.5) < 0.25).all()

    pts, tets = _kuhn(8, solid)
    used = np.unique(tets)  # the grid's nodes inside the cavity go
    pts, tets = pts[used], np.searchsorted(used, tets)
    y = np.stack([1 + 2 * pts[:, 0] - pts[:, 1] + 0.5 * pts[:, 2], pts[:, 2]], 1)
    src = Sample("s.vtu", pts, tets, np.zeros((len(pts), 0)), y,
                 metric.lumped_mass_weights(pts, tets))
    rng = np.random.default_rng(0)
    q = rng.random((3000, 3))
    material = ~(np.abs(q - 0.5) < 0.25).all(1)
    got = classical._values_at(src, q)
    np.testing.assert_allclose(got[material, 0],
                               1 + 2 * q[material, 0] - q[material, 1] + 0.5 * q[material, 2],
                               atol=1e-12)
    hollow = ~material & (np.abs(q - 0.5) < 0.2).all(1)  # clear of the cavity's faces
    assert hollow.sum() > 50
    near = cKDTree(pts).query(q[hollow])[1]
    np.testing.assert_allclose(got[hollow], y[near], rtol=0, atol=0)
    assert np.abs(got[hollow, 0] - (1 + 2 * q[hollow, 0] - q[hollow, 1]
                                    + 0.5 * q[hollow, 2])).max() > 0.05


def test_p1_transfer_on_a_surface_in_space_is_at_the_closest_point():
    """On a triangulated sphere, a point on a triangle gets the P1 value there (a linear
    field exactly); a point off the surface, that of its closest point; points of a finer
    sphere are a second-order distance away, so their error is far below the nearest
    node's."""
    import trimesh
    from scipy.spatial import cKDTree

    m = trimesh.creation.icosphere(2)
    pts, tri = np.asarray(m.vertices), np.asarray(m.faces)

    def f(x):
        return np.stack([1 + 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2], x[:, 2]], 1)

    src = Sample("s.vtu", pts, tri, np.zeros((len(pts), 0)), f(pts),
                 metric.lumped_mass_weights(pts, tri))
    rng = np.random.default_rng(0)
    lam = rng.dirichlet(np.ones(3), 500)
    on = np.einsum("nc,ncd->nd", lam, pts[tri[rng.integers(0, len(tri), 500)]])
    np.testing.assert_allclose(classical._values_at(src, on), f(on), atol=1e-12)
    normal = np.cross(pts[tri[:, 1]] - pts[tri[:, 0]], pts[tri[:, 2]] - pts[tri[:, 0]])
    lifted = on[:50] + 0.01 * (normal / np.linalg.norm(normal, axis=1, keepdims=True))[
        trimesh.Trimesh(pts, tri, process=False).nearest.on_surface(on[:50])[2]]
    np.testing.assert_allclose(classical._values_at(src, lifted), f(on[:50]), atol=1e-9)
    fine = np.asarray(trimesh.creation.icosphere(4).vertices)
    err = np.abs(classical._values_at(src, fine) - f(fine)).max()
    nearest = np.abs(f(pts)[cKDTree(pts).query(fine)[1]] - f(fine)).max()
    assert err < 0.1 * nearest


def test_read_sample_keeps_the_tetrahedra_and_three_coordinates(tmp_path):
    import meshio

    from benchmarks.accuracy.folder import read_sample

    pts, tets = _kuhn(2)
    pts = pts * [2.0, 1.0, 1.0]
    faces = np.array([[0, 1, 2]])  # a boundary triangle, left out of the weights
    meshio.write(tmp_path / "a.vtu", meshio.Mesh(pts, [("tetra", tets), ("triangle", faces)],
                                                 point_data={"s": pts[:, 0], "u": pts[:, 1]}))
    s = read_sample(tmp_path / "a.vtu", ["s"], ["u"])
    assert s.points.shape == (len(pts), 3) and s.cells.shape == (len(tets), 4)
    assert s.weight.sum() == pytest.approx(2.0, rel=1e-12)
    np.testing.assert_allclose(s.targets[:, 0], pts[:, 1])


# ------------------------------------------------------- mesh-independence suite
def _square_sample(n, field, name="sample_0001.vtu"):
    pts, tri = _grid(n)
    return Sample(name, pts, tri, np.zeros((len(pts), 0)), field(pts),
                  metric.lumped_mass_weights(pts, tri))


def test_truth_difference_is_zero_for_linear_fields_and_second_order_otherwise():
    """P1 interpolation reproduces a linear field exactly, so two meshes of the same
    linear solution differ by rounding only; for a smooth field the difference is the
    interpolation error of the coarse mesh, O(h^2): a quarter when h halves."""
    from benchmarks.accuracy import remesh

    columns = {"u": [0], "v": [1]}

    def linear(p):
        return np.stack([1 + 2 * p[:, 0] - p[:, 1], 3 - p[:, 1]], 1)

    def smooth(p):
        return np.stack([np.sin(3 * p[:, 0]) + 2, np.cos(2 * p[:, 1]) * p[:, 0] + 1], 1)

    fine = _square_sample(33, linear)
    d = remesh.truth_difference([_square_sample(5, linear)], [fine], columns)
    assert d["mean"] < 1e-13 and d["fields"]["v"]["worst"] < 1e-13
    fine = _square_sample(65, smooth)
    e = [remesh.truth_difference([_square_sample(n, smooth)], [fine], columns)["mean"]
         for n in (9, 17)]
    assert 3.5 < e[0] / e[1] < 4.5


def test_remeshed_files_pair_with_test_files_by_name():
    from benchmarks.accuracy import remesh

    a = _square_sample(3, lambda p: p, "sample_0001.vtu")
    b = _square_sample(3, lambda p: p, "sample_0002.vtu")
    assert remesh.pair([a, b], [b]) == [(b, b)]
    with pytest.raises(ValueError, match="sample_0002.vtu"):
        remesh.pair([a], [b])


def test_every_model_is_scored_on_the_remeshed_splits_with_its_ratio(tmp_path):
    """A set whose test shapes are also written on a finer mesh (an extra split): the
    classical models predict it too, each with its error's ratio to its own test error,
    and the truths' difference is zero for this family, linear in space (P1 exact)."""
    from data_adapters.parametric import ParametricSet, parametric_sample, write_parametric_folders

    def family(n_grid, ids, P):
        pts, tri = _grid(n_grid)
        return [parametric_sample(pts, tri, ["a", "b"], P[k],
                                  {"u": P[k, 0] * pts[:, 0] + P[k, 1], "v": P[k, 1] * pts[:, 1]},
                                  f"sample {k}", torch.float64, k) for k in ids]

    P = np.random.default_rng(3).uniform(0.5, 2.0, (12, 2))
    ds = ParametricSet("tiny", family(5, range(12), P), ["a", "b"], ["u", "v"], list(range(8)),
                       list(range(8, 12)), description="tiny",
                       extra={"test_fine": family(9, range(8, 12), P)})
    root = write_parametric_folders(ds, tmp_path / "tiny", progress=False)
    args = types.SimpleNamespace(minutes=0.1, threads=1, seed=0, grace=1.2, peers_python="")
    res = run_dataset("tiny", root, ["mean", "pod_rbf"], args, tmp_path / "w", lambda _: None)
    assert res["truth_difference"]["test_fine"]["mean"] < 1e-12
    mean = res["models"]["mean"]
    fine = mean["remeshed"]["test_fine"]
    # the mean of linear fields is linear: moved exactly, so the same error on both meshes
    # up to the quadrature of the finer mesh
    assert fine["ratio"] == pytest.approx(fine["mean"] / mean["mean"], rel=1e-12)
    assert 0.8 < fine["ratio"] < 1.25
    # the test predictions carried onto the finer meshes: linear fields, moved exactly,
    # so they score what the predictions made there score
    assert fine["moved"]["mean"] == pytest.approx(fine["mean"], rel=1e-9)
    assert fine["fields"]["u"]["ratio"] == pytest.approx(
        fine["fields"]["u"]["mean"] / mean["fields"]["u"]["mean"], rel=1e-12)
    assert res["models"]["pod_rbf"]["note"].startswith("n/a") or \
        res["models"]["pod_rbf"]["remeshed"]["test_fine"]["mean"] < 1e-6


def test_the_report_shows_every_split_with_the_truths_difference():
    from benchmarks.accuracy.report import mesh_independence

    doc = _doc()
    one = doc["datasets"]["one"]
    one["truth_difference"] = {"test_ring16": {"mean": 0.001}}
    one["models"]["meshops"]["remeshed"] = {"test_ring16": {"mean": 0.03, "ratio": 1.5}}
    one["models"]["mean"]["remeshed"] = {"test_ring16": {"mean": 1.0, "ratio": 1.0}}
    rows = mesh_independence(one)
    assert rows == [("test_ring16", "mean", {"mean": 0.001},
                     {"meshops": {"mean": 0.03, "ratio": 1.5},
                      "mean": {"mean": 1.0, "ratio": 1.0}})]
    md = markdown_table(doc)
    line = next(x for x in md.splitlines() if "refined 16x" in x)
    assert "| 0.001 |" in line and "0.03 (1.50x)" in line
    # a result stored before the suite: meshops' "fine" is the uniformly finer split
    two = doc["datasets"]["two"]
    two["models"]["meshops"]["fine"] = {"mean": 0.04}
    assert mesh_independence(two)[0][0] == "test_fine"
    assert mesh_independence(two)[0][3]["meshops"]["ratio"] == pytest.approx(2.0)


# ------------------------------------------------------------------ seeds
def _seed_doc(seed, ours, peer):
    doc = _doc()
    doc["seed"] = seed
    one = doc["datasets"]["one"]["models"]
    one["meshops"] = {"mean": ours, "median": ours, "worst": 2 * ours, "errors": [ours],
                      "fields": {"u": {"mean": ours, "median": ours, "worst": ours}},
                      "remeshed": {"test_fine": {"mean": 2 * ours, "median": 2 * ours,
                                                 "worst": 2 * ours, "fields": {"u": {
                                                     "mean": 2 * ours, "median": 2 * ours,
                                                     "worst": 2 * ours}}}}}
    one["transolver"] = {"mean": peer, "median": peer, "worst": peer, "errors": [peer]}
    return doc


def test_seeds_are_averaged_with_their_spread():
    from benchmarks.accuracy.seeds import combine_seeds

    out = combine_seeds([_seed_doc(0, 0.02, 0.03), _seed_doc(1, 0.04, 0.05)])
    ours = out["datasets"]["one"]["models"]["meshops"]
    assert ours["mean"] == pytest.approx(0.03) and ours["worst"] == pytest.approx(0.06)
    assert ours["seeds"] == {"0": 0.02, "1": 0.04} and ours["spread"] == [0.02, 0.04]
    assert ours["fields"]["u"]["mean"] == pytest.approx(0.03)
    # a ratio of means, not a mean of ratios; each field's too
    assert ours["remeshed"]["test_fine"]["ratio"] == pytest.approx(2.0)
    assert ours["remeshed"]["test_fine"]["fields"]["u"]["ratio"] == pytest.approx(2.0)
    assert out["seeds"] == [0, 1]
    # the classical models do not depend on the seed: the same figure
    assert out["datasets"]["one"]["models"]["pod_rbf"]["mean"] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="at least two seeds"):
        combine_seeds([_seed_doc(0, 0.02, 0.03), _seed_doc(0, 0.02, 0.03)])


def test_overlapping_seed_ranges_are_called_level():
    from benchmarks.accuracy.seeds import combine_seeds

    apart = combine_seeds([_seed_doc(0, 0.02, 0.05), _seed_doc(1, 0.021, 0.051)])
    close = combine_seeds([_seed_doc(0, 0.02, 0.03), _seed_doc(1, 0.04, 0.025)])
    assert "within the seeds' spread" not in verdict(apart["datasets"]["one"])
    text = verdict(close["datasets"]["one"])
    assert "level with Transolver within the seeds' spread" in text
    md = markdown_table(close)
    assert "0.03 (0.02-0.04, 2 seeds)" in md


def test_seeds_option_runs_each_seed_and_writes_their_mean(tmp_path, monkeypatch, capsys):
    """``--seeds 0,1`` runs everything once per seed into OUT-seedS.json, each seed's runs
    kept apart, and writes the seeds' combination to OUT."""
    import benchmarks.accuracy.__main__ as cli

    ran = []

    def run_once(args, out, command):
        ran.append((args.seed, args.keep, out.name))
        out.write_text(json.dumps({"schema": cli.SCHEMA, "command": command,
                                   **_seed_doc(args.seed, 0.02 * (1 + args.seed),
                                               0.05)}))
        return 0

    monkeypatch.setattr(cli, "run_once", run_once)
    out = tmp_path / "r.json"
    assert cli.main(["--datasets", "obstacle", "--models", "meshops,mean", "--seeds", "0,1",
                     "--epochs", "2", "--keep", str(tmp_path / "k"), "--out", str(out)]) == 0
    assert ran == [(0, tmp_path / "k" / "seed0", "r-seed0.json"),
                   (1, tmp_path / "k" / "seed1", "r-seed1.json")]
    ours = json.loads(out.read_text())["datasets"]["one"]["models"]["meshops"]
    assert ours["mean"] == pytest.approx(0.03) and ours["spread"] == [0.02, 0.04]
    printed = capsys.readouterr().out
    assert "seeds 0.02-0.04 (2)" in printed and "[0.04-0.08] (2.00x)" in printed


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0,1", "--seed", "2"], "either --seed or --seeds"),
    (["--seeds", "3"], "at least two distinct seeds"),
    (["--seeds", "1,1"], "at least two distinct seeds"),
    (["--seeds", "0,x"], "comma-separated integers"),
])
def test_seeds_option_refuses_what_it_cannot_average(argv, message, capsys):
    import benchmarks.accuracy.__main__ as cli

    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    assert message in capsys.readouterr().err


def test_zero_shot_rows_set_each_model_beside_the_truths_difference(tmp_path, capsys):
    """The README's zero-shot table: per family and field the FE difference of the truths
    and each trained model's test and re-meshed errors with their ratio; several stored
    results read together, a later one's data set replacing an earlier one's."""
    import benchmarks.accuracy.__main__ as cli
    from benchmarks.accuracy import zero_shot

    a, b = _seed_doc(0, 0.02, 0.05), _seed_doc(0, 0.01, 0.05)
    for doc in (a, b):  # as run.score_remeshed leaves them
        doc["datasets"]["one"]["truth_difference"] = {"test_fine": {"mean": 0.001}}
        doc["datasets"]["one"]["models"]["meshops"]["remeshed"]["test_fine"]["ratio"] = 2.0
    b["epochs"] = 7
    # the lookup the trained models must beat, with no budget of its own
    b["datasets"]["one"]["models"]["nearest"] = {"mean": 0.5, "remeshed": {"test_fine": {
        "mean": 0.6, "ratio": 1.2}}}
    rows = zero_shot.zero_shot_rows([a, b])
    assert [(r["data"], r["model"]) for r in rows] == [("one", None), ("one", "meshops"),
                                                       ("one", "nearest")]
    assert rows[0]["splits"]["test_fine"]["mean"] == 0.001
    ours = rows[1]
    assert ours["test"]["mean"] == 0.01 and ours["budget"] == "7 epochs"
    assert ours["splits"]["test_fine"]["ratio"] == pytest.approx(2.0)
    md = zero_shot.markdown_table([a, b], ["x.json"])
    assert "| one | meshops default | 7 epochs | 0.01 | 0.02 (2.00x) |" in md
    assert "| one | FE difference of the truths |  |  | 0.001 |" in md
    assert "| one | nearest training sample |  | 0.5 | 0.6 (1.20x) |" in md
    files = []
    for k, doc in enumerate((a, b)):
        files.append(tmp_path / f"{k}.json")
        files[-1].write_text(json.dumps({"schema": cli.SCHEMA, **doc}))
    assert cli.main(["--zero-shot", *map(str, files), "--out", str(tmp_path / "z.png")]) == 0
    assert (tmp_path / "z.png").stat().st_size > 0
    assert cli.main(["--zero-shot", str(files[0]), "--out", str(tmp_path / "z.json")]) == 2
    assert "--zero-shot needs --out FILE.png" in capsys.readouterr().err


def test_zero_shot_verdicts_allow_the_factor_plus_the_truths_difference():
    """Within means ``e <= 1.10 t + d`` on every split: a model exact on the test meshes'
    truths is ``d`` from the re-meshed ones. The bound is checked on both sides of it,
    each label beyond names its split furthest past the bound."""
    from benchmarks.accuracy import zero_shot

    def row(model, field, test, splits):
        return {"data": "one", "field": field, "model": model, "budget": "",
                "test": None if test is None else {"mean": test},
                "splits": {k: {"mean": v} for k, v in splits.items()}}

    t, d = 0.02, 0.005
    edge = zero_shot.ZERO_SHOT_FACTOR * t + d
    rows = [row(None, "p", None, {"test_fine": d, "test_ring16": d}),
            row("meshops", "p", t, {"test_fine": edge * (1 - 1e-9),
                                    "test_ring16": edge * (1 - 1e-9)}),
            row("transolver", "p", t, {"test_fine": edge * 1.01, "test_ring16": edge * 3}),
            row(None, "u", None, {}),
            row("meshops", "u", t, {"test_fine": zero_shot.ZERO_SHOT_FACTOR * t * 1.01}),
            row("nearest", "u", t, {"test_fine": 9.0})]
    v = zero_shot.zero_shot_verdicts(rows)
    assert set(v) == {"meshops", "transolver"}  # the lookup is no trained model
    assert v["meshops"]["within"] == ["one: p"]
    (label, split, e, bound), = v["meshops"]["beyond"]  # no truths' difference: none allowed
    assert (label, split) == ("one: u", "uniform, finer")
    assert bound == pytest.approx(zero_shot.ZERO_SHOT_FACTOR * t)
    assert v["transolver"] == {"within": [], "beyond": [("one: p", "band x16", edge * 3,
                                                         pytest.approx(edge))]}


# ------------------------------------------------------------------ a 3-D family
def _tiny_family(tmp_path, name, module, make, coarse, fine, corners):
    """Six samples of a 3-D family (``make(num, **coarse)``) written as the suite writes
    its folders (four train, two test, ``test_fine`` the test shapes made with ``fine``)
    and read back: ``(root, train, test)``; each read sample has its simplices (of
    ``corners`` corners) in 3-D and the generator's weights."""
    from data_adapters.parametric import ParametricSet, write_parametric_folders

    coarse = {**coarse, "dtype": torch.float64, "progress": False, "cache_dir": False}
    samples = make(6, seed=2, **coarse)
    ds = ParametricSet(name, samples, list(module.PARAMS), list(module.TARGETS), [0, 1, 2, 3],
                       [4, 5], description="tiny", inputs=list(module.INPUTS),
                       fields=list(module.FIELDS),
                       extra={"test_fine": make(6, seed=2, first=4, **fine, **coarse)})
    root = write_parametric_folders(ds, tmp_path / name, progress=False)
    train = read_split(root, "train", module.INPUTS, module.TARGETS)
    test = read_split(root, "test", module.INPUTS, module.TARGETS)
    for s, m in zip(train + test, samples):
        assert s.points.shape[1] == 3 and s.cells.shape[1] == corners
        np.testing.assert_allclose(s.weight, m.weight.numpy(), rtol=1e-10)
    return root, train, test


def test_a_3d_family_folder_is_read_in_tetrahedra_and_scored(tmp_path):
    """A tiny block-with-cavities family (coarse gmsh meshes) written as the suite writes
    its folders: read back in tetrahedra with their volume as weights, the nearest sample
    is the one of the closest standardised parameters (all, or the load's, as the
    training samples' leave-one-out chose) moved by P1 interpolation, and the
    re-meshed split is scored with the truths' difference."""
    pytest.importorskip("gmsh")
    from data_adapters.standins import cavity3d as cv

    root, train, test = _tiny_family(tmp_path, "cav", cv, cv.make_cavity3d_standin,
                                     {"h": 0.4, "h_cavity": 0.12}, {"refine": 1.5}, corners=4)
    P = cv.sample_params(6, seed=2)
    np.testing.assert_allclose(np.stack([s.params for s in train]),
                               P[:4][:, np.argsort(cv.PARAMS)], rtol=1e-12)
    preds = classical.nearest_sample(train, test)
    # looked up by all parameters or by the load alone, as the training samples chose
    by_load = classical.LAST_NOTE[0].startswith("by the global inputs")
    assert by_load or classical.LAST_NOTE[0].startswith("by the parameters")
    cols = [cv.PARAMS.index(k) for k in ("load", "angle", "elevation")] if by_load else \
        list(range(P.shape[1]))
    P = P[:, cols]
    z = (P - P[:4].mean(0)) / np.where(P[:4].std(0) > 0, P[:4].std(0), 1.0)
    pick = [int(np.argmin(((z[:4] - z[k]) ** 2).sum(1))) for k in (4, 5)]
    for got, t, k in zip(preds, test, pick):
        np.testing.assert_allclose(got, classical.transfer(train[k], t), rtol=1e-12)
    args = types.SimpleNamespace(minutes=0.1, threads=1, seed=0, grace=1.2, peers_python="")
    res = run_dataset("cav", root, ["mean", "nearest"], args, tmp_path / "w", lambda _: None)
    assert set(res["models"]["nearest"]["fields"]) == {"ux+uy+uz", "vm"}
    assert 0 < res["truth_difference"]["test_fine"]["mean"] < 0.5
    assert np.isfinite(res["models"]["mean"]["remeshed"]["test_fine"]["ratio"])


def test_a_surface_family_folder_is_read_in_triangles_and_scored(tmp_path):
    """A tiny family of bodies (coarse meshes) written as the suite writes its folders:
    read back as triangles in space with their true areas as weights, and scored; the
    re-meshed split's truths differ by about the discretisation error (the test mesh's
    field moved onto the finer mesh by P1 interpolation at the closest point)."""
    pytest.importorskip("gmsh")
    from data_adapters.standins import body3d as bd

    root, train, test = _tiny_family(tmp_path, "body", bd, bd.make_body3d_standin, {"h": 0.2},
                                     {"refine": 2}, corners=3)
    args = types.SimpleNamespace(minutes=0.1, threads=1, seed=0, grace=1.2, peers_python="")
    res = run_dataset("body", root, ["mean", "nearest"], args, tmp_path / "w", lambda _: None)
    assert set(res["models"]["nearest"]["fields"]) == {"cp", "vx+vy+vz"}
    # 385 nodes: the panel solutions' own errors there (velocity 3 %, cp 10 % on a slender
    # ellipsoid) bound their difference; the nearest node's value alone gave 0.14
    assert 0 < res["truth_difference"]["test_fine"]["mean"] < 0.1
    assert np.isfinite(res["models"]["mean"]["remeshed"]["test_fine"]["ratio"])


# ------------------------------------------------------------------ diagnosis
@pytest.mark.parametrize("mu", [0.0, 0.05])
def test_slice_transplant_repeats_the_layer_exactly_and_swaps_only_small_slices(mu):
    """benchmarks.slice_transplant calls SliceAttention's steps and swaps tokens between
    them: untouched it is the layer, to round-off; swapping in recorded tokens changes
    the output only through the slices it names."""
    from benchmarks.slice_transplant import LARGE, RECORD, SMALL, Swap
    from meshops.nn.slice import SliceAttention

    torch.manual_seed(0)
    layer = SliceAttention(5, 8, heads=2, slices=4, min_measure=mu).double()
    g = torch.Generator().manual_seed(1)
    x, w = (torch.randn(1, 40, 5, generator=g, dtype=torch.float64),
            torch.rand(1, 40, generator=g, dtype=torch.float64))
    swap = Swap()
    torch.testing.assert_close(swap.attend(layer, x, w), layer(x[0], None, w[0])[None],
                               rtol=1e-12, atol=1e-12)
    swap.mode = RECORD
    swap.attend(layer, x, w)
    y = x + 0.1 * torch.randn(1, 40, 5, generator=g, dtype=torch.float64)
    swap.mode, swap.threshold = None, 2.0  # every slice is "small"
    moved = swap.attend(layer, y, w)
    for mode, same in ((SMALL, False), (LARGE, True)):
        swap.mode, swap.i = mode, 0
        got = swap.attend(layer, y, w)
        # all tokens from the record: the old tokens read back at the new points
        assert torch.allclose(got, moved) == same


def test_validation_remesh_takes_the_files_meshops_train_validates_on(tmp_path):
    from benchmarks.accuracy.meshops_cli import split_of_run
    from benchmarks.validation_remesh import validation_files

    root, _ = _write_set(tmp_path / "tiny")
    _, va = split_of_run(None, 8)
    got = validation_files(root)
    assert [f.name for f in got] == [f"sample_{i:04d}.vtu" for i in va]
    assert all(f.is_file() for f in got)


def test_validation_remesh_refuses_a_family_or_split_it_does_not_remesh(tmp_path):
    from benchmarks.validation_remesh import make

    root, _ = _write_set(tmp_path / "tiny")
    with pytest.raises(ValueError, match="'tiny' family's validation shapes are not re-meshed"):
        make(root, "val_fine")
    (root / "dataset.json").write_text(json.dumps({**json.loads(
        (root / "dataset.json").read_text()), "name": "airfoil"}))
    with pytest.raises(ValueError,
                       match="no split 'val_ring64'; the splits are val_fine, val_wall"):
        make(root, "val_ring64")


def test_airfoil_validation_shapes_are_the_same_airfoils_on_the_finer_grid():
    """The airfoil draw's parameters come for all its samples at once: the re-meshed
    validation shapes must be the draw's own shapes and angles, on the test split's grid."""
    from benchmarks.accuracy.datasets import AIRFOIL_AGAIN, airfoil_samples
    from benchmarks.validation_remesh import _airfoil_shapes

    key = {"samples": 6, "seed": 0}
    plain = airfoil_samples(6, 0, cache_dir=False)
    fine = _airfoil_shapes([4, 2], AIRFOIL_AGAIN["test_fine"], key)
    assert [int(s.sample_id) for s in fine] == [4, 2]
    for s, i in zip(fine, (4, 2)):
        torch.testing.assert_close(s.params, plain[i].params, rtol=0, atol=0)
        # 2 n_side - 1 + 2 n_wake rows of n1 nodes: (121 + 60) x 49
        assert s.pos.shape[0] == 181 * 49 and plain[i].pos.shape[0] == 91 * 25
        # the same free stream, so the same far field: u_inf on every node
        assert float(s.fields["u_inf"][0]) == float(plain[i].fields["u_inf"][0])


def test_validation_remesh_refuses_a_run_of_another_seeds_split(tmp_path):
    """A run of --seed 1 holds out other shapes than seed 0's: scored on seed 0's
    validation shapes it would be scored on some of its training shapes."""
    from benchmarks.accuracy.meshops_cli import split_of_run
    from benchmarks.validation_remesh import score, validation_files

    root, _ = _write_set(tmp_path / "tiny")
    assert [f.name for f in validation_files(root, 1)] == [
        f"sample_{i:04d}.vtu" for i in split_of_run(None, 8, seed=1)[1]]
    val = tmp_path / "tiny-val"
    (val / "val").mkdir(parents=True)
    for f in validation_files(root, 0):
        (val / "val" / f.name).write_bytes(f.read_bytes())
    (val / "dataset.json").write_text(json.dumps({"split_seed": 0, "train": [
        f"sample_{i:04d}.vtu" for i in range(8)]}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 1\nval_fraction: 0.2\n")
    with pytest.raises(ValueError, match="validated on other shapes than the split of "
                                         "seed 0 that .* holds, some of them its training"):
        score(run, val, "val_fine")
