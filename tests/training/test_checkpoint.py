"""Model checkpoints: round trip with normalisers, version warning, wrong files,
atomic writes, map_location."""

from __future__ import annotations

import re

import pytest
import torch
from test_training import ToyOperator, make_samples
from torch import nn

import meshops
from meshops.models import NeuralOperator, register_model
from meshops.training.dataset import fit_normalizers
from meshops.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


@register_model("_test_other")
class OtherOperator(NeuralOperator):
    """A second registered model, to load the wrong kind of file."""

    def __init__(self, out_channels: int = 1) -> None:
        super().__init__()
        self.lin = nn.Linear(2, out_channels)

    def forward(self, data):
        return self.lin(data.pos.to(self.lin.weight.dtype))


@pytest.fixture
def trained():
    """A toy model with fitted, non-trivial normalisers and perturbed weights, and
    samples to predict on."""
    samples = make_samples(3, 4, shift=3.0, scale=2.0)
    torch.manual_seed(0)
    model = ToyOperator(hidden=8, dropout=0.1)
    model.set_normalizers(*fit_normalizers(samples))
    return model, samples


def _no_temp_files(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_save_load_gives_identical_predictions(tmp_path, trained):
    model, samples = trained
    path = model.save(tmp_path / "m.pt", inputs=["a"], targets=["u"])
    loaded = NeuralOperator.from_checkpoint(path)
    assert type(loaded) is ToyOperator and loaded.config == model.config
    assert loaded.metadata == {"inputs": ["a"], "targets": ["u"]}
    assert float(loaded.output_normalizer.std) != 1.0  # the fitted statistics came back
    for s in samples:
        # predict() normalises, runs in eval mode (no dropout) and decodes.
        assert torch.equal(loaded.predict(s), model.predict(s))
    assert ToyOperator.from_checkpoint(path).config == model.config
    assert _no_temp_files(tmp_path) == []


def test_a_checkpoint_of_another_version_warns(tmp_path, trained):
    model, samples = trained
    model.save(tmp_path / "m.pt")
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    state["version"] = "0.0.1"
    torch.save(state, tmp_path / "old.pt")
    with pytest.warns(UserWarning, match=r"saved by meshops 0\.0\.1, loading with " +
                      re.escape(meshops.__version__)):
        loaded = NeuralOperator.from_checkpoint(tmp_path / "old.pt")
    assert torch.equal(loaded.predict(samples[0]), model.predict(samples[0]))


def test_a_file_that_is_not_a_checkpoint_raises_naming_it(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=re.escape(str(text))):
        NeuralOperator.from_checkpoint(text)
    other = tmp_path / "weights.pt"
    torch.save({"state_dict": {}}, other)  # a torch file, but not ours
    with pytest.raises(ValueError, match=re.escape(str(other)) + ".*not a meshops checkpoint"):
        NeuralOperator.from_checkpoint(other)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        NeuralOperator.from_checkpoint(tmp_path / "missing.pt")


def test_subclass_from_checkpoint_rejects_another_models_file(tmp_path, trained):
    model, _ = trained
    OtherOperator().save(tmp_path / "other.pt")
    model.save(tmp_path / "toy.pt")
    with pytest.raises(ValueError, match="holds a OtherOperator, not a ToyOperator"):
        ToyOperator.from_checkpoint(tmp_path / "other.pt")
    with pytest.raises(ValueError, match="holds a ToyOperator, not a OtherOperator"):
        OtherOperator.from_checkpoint(tmp_path / "toy.pt")
    assert isinstance(NeuralOperator.from_checkpoint(tmp_path / "other.pt"), OtherOperator)


def _failing_save(obj, f, *args, **kwargs):
    """torch.save that dies half-way: some bytes are on disk, then an error."""
    with open(f, "wb") as fh:
        fh.write(b"PK\x03\x04 partial checkpoint")
    raise OSError("disk full")


def test_a_failing_save_leaves_no_partial_file_and_keeps_the_old_one(tmp_path, trained,
                                                                      monkeypatch):
    model, samples = trained
    path = model.save(tmp_path / "m.pt")
    before = path.read_bytes()
    expected = model.predict(samples[0])

    monkeypatch.setattr(torch, "save", _failing_save)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        model.save(path)
    with pytest.raises(OSError, match="disk full"):
        model.save(tmp_path / "new.pt")
    monkeypatch.undo()

    assert path.read_bytes() == before
    assert not (tmp_path / "new.pt").exists()
    assert _no_temp_files(tmp_path) == []
    assert torch.equal(NeuralOperator.from_checkpoint(path).predict(samples[0]), expected)


def test_a_failing_trainer_checkpoint_keeps_the_previous_last_pt(tmp_path, monkeypatch):
    samples = make_samples(4, 0)
    torch.manual_seed(0)
    Trainer(ToyOperator(hidden=8), samples, epochs=1, batch_size=2, out_dir=tmp_path,
            progress=False, log=None).fit()
    before = (tmp_path / "last.pt").read_bytes()
    monkeypatch.setattr(torch, "save", _failing_save)
    with pytest.raises(OSError, match="disk full"):
        Trainer(ToyOperator(hidden=8), samples, epochs=1, batch_size=2, out_dir=tmp_path,
                progress=False, log=None).fit()
    monkeypatch.undo()
    assert (tmp_path / "last.pt").read_bytes() == before
    assert _no_temp_files(tmp_path) == []
    assert torch.load(tmp_path / "last.pt", weights_only=True)["training"]["epoch"] == 1


@pytest.mark.parametrize("map_location", ["cpu", torch.device("cpu")])
def test_map_location_puts_every_tensor_on_cpu(tmp_path, trained, map_location):
    model, samples = trained
    model.save(tmp_path / "m.pt")
    loaded = NeuralOperator.from_checkpoint(tmp_path / "m.pt", map_location=map_location)
    state = loaded.state_dict()
    assert {"input_normalizer.mean", "output_normalizer.std"} <= state.keys()  # buffers too
    assert all(t.device.type == "cpu" for t in state.values())
    assert torch.equal(loaded.predict(samples[0]), model.predict(samples[0]))
