"""Issue 22, items 1-3: mixed precision on CPU, torch.compile, activation checkpointing of
the processor blocks, the Trainer's hooks and the TensorBoard / MLflow loggers, from
the Python API and from ``meshops train``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _tiny_run import one_line_error
from test_cli import SMALL, _write_dataset
from test_training import ToyOperator, make_samples
from torch_geometric.data import Batch

from meshops import cli
from meshops.mesh.data import MeshData
from meshops.models import get_model
from meshops.training import Trainer
from meshops.training.baselines import baselines
from meshops.training.callbacks import Callback
from meshops.training.seed import seed_everything

pytestmark = pytest.mark.usefixtures("one_thread")


def _fit(amp=False, dtype=torch.float32, epochs=3, **kw):
    train, val = make_samples(6, 0, dtype), make_samples(3, 1, dtype)
    seed_everything(0)
    model = ToyOperator()
    if dtype == torch.float64:
        model = model.double()
    trainer = Trainer(model, train, val, epochs=epochs, batch_size=2, amp=amp, progress=False,
                      log=None, **kw)
    return model, trainer, trainer.fit()


# ----------------------------------------------------------------- mixed precision
@pytest.mark.parametrize("amp, half", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                       (True, torch.bfloat16)])
def test_amp_runs_the_forward_in_half_precision_on_cpu(amp, half):
    model, trainer, history = _fit(amp)
    assert trainer.amp_dtype == half and model.last_dtype == half  # autocast was on
    # fp16 needs a gradient scaler (on the CPU too); bf16 has float32's range
    assert (trainer.scaler is not None) == (half == torch.float16)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    _, _, plain = _fit(False)
    # Same data order and initial weights: the curves differ by the rounding of 8 (bf16)
    # or 11 (fp16) mantissa bits in the forward, a few per cent at most after 3 epochs.
    for a, b in zip(history, plain):
        assert a["val_l2"] == pytest.approx(b["val_l2"], rel=0.05)
        assert a["val_l2"] != b["val_l2"]


def test_amp_refuses_a_float64_model_and_unknown_names():
    with pytest.raises(ValueError, match="needs a float32 model, but its parameters are "
                                         "torch.float64"):
        _fit("bf16", torch.float64)
    with pytest.raises(ValueError, match="amp must be True, False, 'bf16' or 'fp16', got 'fp8'"):
        _fit("fp8")


# --------------------------------------------------------------------- compile
def test_compile_trains_through_torch_compile_with_the_eager_result():
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model, trainer, history = _fit(False, torch.float64, epochs=2, compile={"backend": "eager"})
    assert isinstance(trainer._net, torch._dynamo.eval_frame.OptimizedModule)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # something compiled
    _, _, eager = _fit(False, torch.float64, epochs=2)
    for a, b in zip(history, eager):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-10)
        assert a["val_l2"] == pytest.approx(b["val_l2"], rel=1e-10)
    torch._dynamo.reset()


# -------------------------------------------------------- activation checkpointing
_MODELS = {
    "transformer_no": (dict(width=8, layers=2, heads=2, dropout=0.1), lambda m: m.blocks[0]),
    "galerkin_transformer": (dict(width=8, layers=2, heads=2), lambda m: m.blocks[0]),
    "patched_transformer": (dict(width=8, layers=2, heads=2, num_patches=2),
                            lambda m: m.blocks[0]),
    "pit": (dict(width=8, heads=2, blocks=2, num_latent=12, quantile_in=0.3,
                 quantile_out=0.3), lambda m: m.attn[0]),
}


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_checkpoint_blocks_recomputes_the_blocks_and_keeps_the_gradients(name):
    cfg, first_block = _MODELS[name]
    g = torch.Generator().manual_seed(0)
    data = []
    for n in (30, 37):
        data.append(MeshData(pos=torch.rand(n, 2, generator=g, dtype=torch.float64),
                             weight=torch.full((n,), 1.0 / n, dtype=torch.float64),
                             x=torch.randn(n, 1, generator=g, dtype=torch.float64)))
    batch = Batch.from_data_list(data)
    torch.manual_seed(0)
    model = get_model(name, in_channels=1, out_channels=1, **cfg).double().train()
    calls = []
    # a pre-hook: the recomputation stops once it has what the backward needs
    first_block(model).register_forward_pre_hook(lambda *a: calls.append(1))

    def grads(checkpointing):
        model.set_block_checkpointing(checkpointing)
        model.zero_grad()
        calls.clear()
        torch.manual_seed(1)  # dropout draws the same masks in both runs
        model(batch).square().mean().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, \
            len(calls)

    plain, n_plain = grads(False)
    ckpt, n_ckpt = grads(True)
    assert (n_plain, n_ckpt) == (1, 2)  # the block ran again in the backward pass
    assert plain.keys() == ckpt.keys()
    for k in plain:
        torch.testing.assert_close(ckpt[k], plain[k], rtol=1e-10, atol=1e-12, msg=k)
    with torch.no_grad():  # nothing to recompute outside training
        calls.clear()
        model(batch)
        assert len(calls) == 1


def test_trainer_checkpoint_blocks_sets_the_model():
    model, trainer, _ = _fit(False, epochs=1, checkpoint_blocks=True)
    assert model.checkpoint_blocks is True


# ------------------------------------------------------------------------- hooks
class _Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_fit_start(self, trainer):
        self.calls.append(("start", trainer.epoch))

    def on_epoch_end(self, trainer, entry):
        # called after the epoch's checkpoints are written
        self.calls.append(("epoch", entry["epoch"], (trainer.out_dir / "last.pt").is_file()))

    def on_fit_end(self, trainer):
        self.calls.append(("end", trainer.epoch))


def test_callbacks_see_every_epoch_and_the_end_also_after_an_error(tmp_path):
    rec = _Recorder()
    _, _, history = _fit(epochs=2, callbacks=[rec], out_dir=tmp_path / "a")
    assert rec.calls == [("start", 0), ("epoch", 1, True), ("epoch", 2, True), ("end", 2)]

    class Fails(Callback):
        def on_epoch_end(self, trainer, entry):
            raise RuntimeError("stop here")

    rec = _Recorder()
    with pytest.raises(RuntimeError, match="stop here"):
        _fit(epochs=2, callbacks=[Fails(), rec], out_dir=tmp_path / "b")
    assert rec.calls == [("start", 0), ("end", 1)]
    with pytest.raises(TypeError, match="callbacks must be meshops.training.callbacks.Callback"):
        _fit(epochs=1, callbacks=[print])


# ---------------------------------------------------------------------- loggers
def _tb_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    images = {t: [e.step for e in acc.Images(t)] for t in acc.Tags()["images"]}
    return scalars, images


def _expected_baselines(trainer):
    out = {}
    for b in baselines(list(trainer.train_data), list(trainer.val_data)):
        if b.available:
            out[f"baseline/{b.name.replace(' ', '_')}/l2_mean"] = float(np.nanmean(b.errors["l2"]))
    return out


def test_tensorboard_logs_history_baselines_and_the_median_sample(tmp_path):
    pytest.importorskip("tensorboard")
    from meshops.training.loggers import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path / "tb", figure_every=2, config={"lr": 1e-3})
    model, trainer, history = _fit(epochs=3, callbacks=[logger], metadata={"targets": ["u"]})
    scalars, images = _tb_scalars(tmp_path / "tb")
    for tag, key in (("loss/train", "train_loss"), ("lr", "lr")):
        assert [s for s, _ in scalars[tag]] == [1, 2, 3]
        np.testing.assert_allclose([v for _, v in scalars[tag]], [h[key] for h in history],
                                   rtol=1e-6)
    for metric in ("l2_mean", "l2_median", "l2_max", "l2_unweighted_mean", "abs_l2_mean"):
        np.testing.assert_allclose([v for _, v in scalars[f"val/{metric}"]],
                                   [h["val"][metric] for h in history], rtol=1e-6)
    expected = _expected_baselines(trainer)
    assert expected  # the nearest-sample baseline exists for any data
    for tag, value in expected.items():
        assert [v for _, v in scalars[tag]] == pytest.approx([value] * 3, rel=1e-6)
    # the figure every 2 epochs and at the end
    assert images == {"median_validation_sample": [2, 3]}
    # the median sample is the one with the median of the last validation errors
    errs = [float(e) for e in trainer.last_errors[:, 0]]
    assert errs[logger.median_sample(trainer)] == sorted(errs)[1]


def test_tensorboard_logs_the_baselines_of_one_training_sample(tmp_path):
    # issue 28: the POD + RBF baseline of one training sample raised inside the logger
    pytest.importorskip("tensorboard")
    from test_baselines import _fixed_mesh_set  # one mesh, parameters: POD + RBF applies

    from meshops.training.loggers import TensorBoardLogger

    data = _fixed_mesh_set(3, seed=1)
    seed_everything(0)
    trainer = Trainer(ToyOperator(2, 2).double(), data[:1], data[1:], epochs=1,
                      batch_size=1, progress=False, log=None,
                      callbacks=[TensorBoardLogger(tmp_path / "tb")])
    trainer.fit()
    scalars, _ = _tb_scalars(tmp_path / "tb")
    expected = _expected_baselines(trainer)
    assert "baseline/nearest_training_sample/l2_mean" in expected
    for tag, value in expected.items():
        assert [v for _, v in scalars[tag]] == pytest.approx([value], rel=1e-6)


def test_a_figure_that_cannot_be_drawn_only_warns(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    import meshops.inference.plot
    from meshops.training.loggers import TensorBoardLogger

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(meshops.inference.plot, "plot_comparison", broken)
    with pytest.warns(UserWarning, match="figure of epoch 2 was not logged .OSError"):
        _, trainer, history = _fit(epochs=2, callbacks=[TensorBoardLogger(tmp_path / "tb")])
    assert len(history) == 2
    scalars, images = _tb_scalars(tmp_path / "tb")
    assert len(scalars["loss/train"]) == 2 and not images


def test_mlflow_logs_metrics_params_and_the_figure(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from meshops.training.loggers import MLflowLogger

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    logger = MLflowLogger(uri, experiment="t", run_name="r", config={"model_config": {"w": 8}},
                          artifact_location=(tmp_path / "art").as_uri())
    _, trainer, history = _fit(epochs=2, callbacks=[logger])
    client = MlflowClient(uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"model_config.w": "8"}
    hist = client.get_metric_history(logger.run_id, "val/l2_mean")
    assert [m.step for m in hist] == [1, 2]
    np.testing.assert_allclose([m.value for m in hist], [h["val_l2"] for h in history],
                               rtol=1e-12)
    for tag, value in _expected_baselines(trainer).items():
        assert run.data.metrics[tag] == pytest.approx(value, rel=1e-12)
    assert [a.path for a in client.list_artifacts(logger.run_id, "figures")] == [
        "figures/median_validation_sample_epoch2.png"]
    assert (tmp_path / "art").is_dir()


def test_an_mlflow_store_that_cannot_be_used_is_one_error(tmp_path, monkeypatch, capsys):
    # issue 28: a tracking database that is not one ended `meshops train` in a
    # sqlalchemy traceback
    pytest.importorskip("mlflow")
    from meshops.training.loggers import LoggerError, MLflowLogger

    bad = tmp_path / "bad.db"
    bad.write_text("not a database")
    with pytest.raises(LoggerError, match=rf"MLflow: cannot use the tracking store "
                                          rf"sqlite:///{bad} \(DatabaseError: "):
        _fit(epochs=1, callbacks=[MLflowLogger(f"sqlite:///{bad}")])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{bad}")
    data = _write_dataset(tmp_path / "data", n=4)
    assert _train(data, tmp_path / "r", "--logger", "mlflow") == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and f"--logger mlflow: MLflow: cannot use the tracking store " \
        f"sqlite:///{bad}" in err, err
    assert bad.read_text() == "not a database"


# ----------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_dataset(tmp_path_factory.mktemp("data"), n=6)


def _train(data, out, *extra):
    return cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u", *SMALL,
                     "--epochs", "2", "--batch-size", "3", "--val-fraction", "0.34",
                     "--out", str(out), *extra])


def test_cli_amp_compile_checkpoint_and_loggers_reach_the_trainer(data, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    seen = {}
    real_init = Trainer.__init__

    def spy(self, *a, **kw):
        seen.update(kw)
        real_init(self, *a, **kw)

    monkeypatch.setattr(Trainer, "__init__", spy)
    monkeypatch.setattr(torch, "compile", lambda m, **kw: m)  # the flag, not inductor
    (tmp_path / "c.yaml").write_text("amp: bf16\ncompile: true\ncheckpoint_blocks: true\n"
                                     "logger: [tensorboard, mlflow]\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert _train(data, tmp_path / "r", "--config", str(tmp_path / "c.yaml")) == 0
    assert seen["amp"] == "bf16" and seen["compile"] is True and seen["checkpoint_blocks"]
    assert sorted(type(c).__name__ for c in seen["callbacks"]) == ["MLflowLogger",
                                                                   "TensorBoardLogger"]
    history = json.loads((tmp_path / "r" / "history.json").read_text())
    scalars, _ = _tb_scalars(tmp_path / "r" / "tensorboard")
    assert [v for _, v in scalars["val/l2_mean"]] == pytest.approx(
        [h["val_l2"] for h in history], rel=1e-6)
    assert (tmp_path / "r" / "mlflow.db").is_file() and (tmp_path / "r" / "mlartifacts").is_dir()
    # flags override the file; none turns logging off
    seen.clear()
    assert _train(data, tmp_path / "n", "--config", str(tmp_path / "c.yaml"), "--amp", "none",
                  "--no-compile", "--logger", "none") == 0
    assert seen["amp"] is False and seen["compile"] is False and seen["callbacks"] == []
    assert not (tmp_path / "n" / "tensorboard").exists()


@pytest.mark.parametrize("flags, message", [
    (["--amp", "bf16", "--dtype", "float64"], "needs a float32 model"),
    (["--amp", "fp8"], "amp: must be bf16, fp16 or none, got 'fp8'"),
    (["--logger", "wandb"], "unknown logger(s) ['wandb']; choose from tensorboard, mlflow, none"),
    (["--logger", "none,tensorboard"], "'none' cannot be combined"),
])
def test_cli_refuses_combinations_that_cannot_work(data, tmp_path, capsys, flags, message):
    code = _train(data, tmp_path / "r", *flags)
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err) and message in err, err
    assert not (tmp_path / "r").exists()  # refused before anything was written
