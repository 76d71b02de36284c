"""The examples' numbers: checkpoint selection on held-out training samples (never the
test set), the published recipe under --full, split sizes from the flags on small
Geo-FNO files, and the baselines next to the model's test error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import meshops
from data_adapters.elasticity import SIGMA_FILE, XY_FILE
from data_adapters.naca import Q_FILE, X_FILE, Y_FILE
from meshops.mesh.data import MeshData
from meshops.models import NeuralOperator
from meshops.training import relative_lp
from meshops.training.splits import validation_split

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import airfoil  # noqa: E402
import common  # noqa: E402
import elasticity  # noqa: E402


class _Spy:
    """Wraps common.Trainer: records what each Trainer is given and what it evaluates."""

    def __init__(self, monkeypatch, stop: bool = False):
        self.calls, self.evaluated, self.trainers = [], [], []
        real = common.Trainer
        spy = self

        class Recording(real):
            def __init__(self, model, train_data, val_data=None, **kw):
                spy.calls.append({"model": model, "train": list(train_data),
                                  "val": None if val_data is None else list(val_data), **kw})
                if stop:
                    raise _Stop
                super().__init__(model, train_data, val_data, **kw)
                spy.trainers.append(self)

            def evaluate(self, data=None):
                spy.evaluated.append(list(self.val_data if data is None else data))
                return super().evaluate(data)

        monkeypatch.setattr(common, "Trainer", Recording)


class _Stop(Exception):
    pass


def _cloud(k, n=24):
    """A point cloud sample whose field depends on its index k."""
    g = torch.Generator().manual_seed(k)
    pos = torch.rand(n, 2, generator=g)
    y = (1 + 0.1 * k) * torch.sin(3 * pos[:, :1]) + pos[:, 1:] + 1
    return MeshData(pos=pos, weight=torch.full((n,), 1.0 / n), x=torch.zeros(n, 0), y=y,
                    sample_id=k)


def _args(out, **kw):
    base = dict(model="transformer_no", epochs=3, batch_size=4, lr=1e-3, weight_decay=0.0,
                val_fraction=0.25, unweighted_loss=False, out=out, device="cpu", seed=2)
    return argparse.Namespace(**{**base, **kw})


SMALL = {"transformer_no": {"width": 8, "layers": 1, "heads": 2}}


def test_selection_never_sees_the_test_samples(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    train, test = [_cloud(k) for k in range(12)], [_cloud(100 + k) for k in range(5)]
    summary = common.run(_args(tmp_path / "run"), train, test, target="u",
                         model_config=SMALL, title="t")
    (call,) = spy.calls
    test_ids = {int(s.sample_id) for s in test}
    fit_ids = [int(s.sample_id) for s in call["train"]]
    val_ids = [int(s.sample_id) for s in call["val"]]
    # the validation samples are the seeded 25 % of the training samples, disjoint from
    # the fitted ones, and no test sample is fitted, validated on or evaluated by the trainer
    assert (fit_ids, val_ids) == validation_split(12, 0.25, seed=2)
    assert not (set(fit_ids) | set(val_ids)) & test_ids
    assert all(int(s.sample_id) not in test_ids for batch in spy.evaluated for s in batch)
    assert len(spy.evaluated) == 3  # one validation per epoch
    # best.pt holds the epoch that validation picked, with validation metrics
    best = NeuralOperator.from_checkpoint(tmp_path / "run" / "best.pt")
    trainer = spy.trainers[0]
    assert best.metadata["epoch"] == trainer.best["epoch"]
    assert best.metadata["val"]["n"] == 3
    assert summary["num_val"] == 3 and f"epoch {trainer.best['epoch']}" in summary["selected"]
    # the reported test errors are those of best.pt on the test samples
    errs = [float(relative_lp(best.predict(s), s.y, s.weight)) for s in test]
    assert summary["test_relative_l2_mean"] == pytest.approx(np.mean(errs), rel=1e-6)
    assert summary["test_relative_l2_worst"] == pytest.approx(max(errs), rel=1e-6)


def test_without_validation_split_best_pt_is_the_last_epoch(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    train, test = [_cloud(k) for k in range(6)], [_cloud(50 + k) for k in range(3)]
    summary = common.run(_args(tmp_path / "run", val_fraction=0.0, epochs=2), train, test,
                         target="u", model_config=SMALL, title="t")
    assert spy.calls[0]["val"] is None and spy.evaluated == []
    best = NeuralOperator.from_checkpoint(tmp_path / "run" / "best.pt")
    assert best.metadata["epoch"] == 2 and best.metadata["selected"].startswith("last epoch")
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(v, last[k]) for k, v in best.state_dict().items())
    assert summary["num_val"] == 0 and "no validation split" in summary["selected"]


# -------------------------------------------------------- small Geo-FNO files
def _write_naca(root: Path, n: int, n0: int = 9, n1: int = 5) -> np.ndarray:
    """n samples of a smoothly bent n0 x n1 grid (no tangled cells), Q channels
    c + 0.1 s + x - y: returns Q."""
    u, v = np.meshgrid(np.linspace(0, 1, n0), np.linspace(0, 1, n1), indexing="ij")
    s = np.arange(n)[:, None, None]
    X = u[None] + 0.02 * s * v[None] ** 2
    Y = v[None] + 0.05 * np.sin(np.pi * u[None]) * (1 + 0.1 * s)
    Q = np.stack([c + 0.1 * s + X - Y for c in range(5)], axis=1) + 2.0
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / X_FILE, X)
    np.save(root / Y_FILE, Y)
    np.save(root / Q_FILE, Q)
    return Q


def _write_elasticity(root: Path, n: int, p: int = 60) -> np.ndarray:
    """n point clouds of p points in the unit cell, points-first; sigma = s + x + 2y."""
    rng = np.random.default_rng(0)
    XY = rng.uniform(0.02, 0.98, (p, 2, n))
    sigma = np.arange(n)[None, :] + XY[:, 0] + 2 * XY[:, 1] + 1.0
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / XY_FILE, XY)
    np.save(root / SIGMA_FILE, sigma)
    return sigma


def _truths(out: Path, target: str) -> list[np.ndarray]:
    files = sorted((out / "predictions").glob("*.vtu"))
    return [meshops.read_mesh(f).fields[target].numpy() for f in files]


QUICK = ["--model", "transformer_no", "--epochs", "1", "--device", "cpu"]


def test_airfoil_split_sizes_from_the_flags(tmp_path, monkeypatch):
    """A 12-sample file: train [:8] (6 fitted, 2 validation), test [8:12]; the
    baselines, fitted on all 8, are reported on those test samples with the trainer's
    metric."""
    monkeypatch.setattr(common, "plot_comparisons", lambda *a, **k: Path("fig.png"))
    data, out = tmp_path / "naca", tmp_path / "run"
    Q = _write_naca(data, 12)
    summary = airfoil.main(["--data", str(data), "--num-train", "8", "--num-test", "4",
                            "--val-fraction", "0.25", "--out", str(out), *QUICK])
    assert summary["num_train"] == 8 and summary["num_test"] == 4 and summary["num_val"] == 2
    for truth, s in zip(_truths(out, "mach"), range(8, 12)):
        np.testing.assert_allclose(truth, Q[s, 4].ravel(), rtol=1e-6)
    # training mean on the C-grid index: the mean Mach of all 8 training samples (the
    # baselines have no epochs to select, so they are fitted on the validation ones too)
    mean = Q[:8, 4].reshape(8, -1).mean(0)
    ref = [np.sqrt(((mean - Q[s, 4].ravel()) ** 2).sum() / (Q[s, 4] ** 2).sum())
           for s in range(8, 12)]
    got = summary["baselines"]["training mean"]["l2_unweighted"]
    assert got["mean"] == pytest.approx(np.mean(ref), rel=1e-5)
    assert got["worst"] == pytest.approx(max(ref), rel=1e-5)
    # geometry only: the nearest training grid is the neighbouring sample s = 7
    near = summary["baselines"]["nearest training sample"]
    assert "matched points" in near["note"]
    ref7 = [np.sqrt(((Q[7, 4] - Q[s, 4]) ** 2).sum() / (Q[s, 4] ** 2).sum())
            for s in range(8, 12)]
    assert near["l2_unweighted"]["mean"] == pytest.approx(np.mean(ref7), rel=1e-5)


def test_elasticity_split_sizes_from_the_flags(tmp_path, monkeypatch):
    """Elasticity's test block is at the end of the file: train [:6], test [-3:]."""
    monkeypatch.setattr(common, "plot_comparisons", lambda *a, **k: Path("fig.png"))
    data, out = tmp_path / "el", tmp_path / "run"
    sigma = _write_elasticity(data, 10)
    summary = elasticity.main(["--data", str(data), "--num-train", "6", "--num-test", "3",
                               "--no-void-distance", "--out", str(out), *QUICK])
    assert summary["num_train"] == 6 and summary["num_test"] == 3
    for truth, s in zip(_truths(out, "sigma"), range(7, 10)):
        np.testing.assert_allclose(truth, sigma[:, s], rtol=1e-6)
    assert summary["baselines"]["training mean"]["note"].startswith("n/a: meshes differ")


@pytest.mark.parametrize("script, n, flags, message", [
    (airfoil, 12, ["--num-train", "10", "--num-test", "4"],
     "the files hold 12 samples, fewer than --num-train 10 + --num-test 4"),
    (elasticity, 10, ["--num-train", "8", "--num-test", "3", "--no-void-distance"],
     "the files hold 10 samples, fewer than --num-train 8 + --num-test 3"),
])
def test_too_few_samples_is_a_clear_error(tmp_path, capsys, script, n, flags, message):
    data = tmp_path / "d"
    (_write_naca if script is airfoil else _write_elasticity)(data, n)
    with pytest.raises(SystemExit) as exc:
        script.main(["--data", str(data), *flags, "--out", str(tmp_path / "o"), *QUICK])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"error: {data}: {message}; pass smaller --num-train/--num-test")


# ------------------------------------------------------------------- --full
@pytest.mark.parametrize("script, batch, pit", [
    (airfoil, 8, {"width": 256, "heads": 2, "blocks": 4, "stride": 2, "ball": "count",
                  "quantile_in": 0.005, "quantile_out": 0.02}),
    (elasticity, 10, {"width": 512, "heads": 8, "blocks": 4, "latent": "input",
                      "ball": "count", "quantile_in": 0.02, "quantile_out": 0.02}),
])
def test_full_is_the_published_recipe(tmp_path, monkeypatch, script, batch, pit):
    """--full: Adam without weight decay, lr 1e-3, cosine, 500 epochs, the unweighted
    loss, no validation split, the paper's batch size and model (PiT, Tables 6-9)."""
    spy = _Spy(monkeypatch, stop=True)
    data = tmp_path / "d"
    (_write_naca if script is airfoil else _write_elasticity)(data, 12)
    with pytest.raises(_Stop):
        script.main(["--data", str(data), "--full", "--num-train", "8", "--num-test", "4",
                     "--out", str(tmp_path / "o")])
    (call,) = spy.calls
    assert call["val"] is None and len(call["train"]) == 8
    assert call["epochs"] == 500 and call["batch_size"] == batch
    assert call["loss"].quadrature is False and call["scheduler"] == "cosine"
    config = dict(call["model"].config)
    assert {k: config[k] for k in pit} == pit
    if script is elasticity:
        assert call["model"].in_channels == 0  # the geometry alone, as published
    # The optimiser the Trainer builds from these arguments: plain Adam, lr 1e-3, no decay.
    kw = {k: v for k, v in call.items() if k not in ("model", "train", "val")}
    trainer = common.Trainer.__mro__[1](call["model"], call["train"], None,
                                        **{**kw, "out_dir": None})
    opt = trainer.optimizer
    assert type(opt) is torch.optim.Adam
    assert opt.param_groups[0]["weight_decay"] == 0.0 and opt.defaults["lr"] == 1e-3
