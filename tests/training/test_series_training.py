"""Next-step models of time series: the NextStep model (rollout, push-forward gradient),
its training samples and loss, and ``meshops train --series`` / ``predict --rollout`` /
``evaluate`` on series with an exact solution (tests/_series.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from _series import heat_states, series_params, write_heat_series
from _tiny_run import one_line_error

from meshops.cli import main as cli_main
from meshops.datasets.series import read_series, read_series_folder
from meshops.models import NeuralOperator, NextStep
from meshops.training.loss import relative_lp
from meshops.training.rollout import (
    RolloutLoss,
    rollout,
    rollout_sample,
    rollout_windows,
    series_statistics,
)

TINY = {"width": 8, "layers": 1, "heads": 2}
DT = 0.02


def _series(tmp_path, count=3, steps=6, fmt="pvd", seed=0):
    write_heat_series(tmp_path, series_params(count, seed), steps=steps, dt=DT, fmt=fmt)
    return read_series_folder(tmp_path, ["u"], ["kappa", "a"])


def _model(series, **kw):
    torch.manual_seed(0)
    m = NextStep("transformer_no", 1, 2, 0, 2, True, TINY, condition_width=8, modes=4, **kw)
    m.set_statistics(series_statistics(series, ["u"], [], True))
    return m.double()


def test_push_forward_back_propagates_through_the_last_step_only(tmp_path):
    series = _series(tmp_path)
    model = _model(series)
    sample = rollout_sample(series[0], ["u"], [], 0, 3, True, torch.float64)
    loss = RolloutLoss(1, last_only=True)

    def grads(fn):
        model.zero_grad()
        fn().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    model.train()
    model.push_forward = True
    pushed = grads(lambda: loss(model(sample), sample.y, sample.weight))
    # Reference: two steps without gradient, then one step from the detached state.
    batch = torch.zeros(sample.x.shape[0], dtype=torch.long)

    def last_step_only():
        u = sample.x
        with torch.no_grad():
            for k in range(2):
                u = model.step(sample, u, None, sample.cond[:, k], batch)
        u3 = model.step(sample, u.detach(), None, sample.cond[:, 2], batch)
        return relative_lp(u3, sample.y[:, 2:3], sample.weight)

    reference = grads(last_step_only)
    assert len(pushed) == len(reference)
    for a, b in zip(pushed, reference):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
    model.push_forward = False
    through_all = grads(lambda: loss(model(sample), sample.y, sample.weight))
    assert max((a - b).abs().max() for a, b in zip(through_all, pushed)) > 1e-6
    # in evaluation the mode changes nothing
    model.eval()
    out = model(sample)
    model.push_forward = True
    assert torch.equal(model(sample), out)
    assert torch.equal(sample.x, series[0].fields["u"][0][:, None])  # the sample is unchanged


def test_a_k_step_forward_equals_k_chained_steps_and_chunked_rollouts(tmp_path):
    series = _series(tmp_path, steps=8)
    model = _model(series).eval()
    s = series[1]
    full = rollout(model, rollout_sample(s, ["u"], [], 0, 7, True, torch.float64))
    assert full.shape == (7, 49, 1)
    assert torch.allclose(rollout(model, rollout_sample(s, ["u"], [], 0, 7, True, torch.float64),
                                  chunk=3), full, rtol=1e-12, atol=1e-15)
    u = s.fields["u"][0][:, None]
    for k in range(7):
        one = rollout_sample(s, ["u"], [], k, 1, True, torch.float64)
        one.x = u
        u = model.predict(one)
        assert torch.allclose(u, full[k], rtol=1e-12, atol=1e-15)


def test_windows_hold_the_right_steps(tmp_path):
    series = _series(tmp_path, count=2, steps=6)
    w = rollout_windows(series, ["u"], [], 3, True, torch.float64)
    assert len(w) == 2 * (6 - 3)
    s, k = series[1], 2
    win = w[3 + k]
    u = s.fields["u"]
    assert torch.equal(win.x[:, 0], u[k])
    for j in range(3):  # step-major: column j is step k + 1 + j
        assert torch.equal(win.y[:, j], u[k + 1 + j])
        t = s.times[k + j]
        assert win.cond[0, j].tolist() == [t.item(), (s.times[k + j + 1] - t).item(),
                                           *s.params[0].tolist()]
    assert win.pos is w[3].pos  # one mesh tensor per series: structures built once
    with pytest.raises(Exception, match=r"6 time steps, too few for windows of 6 step"):
        rollout_windows(series, ["u"], [], 6, True, torch.float64)


def test_series_statistics_match_a_plain_reference(tmp_path):
    series = _series(tmp_path / "a", count=2, steps=5)
    series += _series(tmp_path / "b", count=1, steps=4, seed=5)
    series[2].times = series[2].times * 3  # another time step
    stats = series_statistics(series, ["u"], [], True)
    # plain loops: weighted over every (step, point) of every series
    num = den = 0.0
    rows, conds = [], []
    for s in series:
        w = s.mesh.weight.tolist()
        for k in range(len(s)):
            for i, wi in enumerate(w):
                rows.append((wi, s.fields["u"][k, i].item()))
        for k in range(len(s) - 1):
            dt = (s.times[k + 1] - s.times[k]).item()
            conds.append([s.times[k].item(), dt, *s.params[0].tolist()])
    num = sum(w * v for w, v in rows)
    den = sum(w for w, _ in rows)
    mean = num / den
    std = math.sqrt(sum(w * (v - mean) ** 2 for w, v in rows) / den)
    assert stats["state"][0].item() == pytest.approx(mean, rel=1e-12, abs=1e-15)
    assert stats["state"][1].item() == pytest.approx(std, rel=1e-12)
    c = np.asarray(conds)
    assert np.allclose(stats["condition"][0].numpy(), c.mean(0), rtol=1e-12)
    assert np.allclose(stats["condition"][1].numpy(), c.std(0), rtol=1e-12)
    # a condition that never varies (dt of one series set) gets max(|mean|, 1)
    one = series_statistics(series[:2], ["u"], [], True)
    assert one["condition"][1][1].item() == 1.0 and one["condition"][0][1].item() == \
        pytest.approx(DT, rel=1e-12)


def test_rollout_loss_is_the_mean_of_the_steps_relative_errors():
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(7, 6, generator=g, dtype=torch.float64), \
        torch.randn(7, 6, generator=g, dtype=torch.float64)
    w = torch.rand(7, generator=g, dtype=torch.float64)
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    per = []
    for b in (0, 1):
        idx = (batch == b).nonzero()[:, 0]
        for k in range(3):  # 3 steps of 2 channels
            e = sum(w[i] * ((pred[i, 2 * k:2 * k + 2] - target[i, 2 * k:2 * k + 2]) ** 2).sum()
                    for i in idx)
            n = sum(w[i] * (target[i, 2 * k:2 * k + 2] ** 2).sum() for i in idx)
            per.append((b, k, math.sqrt(e / n)))
    all_steps = sum(v for _, _, v in per) / len(per)
    last = sum(v for _, k, v in per if k == 2) / 2
    assert RolloutLoss(2)(pred, target, w, batch).item() == pytest.approx(all_steps, rel=1e-12)
    assert RolloutLoss(2, last_only=True)(pred, target, w, batch).item() == \
        pytest.approx(last, rel=1e-12)
    with pytest.raises(ValueError, match="not a multiple of the 4 state channels"):
        RolloutLoss(4)(pred, target, w, batch)
    # scaled: each step's square error integrated over the domain, in units of scale
    scale = [0.5, 2.0]
    per = []
    for b in (0, 1):
        idx = (batch == b).nonzero()[:, 0]
        steps = [sum(w[i] * sum(((pred[i, 2 * k + c] - target[i, 2 * k + c]) / scale[c]) ** 2
                                for c in (0, 1)) for i in idx) / w[idx].sum()
                 for k in range(3)]
        per.append(steps)
    mse = RolloutLoss(2, scale=scale)(pred, target, w, batch).item()
    assert mse == pytest.approx(float(np.mean([np.mean(p) for p in per])), rel=1e-12)
    assert RolloutLoss(2, last_only=True, scale=scale)(pred, target, w, batch).item() == \
        pytest.approx(float(np.mean([p[2] for p in per])), rel=1e-12)


def test_next_step_checkpoint_round_trip(tmp_path):
    series = _series(tmp_path)
    model = _model(series).float().eval()  # checkpoints load in float32
    sample = rollout_sample(series[0], ["u"], [], 1, 3, True, torch.float32)
    path = model.save(tmp_path / "m.pt", series=True)
    loaded = NeuralOperator.from_checkpoint(path).eval()
    assert isinstance(loaded, NextStep) and loaded.modes == 4
    assert torch.equal(loaded.rate_normalizer.std, model.rate_normalizer.std)
    assert torch.equal(loaded(sample), model(sample))


# ------------------------------------------------------------------ the command line
def _run(argv, capsys):
    code = cli_main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def heat(tmp_path_factory):
    """Six training and three test series of the exact solution (.pvd, dt = 0.02), and a
    run trained on them."""
    root = tmp_path_factory.mktemp("heat")
    params = series_params(9, seed=1)
    write_heat_series(root / "train", params[:6], steps=11, dt=DT, fmt="pvd")
    write_heat_series(root / "test", params[6:], steps=11, dt=DT, fmt="pvd")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = cli_main(["train", "--series", "--data", str(root / "train"), "--inputs", "",
                         "--targets", "u", "--params", "kappa,a", "--model", "transformer_no",
                         "--model-config", "width=16", "layers=1", "heads=2", "--epochs", "25",
                         "--batch-size", "8", "--lr", "3e-3", "--rollout-train", "2",
                         "--val-fraction", "0.2", "--out", str(root / "run")])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    return root, params


def test_evaluate_baselines_equal_their_exact_errors(heat, capsys):
    root, params = heat
    code, out, err = _run(["evaluate", str(root / "run"), "--data", str(root / "test"),
                           "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["horizon"] == 10 and rep["n"] == 3
    assert np.allclose(rep["times"], DT * np.arange(1, 11), rtol=1e-12)
    h = np.arange(1, 11)
    test = params[6:]
    # persistence: u_0 / u_h - 1 = exp(2 pi^2 kappa h dt) - 1
    pers = np.asarray(rep["predictors"]["persistence"]["errors"])
    exact = np.exp(2 * np.pi ** 2 * test[:, :1] * h * DT) - 1
    assert np.allclose(pers, exact, rtol=1e-9)
    # nearest training trajectory by the standardised parameters of the run's training
    # split: its states a_j e^{-l_j t} against a_s e^{-l_s t}
    meta = torch.load(root / "run" / "best.pt", weights_only=True)["metadata"]
    train = {f"s{i:02d}": params[i] for i in range(6)}
    used = np.asarray([train[n] for n in meta["split"]["train"]])
    scale = used.std(0)
    near = np.asarray(rep["predictors"]["nearest training trajectory"]["errors"])
    for s, (kappa, a) in enumerate(test):
        j = np.argmin((((used - [kappa, a]) / scale) ** 2).sum(1))
        kj, aj = used[j]
        ratio = aj / a * np.exp(-2 * np.pi ** 2 * (kj - kappa) * h * DT)
        assert np.allclose(near[s], np.abs(ratio - 1), rtol=1e-9)
    stats = rep["predictors"]["persistence"]["steps"]
    assert [st["mean"] for st in stats] == pytest.approx(list(exact.mean(0)), rel=1e-9)
    assert [st["worst"] for st in stats] == pytest.approx(list(exact.max(0)), rel=1e-9)


def test_trained_model_beats_persistence_at_every_step(heat, capsys):
    root, params = heat
    code, out, err = _run(["evaluate", str(root / "run"), "--data", str(root / "test"),
                           "--json"], capsys)
    rep = json.loads(out)
    model = np.asarray(rep["predictors"]["model"]["errors"])
    pers = np.asarray(rep["predictors"]["persistence"]["errors"])
    # The exact step multiplies the state by decay(kappa, dt); persistence misses it by
    # exp(lambda h dt) - 1 after h steps (checked above). The model, trained for a few
    # seconds, is below that at every step of every series, and below half of it on
    # average.
    ratio = model / pers
    assert (ratio < 1).all() and ratio.mean() < 0.5, ratio
    assert rep["below"]["persistence"]["steps_below"] == 10


def test_predict_rollout_writes_the_rollout_as_a_paraview_series(heat, tmp_path, capsys):
    root, _ = heat
    code, out, err = _run(["predict", str(root / "run"), str(root / "test" / "s01.pvd"),
                           "--rollout", "14", "--start", "2", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    written = read_series(tmp_path / "s01.pvd", ["u_pred"])
    truth = read_series(root / "test" / "s01.pvd", ["u"], ["kappa", "a"])
    assert len(written) == 15
    # times: the series' own, then extended by its last time step past its end
    assert np.allclose(written.times.numpy(), DT * np.arange(2, 17), rtol=1e-12)
    model = NeuralOperator.from_checkpoint(root / "run" / "best.pt").eval()
    sample = rollout_sample(truth, ["u"], [], 2, 14, True, torch.float32,
                            with_targets=False, times=written.times.new_tensor(
                                DT * np.arange(17)))
    expected = rollout(model, sample)[:, :, 0]
    got = written.fields["u_pred"]
    assert torch.equal(got[0], truth.fields["u"][2])  # the start state
    assert torch.allclose(got[1:], expected, rtol=0, atol=1e-12)
    # the series' own fields beside the prediction while it has the step
    from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh
    assert torch.equal(read_mesh(tmp_path / "s01" / "s01_0008.vtu").fields["u"],
                       truth.fields["u"][10])
    assert "u" not in read_mesh(tmp_path / "s01" / "s01_0009.vtu").fields
    # a single mesh file as the initial state (parameters from the table beside it)
    pts, cells, t, u = heat_states(0.1, 1.0, 2, DT)
    write_mesh(tmp_path / "init" / "start.vtu", mesh_from_arrays(pts, cells),
               point_data={"u": u[0]})
    (tmp_path / "init" / "params.csv").write_text("file,kappa,a\nstart.vtu,0.1,1.0\n")
    code, out, err = _run(["predict", str(root / "run"), str(tmp_path / "init" / "start.vtu"),
                           "--rollout", "3", "-o", str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert len(read_series(tmp_path / "out" / "start.pvd", ["u_pred"])) == 4


def test_series_cli_errors_are_one_line(heat, tmp_path, capsys):
    root, _ = heat
    cases = [
        (["predict", str(root / "run"), str(root / "test"), "-o", str(tmp_path)],
         "a time-series run predicts rollouts: pass --rollout N"),
        (["train", "--data", str(root / "train"), "--inputs", "", "--targets", "u",
          "--rollout-train", "3", "--out", str(tmp_path / "r")],
         "--rollout-train apply to time series: add --series"),
        (["train", "--series", "--data", str(root / "train"), "--inputs", "", "--targets", "u",
          "--params", "kappa,a", "--rollout-train", "11", "--out", str(tmp_path / "r")],
         "11 time steps, too few for windows of 11 step(s) (--rollout-train 11)"),
        (["train", "--series", "--data", str(root / "train"), "--inputs", "", "--targets", "u",
          "--params", "kappa,b", "--out", str(tmp_path / "r")],
         "s00.pvd: no column 'b' (columns: kappa, a)"),
        (["evaluate", str(root / "run"), "--data", str(root / "test"), "--start", "10"],
         "11 time steps leave no step to predict after --start 10"),
    ]
    for argv, msg in cases:
        code, out, err = _run(argv, capsys)
        assert code == 2 and one_line_error(err) and msg in err, (argv, err)
    assert not (tmp_path / "r").exists()


def test_a_series_run_refuses_shards(heat, tmp_path, capsys):
    """Issue 38, item 13: --shards was ignored by a series run without a word."""
    root, _ = heat
    code, out, err = _run(["train", "--series", "--data", str(root / "train"), "--inputs", "",
                           "--targets", "u", "--params", "kappa,a", "--shards", "2",
                           "--epochs", "1", "--model-config", "width=8", "heads=2",
                           "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and one_line_error(err), err
    assert "train --series: --shards does not apply to time series" in err
    assert not (tmp_path / "r").exists()


def test_a_run_config_resolves_to_itself(heat, capsys):
    root, _ = heat
    config = root / "run" / "config.yaml"
    code, out, err = _run(["train", "--config", str(config), "--dry-run"], capsys)
    assert code == 0, err
    assert out == config.read_text()
    assert "series: true" in out and "rollout_train: 2" in out


def test_time_features_start_at_half_octaves():
    from meshops.models.next_step import TimeFeatures

    f = TimeFeatures(3).double()
    f.reset_parameters()  # the initial frequencies, in float64
    t = torch.tensor([[0.3], [-1.2]], dtype=torch.float64)
    w = [math.pi, math.pi * math.sqrt(2), 2 * math.pi]
    expected = [[v, *[math.sin(wj * v) for wj in w], *[math.cos(wj * v) for wj in w]]
                for v in (0.3, -1.2)]
    assert torch.allclose(f(t), torch.tensor(expected, dtype=torch.float64), rtol=1e-14)
    assert f.out_channels == 7 and TimeFeatures(0)(t) is t


def test_input_fields_are_taken_at_every_step(tmp_path):
    from meshops.datasets.series import SeriesError, write_series
    from meshops.mesh.io import mesh_from_arrays

    pts, cells, t, u = heat_states(0.1, 1.0, 6, DT)
    f = np.stack([np.cos(k + pts[:, 0]) for k in range(6)])  # a forcing, known per step
    write_series(tmp_path / "s.pvd", mesh_from_arrays(pts, cells),
                 [{"u": u[k], "f": f[k]} for k in range(6)], t)
    s = read_series(tmp_path / "s.pvd", ["u", "f"])
    w = rollout_windows([s], ["u"], ["f"], 2, True, torch.float64)
    assert all(torch.equal(w[k].step_inputs[:, j, 0], s.fields["f"][k + j])
               for k in range(4) for j in range(2))
    torch.manual_seed(0)
    model = NextStep("transformer_no", 1, 2, 1, 0, True, TINY, condition_width=8, modes=4)
    model.set_statistics(series_statistics([s], ["u"], ["f"], True))
    model = model.double().eval()
    out = model(w[1])
    one = rollout_sample(s, ["u"], ["f"], 2, 1, True, torch.float64)
    one.x = out[:, :1]
    assert torch.allclose(model(one), out[:, 1:], rtol=1e-12, atol=1e-15)
    # beyond the end the input fields are missing: named
    with pytest.raises(SeriesError, match=r"s.pvd: time step 6 is needed \(the input fields of "
                                          r"the rollout\) but the series ends at time step 5"):
        rollout_sample(s, ["u"], ["f"], 3, 4, True, torch.float64, with_targets=False,
                       times=torch.arange(8, dtype=torch.float64) * DT)


def test_a_series_run_resumes(heat, tmp_path, capsys):
    root, _ = heat
    argv = ["train", "--series", "--data", str(root / "train"), "--inputs", "", "--targets",
            "u", "--params", "kappa,a", "--model", "transformer_no", "--model-config",
            "width=8", "layers=1", "heads=2", "--batch-size", "16", "--scheduler", "none",
            "--out", str(tmp_path / "r")]
    code, out, err = _run(argv + ["--epochs", "1"], capsys)
    assert code == 0, err
    code, out, err = _run(argv + ["--epochs", "2", "--resume"], capsys)
    assert code == 0, err
    epochs = [ln.split()[1] for ln in out.splitlines() if ln.startswith("epoch ")]
    assert "resumed from" in out and epochs == ["2/2"], out
    history = json.loads((tmp_path / "r" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    # another option on resume is refused before anything is written
    code, out, err = _run(argv + ["--epochs", "3", "--resume", "--rollout-train", "3"], capsys)
    assert code == 2 and one_line_error(err) and "--rollout-train is 3 (the run: 2)" in err, err


def test_evaluate_json_of_a_rollout_that_fails_is_valid_json(heat, capsys, monkeypatch):
    # issue 28: a rollout that reaches non-finite values gave inf errors, written as
    # `Infinity`, which is not JSON
    import meshops.training.rollout as rollout_module

    root, _ = heat
    real, calls = rollout_module.rollout, []

    def failing(model, sample):
        out = real(model, sample)
        calls.append(1)
        if len(calls) == 2:   # the second series blows up after its 4th step
            out[4:] = math.inf
        return out

    monkeypatch.setattr(rollout_module, "rollout", failing)
    code, out, err = _run(["evaluate", str(root / "run"), "--data", str(root / "test"),
                           "--json"], capsys)
    assert code == 0, err

    def refuse(name):
        raise AssertionError(f"{name} is not JSON")

    rep = json.loads(out, parse_constant=refuse)
    model = rep["predictors"]["model"]
    assert model["errors"][1][:4] == pytest.approx(model["errors"][0][:4], rel=10)
    assert model["errors"][1][4:] == [None] * 6 and None not in model["errors"][0]
    assert model["all_steps_mean"] is None and model["steps"][4]["mean"] is None
    assert model["steps"][4]["worst_series"] == rep["series"][1]
    assert "null" in rep["note"] and "not finite" in rep["note"]


def test_series_training_takes_logger_none(tmp_path, capsys):
    # issue 28: `--logger none` was refused as an option that does not apply to series
    write_heat_series(tmp_path / "d", series_params(3, seed=2), steps=4, dt=DT, fmt="pvd")
    code, out, err = _run(["train", "--series", "--data", str(tmp_path / "d"), "--inputs", "",
                           "--targets", "u", "--params", "kappa,a", "--model", "transformer_no",
                           "--model-config", "width=8", "layers=1", "heads=2", "--epochs",
                           "1", "--logger", "none", "--out", str(tmp_path / "run")], capsys)
    assert code == 0, err
    code, out, err = _run(["train", "--series", "--data", str(tmp_path / "d"), "--inputs", "",
                           "--targets", "u", "--params", "kappa,a", "--logger", "tensorboard",
                           "--out", str(tmp_path / "r2")], capsys)
    assert code == 2 and one_line_error(err) and "--logger does not apply" in err, err
