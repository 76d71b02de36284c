"""Training: the relative L2 loss, samples and normalisers, the Trainer (overfitting,
resumption, best checkpoint, AMP fallback, query points) and DDP on CPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import square_mesh
from _procs import run_group
from torch import nn
from torch_geometric.utils import scatter

from meshops import MeshData, MeshError
from meshops.mesh.io import mesh_from_arrays
from meshops.models import NeuralOperator, register_model
from meshops.training import RelativeLpLoss, relative_lp
from meshops.training import trainer as trainer_mod
from meshops.training.dataset import assemble, fit_normalizers
from meshops.training.seed import seed_everything
from meshops.training.trainer import Trainer

TESTS = Path(__file__).parents[1]  # holds the script torchrun runs


# --------------------------------------------------------------------- toy model
@register_model("_test_mlp")
class ToyOperator(NeuralOperator):
    """Pointwise MLP lift, quadrature mean over each sample (an integral operator),
    pointwise projection of [feature, mean]: enough to represent
    ``u = a (1 + x) + integral of a``.

    With ``queries`` the output is at ``query_pos``: projection of
    [lift of the query position, mean]."""

    def __init__(self, in_channels: int = 1, out_channels: int = 1, dim: int = 2,
                 hidden: int = 32, dropout: float = 0.0, queries: bool = False) -> None:
        super().__init__()
        self.lift = nn.Sequential(nn.Linear(in_channels + dim, hidden), nn.GELU(),
                                  nn.Linear(hidden, hidden))
        self.drop = nn.Dropout(dropout)
        self.proj = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.GELU(),
                                  nn.Linear(hidden, out_channels))
        self.qlift = nn.Linear(dim, hidden) if queries else None
        self.fail_after: int | None = None  # simulate a killed run: raise on that training call
        self.calls = 0
        self.last_dtype: torch.dtype | None = None

    def forward(self, data):
        if self.training:
            self.calls += 1
            if self.fail_after is not None and self.calls > self.fail_after:
                raise RuntimeError("killed")
        n = data.pos.shape[0]
        b = getattr(data, "batch", None)
        b = torch.zeros(n, dtype=torch.long) if b is None else b
        h = self.drop(self.lift(torch.cat([data.x, data.pos.to(data.x.dtype)], -1)))
        self.last_dtype = h.dtype
        w = data.weight.to(h.dtype)[:, None]
        mean = scatter(w * h, b, 0, reduce="sum") / scatter(w, b, 0, reduce="sum")
        if self.qlift is None:
            return self.proj(torch.cat([h, mean[b]], -1))
        qb = getattr(data, "query_batch", None)
        qb = torch.zeros(data.query_pos.shape[0], dtype=torch.long) if qb is None else qb
        hq = self.qlift(data.query_pos.to(h.dtype))
        return self.proj(torch.cat([hq, mean[qb]], -1))


def make_meshes(n: int, seed: int, shift: float = 0.0, scale: float = 1.0) -> list[MeshData]:
    """``n`` perturbed triangle meshes of the unit square (4..7 cells a side) with
    ``a = c0 sin(pi x) + c1 cos(pi y) + c2`` and ``u = a (1 + x) + integral of a``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        pts, cells = square_mesh(4 + i % 4, "triangle", amount=0.3, seed=seed * 100 + i)
        c = rng.normal(size=3)
        a = scale * (c[0] * np.sin(np.pi * pts[:, 0]) + c[1] * np.cos(np.pi * pts[:, 1])
                     + c[2]) + shift
        mesh = mesh_from_arrays(pts, cells, {"a": a}, source=f"toy{seed}-{i}.vtu")
        u = a * (1 + pts[:, 0]) + float((mesh.weight.numpy() * a).sum())
        mesh.fields["u"] = torch.from_numpy(u)
        out.append(mesh)
    return out


def make_samples(n: int, seed: int, dtype=torch.float32, **kw) -> list[MeshData]:
    return [assemble(m, ["a"], ["u"], dtype) for m in make_meshes(n, seed, **kw)]


# Shared with tests/_ddp_script.py: the DDP run and its single-process reference.
DDP_KW = dict(epochs=8, lr=2e-2, scheduler="cosine", shuffle=True, seed=3, progress=False)


def ddp_data():
    return make_samples(8, 11, torch.float64), make_samples(3, 12, torch.float64)


def ddp_model():
    seed_everything(5)
    return ToyOperator(hidden=16).double()


pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


# --------------------------------------------------------------------- loss
def _hand_rel_l2(pred, target, weight):
    """Relative L2 of one sample by hand, numpy, channels pooled."""
    pred = np.asarray(pred, float).reshape(len(pred), -1)
    target = np.asarray(target, float).reshape(len(pred), -1)
    w = np.ones(len(pred)) if weight is None else np.asarray(weight, float)
    num = sum(w[i] * sum((pred[i, c] - target[i, c]) ** 2 for c in range(pred.shape[1]))
              for i in range(len(pred)))
    den = sum(w[i] * sum(target[i, c] ** 2 for c in range(pred.shape[1])) for i in range(len(pred)))
    return np.sqrt(num / den)


def test_relative_lp_matches_hand_computation_on_a_ragged_batch():
    g = torch.Generator().manual_seed(0)
    sizes = [3, 7, 5]
    preds = [torch.randn(n, 2, generator=g, dtype=torch.float64) for n in sizes]
    targets = [torch.randn(n, 2, generator=g, dtype=torch.float64) for n in sizes]
    weights = [torch.rand(n, generator=g, dtype=torch.float64) + 0.1 for n in sizes]
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    P, T, W = torch.cat(preds), torch.cat(targets), torch.cat(weights)

    for weighted in (True, False):
        hand = np.array([_hand_rel_l2(p, t, w if weighted else None)
                         for p, t, w in zip(preds, targets, weights)])
        got = relative_lp(P, T, W if weighted else None, batch, reduction="none")
        np.testing.assert_allclose(got.numpy(), hand, rtol=1e-12)
        np.testing.assert_allclose(float(relative_lp(P, T, W if weighted else None, batch)),
                                   hand.mean(), rtol=1e-12)
        np.testing.assert_allclose(float(relative_lp(P, T, W if weighted else None, batch,
                                                     reduction="sum")), hand.sum(), rtol=1e-12)
    # The weighted and unweighted errors are different numbers here.
    assert not np.allclose(relative_lp(P, T, W, batch, reduction="none"),
                           relative_lp(P, T, None, batch, reduction="none"), rtol=1e-3)
    loss = RelativeLpLoss(quadrature=False)
    assert float(loss(P, T, W, batch)) == pytest.approx(float(relative_lp(P, T, None, batch)),
                                                        rel=1e-14)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_an_exactly_predicted_sample_has_a_finite_gradient(p):
    """Issue 38, item 5: ``pow(1/p)`` of an exact 0 has an infinite derivative, and the
    gradient of an exactly predicted sample was NaN (a constant target stopped training
    with a non-finite loss). The norm's subgradient 0 makes that sample's gradient 0,
    and the other sample's gradient is what it is without it."""
    from meshops.datasets.fields import TargetFields

    g = torch.Generator().manual_seed(0)
    target = torch.randn(10, 2, generator=g, dtype=torch.float64)
    weight = torch.rand(10, generator=g, dtype=torch.float64) + 0.1
    batch = torch.tensor([0] * 4 + [1] * 6)
    pred = target.clone()
    pred[4:] += 0.1 * torch.randn(6, 2, generator=g, dtype=torch.float64)
    for fields in (None, TargetFields.from_specs(["u", "v"], {"u": 1, "v": 1})):
        pred = pred.detach().requires_grad_(True)
        relative_lp(pred, target, weight, batch, p=p, reduction="sum", fields=fields).backward()
        assert torch.isfinite(pred.grad).all()
        assert torch.equal(pred.grad[:4], torch.zeros(4, 2, dtype=torch.float64))
        alone = pred[4:].detach().requires_grad_(True)
        relative_lp(alone, target[4:], weight[4:], p=p, reduction="sum",
                    fields=fields).backward()
        torch.testing.assert_close(pred.grad[4:], alone.grad, rtol=1e-12, atol=0)


def test_weighted_loss_is_mesh_independent_and_unweighted_is_not():
    """Splitting points into two copies with half the weight each changes no
    integral, so the quadrature-weighted loss is unchanged; the unweighted loss
    counts the copies twice. (Duplicating *every* point would leave the unweighted
    loss unchanged as well, both norms doubling, so only part of the mesh is
    refined: the left half, as a locally refined mesh would be.)"""
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(40, 2, generator=g, dtype=torch.float64)
    pred = torch.sin(3 * pos[:, :1]) + 0.3 * torch.randn(40, 1, generator=g, dtype=torch.float64)
    target = torch.sin(3 * pos[:, :1]) + pos[:, 1:]
    w = torch.rand(40, generator=g, dtype=torch.float64) + 0.5
    dup = pos[:, 0] < 0.5
    assert 5 < int(dup.sum()) < 35
    w2 = torch.where(dup, w / 2, w)
    pred2, target2 = torch.cat([pred, pred[dup]]), torch.cat([target, target[dup]])
    w2 = torch.cat([w2, w2[dup]])

    assert float(relative_lp(pred2, target2, w2)) == pytest.approx(
        float(relative_lp(pred, target, w)), rel=1e-12)
    assert abs(float(relative_lp(pred2, target2)) - float(relative_lp(pred, target))) > 1e-3
    # Every point duplicated: both unchanged.
    all2 = (torch.cat([pred, pred]), torch.cat([target, target]))
    assert float(relative_lp(*all2, torch.cat([w, w]) / 2)) == pytest.approx(
        float(relative_lp(pred, target, w)), rel=1e-12)
    assert float(relative_lp(*all2)) == pytest.approx(float(relative_lp(pred, target)), rel=1e-12)


# --------------------------------------------------------------------- samples
def test_assemble_builds_x_y_and_names_missing_fields():
    mesh = make_meshes(1, 0)[0]
    mesh.fields["v"] = torch.stack([mesh.pos[:, 0], -mesh.pos[:, 1]], 1)
    s = assemble(mesh, ["v", "a"], ["u"], torch.float32)
    n = mesh.pos.shape[0]
    assert s.x.shape == (n, 3) and s.y.shape == (n, 1)
    assert s.x.dtype == s.y.dtype == s.pos.dtype == s.weight.dtype == torch.float32
    torch.testing.assert_close(s.x[:, :2], mesh.fields["v"].float())  # order as given
    torch.testing.assert_close(s.x[:, 2], mesh.fields["a"].float())
    assert s.source == mesh.source and s.cells is mesh.cells  # the rest kept
    assert mesh.pos.dtype == torch.float64 and "x" not in mesh  # mesh untouched

    geo = assemble(mesh, [], ["u", "v"])
    assert geo.x.shape == (n, 0) and geo.y.shape == (n, 3)
    norm_in, norm_out = fit_normalizers([geo])
    assert norm_in is None and norm_out.channels == 3

    with pytest.raises(MeshError, match=r"toy0-0\.vtu.*'p'.*available fields: \['a', 'u', 'v'\]"):
        assemble(mesh, ["p"], ["u"])
    with pytest.raises(ValueError, match="target"):
        assemble(mesh, ["a"], ["nope"])


def _weighted_stats(samples, key):
    """Quadrature-weighted mean and std per channel by hand (numpy, float64)."""
    x = np.concatenate([s[key].double().numpy() for s in samples])
    w = np.concatenate([s.weight.double().numpy() for s in samples])[:, None]
    mean = (w * x).sum(0) / w.sum()
    return mean, np.sqrt((w * (x - mean) ** 2).sum(0) / w.sum())


def test_normalizers_are_fitted_on_the_training_split_only():
    train = make_samples(6, 0)
    val = make_samples(3, 1, shift=40.0, scale=5.0)  # a very different distribution
    seed_everything(0)
    model = ToyOperator()
    trainer = Trainer(model, train, val, epochs=2, batch_size=3, progress=False, log=None)
    trainer.fit()
    for norm, key in ((model.input_normalizer, "x"), (model.output_normalizer, "y")):
        mean, std = _weighted_stats(train, key)
        np.testing.assert_allclose(norm.mean.double().numpy(), mean, rtol=1e-5)
        np.testing.assert_allclose(norm.std.double().numpy(), std, rtol=1e-5)
        # The check can tell: statistics with the validation data are far off.
        mean_all, _ = _weighted_stats(train + val, key)
        assert np.abs(mean_all - mean).max() > 1.0

    # The trainer's metric is the relative L2 of model.predict, in physical units.
    hand = np.mean([float(relative_lp(model.predict(s), s.y, s.weight)) for s in val])
    assert trainer.evaluate(val)["l2_mean"] == pytest.approx(hand, rel=1e-5)


# --------------------------------------------------------------------- Trainer
def test_training_loss_falls_100x_on_a_tiny_dataset():
    train = make_samples(8, 0)
    seed_everything(0)
    model = ToyOperator()
    trainer = Trainer(model, train, epochs=300, batch_size=8, lr=1e-2, progress=False, log=None)
    before = trainer.evaluate(train)["l2_mean"]
    history = trainer.fit()
    after = trainer.evaluate(train)["l2_mean"]
    assert len(history) == 300 and trainer.steps_per_epoch == 1
    assert before > 0.3
    assert after < before / 100, (before, after)
    assert history[-1]["train_loss"] < history[0]["train_loss"] / 100


def test_resume_gives_the_weights_of_an_uninterrupted_run(tmp_path, monkeypatch):
    """Float64, dropout and shuffling on: 4 epochs in one go against a run killed
    in epoch 3 and resumed by a new Trainer on a freshly initialised model."""
    train = make_samples(6, 0, torch.float64)
    val = make_samples(2, 1, torch.float64)
    kw = dict(epochs=4, batch_size=2, lr=3e-3, seed=7, progress=False, log=None)

    def model(init_seed=0):
        seed_everything(init_seed)
        return ToyOperator(hidden=16, dropout=0.2).double()

    ref = model()
    ref_hist = Trainer(ref, train, val, out_dir=tmp_path / "a", **kw).fit()

    killed = model()
    killed.fail_after = 2 * 3 + 1  # dies at the 2nd step of epoch 3 (3 steps per epoch)
    with pytest.raises(RuntimeError, match="killed"):
        Trainer(killed, train, val, out_dir=tmp_path / "b", **kw).fit()
    state = torch.load(tmp_path / "b" / "last.pt", weights_only=True)
    assert state["training"]["epoch"] == 2  # only the unfinished epoch is lost

    resumed = model(init_seed=123)  # different initial weights: they must come from last.pt
    hist = Trainer(resumed, train, val, out_dir=tmp_path / "b", resume=True, **kw).fit()
    assert max_diff(params(resumed), params(ref)) < 1e-12
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4]
    np.testing.assert_allclose([h["train_loss"] for h in hist],
                               [h["train_loss"] for h in ref_hist], rtol=1e-12)

    # Control: the same resume without restoring the random streams (dropout) ends
    # elsewhere, so the agreement above does depend on them.
    (tmp_path / "c").mkdir()
    torch.save(state, tmp_path / "c" / "last.pt")
    monkeypatch.setattr(trainer_mod, "set_rng_state", lambda s: None)
    control = model()
    Trainer(control, train, val, out_dir=tmp_path / "c", resume=True, **kw).fit()
    assert max_diff(params(control), params(ref)) > 1e-6


@pytest.mark.parametrize("epochs", [3, 1])
def test_resume_for_another_epoch_count_under_a_schedule_is_refused(tmp_path, epochs):
    """A finished 2-epoch cosine run resumed for 3 epochs would run the cosine past
    its end (the rate climbs back up); for 1 it would stop undecayed. Both are
    refused before anything is written, naming last.pt and both counts."""
    train = make_samples(4, 0, torch.float64)
    kw = dict(batch_size=2, lr=1e-2, seed=1, out_dir=tmp_path, progress=False, log=None)
    seed_everything(0)
    Trainer(ToyOperator().double(), train, epochs=2, **kw).fit()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    seed_everything(0)
    trainer = Trainer(ToyOperator().double(), train, epochs=epochs, resume=True, **kw)
    msg = (f"{tmp_path / 'last.pt'}: the run was started for 2 epochs (2 done) and its "
           f"learning-rate schedule ends there, so it cannot be resumed for {epochs} epochs; "
           f"resume it with 2 epochs, or train {epochs} epochs in a new run")
    with pytest.raises(ValueError) as info:
        trainer.fit()
    assert str(info.value) == msg
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_resume_without_a_schedule_extends_the_run_exactly(tmp_path):
    """With a constant rate nothing depends on the epoch count: 2 epochs resumed
    for 3 give the weights and history of 3 epochs in one go. A schedule asked for
    only now is refused."""
    train = make_samples(4, 0, torch.float64)
    kw = dict(batch_size=2, lr=1e-2, seed=1, scheduler=None, progress=False, log=None)

    def model():
        seed_everything(0)
        return ToyOperator(hidden=16, dropout=0.2).double()

    ref = model()
    ref_hist = Trainer(ref, train, epochs=3, out_dir=tmp_path / "a", **kw).fit()
    Trainer(model(), train, epochs=2, out_dir=tmp_path / "b", **kw).fit()
    resumed = model()
    hist = Trainer(resumed, train, epochs=3, out_dir=tmp_path / "b", resume=True, **kw).fit()
    assert max_diff(params(resumed), params(ref)) == 0
    assert [(h["train_loss"], h["lr"]) for h in hist] == \
        [(h["train_loss"], h["lr"]) for h in ref_hist]
    # A schedule cannot start in the middle of that run: a cosine from epoch 3 on
    # would jump back to the peak rate.
    kw["scheduler"] = "cosine"
    with pytest.raises(ValueError, match=r"started for 3 epochs \(3 done\) without a "
                       r"learning-rate schedule.* cannot be resumed for 4 epochs"):
        Trainer(model(), train, epochs=4, out_dir=tmp_path / "b", resume=True, **kw).fit()


def test_best_checkpoint_is_the_epoch_with_the_lowest_val_error(tmp_path):
    train = make_samples(6, 0)
    val = make_samples(3, 1)
    seed_everything(0)
    model = ToyOperator()
    # A large constant rate makes the validation error go up and down.
    history = Trainer(model, train, val, epochs=12, batch_size=2, lr=5e-2, scheduler=None,
                      out_dir=tmp_path, progress=False, log=None,
                      metadata={"inputs": ["a"], "targets": ["u"]}).fit()
    assert json.loads((tmp_path / "history.json").read_text()) == history
    errs = [h["val_l2"] for h in history]
    assert errs == [h["val"]["l2_mean"] for h in history]
    best = int(np.argmin(errs))
    assert any(e > min(errs[:i]) for i, e in enumerate(errs) if i), "val error never rose"
    assert best != len(errs) - 1, "the test needs a best epoch before the last one"

    loaded = NeuralOperator.from_checkpoint(tmp_path / "best.pt")
    assert isinstance(loaded, ToyOperator)
    assert loaded.metadata["epoch"] == best + 1 and loaded.metadata["inputs"] == ["a"]
    assert loaded.metadata["val"]["l2_mean"] == pytest.approx(errs[best], rel=1e-12)
    # The file holds that epoch's weights: it reproduces that epoch's error.
    hand = np.mean([float(relative_lp(loaded.predict(s), s.y, s.weight)) for s in val])
    assert hand == pytest.approx(errs[best], rel=1e-5)
    # last.pt is a loadable model checkpoint too, of the last epoch.
    last = NeuralOperator.from_checkpoint(tmp_path / "last.pt")
    hand = np.mean([float(relative_lp(last.predict(s), s.y, s.weight)) for s in val])
    assert hand == pytest.approx(errs[-1], rel=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "history.json", "last.pt"]


def test_query_points_use_query_weight_or_uniform_weights():
    """Targets at query points: the loss and the output normaliser use
    ``query_weight`` when given, equal weights over the queries otherwise."""
    meshes = make_meshes(4, 2)
    g = torch.Generator().manual_seed(0)
    samples = []
    for m in meshes:
        s = assemble(m, ["a"], ["u"])
        q = torch.randperm(s.pos.shape[0], generator=g)[:9]
        s.query_pos, s.y = s.pos[q], s.y[q] + 1.0
        s.query_weight = torch.rand(9, generator=g) + 0.1
        samples.append(s)
    seed_everything(0)
    model = ToyOperator(queries=True)
    trainer = Trainer(model, samples, epochs=3, batch_size=2, progress=False, log=None)
    history = trainer.fit()
    assert history[-1]["train_loss"] < history[0]["train_loss"]

    y = torch.cat([s.y for s in samples]).double()
    qw = torch.cat([s.query_weight for s in samples]).double()
    np.testing.assert_allclose(float(model.output_normalizer.mean),
                               float((qw * y[:, 0]).sum() / qw.sum()), rtol=1e-5)
    preds = [model.predict(s) for s in samples]
    metrics = trainer.evaluate(samples)
    weighted = np.mean([float(relative_lp(p, s.y, s.query_weight)) for p, s in zip(preds, samples)])
    plain = np.mean([float(relative_lp(p, s.y)) for p, s in zip(preds, samples)])
    assert metrics["l2_mean"] == pytest.approx(weighted, rel=1e-5)
    assert metrics["l2_unweighted_mean"] == pytest.approx(plain, rel=1e-5)
    assert abs(weighted - plain) > 1e-4 * plain
    for s in samples:
        del s.query_weight
    assert trainer.evaluate(samples)["l2_mean"] == pytest.approx(plain, rel=1e-5)


# --------------------------------------------------------------------- DDP
def test_ddp_on_two_cpu_processes_matches_single_process(tmp_path):
    """Two gloo processes with 2 samples each per step against one process with 4.

    The DistributedSampler deals the epoch's permutation out round-robin (rank r
    gets positions r, r + 2, ...), so step k of the two ranks together covers
    positions 4k..4k+3: the same samples as step k of one process with batch 4,
    since the single-process trainer draws the same permutation. Each rank's loss
    is the mean over its 2 samples and DDP averages the gradients over the ranks,
    which is the gradient of the mean over the 4 samples. With 8 samples no shard
    is padded, so the runs agree up to rounding (float64)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           str(TESTS / "_ddp_script.py"), str(tmp_path)]
    proc = run_group(cmd, env, timeout=150)  # a hung rank is killed with the agent
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))

    assert r0["world_size"] == r1["world_size"] == 2
    assert max_diff(r0["params"], r1["params"]) == 0.0  # DDP keeps the ranks in lockstep
    assert r1["writes"] == [] and r1["logs"] == []  # only rank 0 writes and logs
    assert sorted(Path(p).name for p in r0["writes"]) == sorted(
        ["last.pt", "history.json"] * DDP_KW["epochs"] + ["best.pt"] * r0["n_best"])
    assert r0["n_best"] >= 1 and len(r0["logs"]) == DDP_KW["epochs"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == \
        ["best.pt", "history.json", "last.pt"]
    hist = r0["history"]
    untimed = [[{k: v for k, v in h.items() if k != "time_s"} for h in r["history"]]
               for r in (r0, r1)]
    assert untimed[0] == untimed[1]  # metrics all-reduced: the same on every rank
    assert hist[-1]["train_loss"] < 0.5 * hist[0]["train_loss"]
    assert hist[-1]["val"]["n"] == 3  # validation sharded 2 + 1 and gathered

    train, val = ddp_data()
    model = ddp_model()
    single = Trainer(model, train, val, batch_size=4, log=None, **DDP_KW).fit()
    assert max_diff(params(model), r0["params"]) < 1e-11  # 2e-16 observed; other orders: 0.2
    np.testing.assert_allclose([h["train_loss"] for h in single],
                               [h["train_loss"] for h in hist], rtol=1e-9)
    np.testing.assert_allclose([h["val"]["l2_max"] for h in single],
                               [h["val"]["l2_max"] for h in hist], rtol=1e-9)
