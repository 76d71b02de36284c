"""The Trainer applies a model's mesh transform once (issue 13, item 2): a training
epoch on in-memory samples does no neighbour search, the caller's samples are not
changed, and samples that share one mesh share one computation."""

from __future__ import annotations

import pytest
import torch
from test_pit_structures import _forbid_searches

from meshops.mesh.data import MeshData
from meshops.models.pit import PiT
from meshops.models.structures import MeshStructures
from meshops.training import Trainer

F64 = torch.float64


def _model() -> PiT:
    torch.manual_seed(0)
    return PiT(1, 1, width=8, heads=2, blocks=1, latent="fps", num_latent=10,
               ball="count", quantile_in=0.2, quantile_out=0.3).double()


def _shared_mesh_samples(n: int, points: int = 30):
    """``n`` samples on one mesh (the very same ``pos``/``weight`` tensors), with
    different input and target fields."""
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(points, 2, generator=g, dtype=F64)
    weight = torch.full((points,), 1.0 / points, dtype=F64)
    return [MeshData(pos=pos, weight=weight, x=torch.randn(points, 1, generator=g, dtype=F64),
                     y=torch.randn(points, 1, generator=g, dtype=F64)) for _ in range(n)]


def test_trainer_stores_structures_once_per_mesh_and_epochs_do_no_search(monkeypatch):
    calls = []
    original = MeshStructures.__call__

    def counting(self, data):
        calls.append(1)
        return original(self, data)

    monkeypatch.setattr(MeshStructures, "__call__", counting)
    train = _shared_mesh_samples(6)
    val = _shared_mesh_samples(2)       # another mesh: its own pos tensor
    trainer = Trainer(_model(), train, val, epochs=1, batch_size=3, progress=False,
                      log=lambda msg: None)
    # One computation per distinct mesh, not per sample.
    assert len(calls) == 2
    # The caller's samples are untouched; the trainer's copies carry the structures.
    assert all("mesh_key" not in s.keys() for s in train + val)
    assert all("mesh_key" in s.keys() for s in trainer.train_data + trainer.val_data)
    assert trainer.train_data[0].mesh_enc is trainer.train_data[5].mesh_enc
    # With the structures stored, an epoch (training and validation) does no search.
    _forbid_searches(monkeypatch)
    history = trainer.fit()
    assert len(history) == 1 and torch.isfinite(torch.tensor(history[0]["train_loss"]))


def test_precomputed_training_equals_plain_training():
    """The stored structures change nothing but the time: one epoch with and without
    them ends with the same weights (float64)."""
    results = []
    for precompute in (True, False):
        model = _model()
        trainer = Trainer(model, _shared_mesh_samples(6), None, epochs=1, batch_size=3,
                          progress=False, log=lambda msg: None, precompute=precompute)
        trainer.fit()
        results.append({k: v.clone() for k, v in model.state_dict().items()})
    for k in results[0]:
        assert torch.allclose(results[0][k], results[1][k], rtol=0, atol=1e-12), k


def test_transformer_no_stores_only_its_mesh_digest():
    """TransformerNO derives nothing from a mesh but its digest (what lets a compiled
    forward on one mesh know the samples' sizes): the Trainer's copies carry that one
    string, equal for samples of one mesh, and the user's samples are left unchanged."""
    from meshops.models import get_model
    model = get_model("transformer_no", in_channels=1, out_channels=1, pos_dim=2,
                      width=8, heads=2, layers=1).double()
    train = _shared_mesh_samples(3)
    before = [set(s.keys()) for s in train]
    trainer = Trainer(model, train, None, epochs=1, progress=False, log=lambda msg: None)
    assert [set(s.keys()) for s in train] == before
    added = [set(s.keys()) - b for s, b in zip(trainer.train_data, before)]
    assert added == [{"mesh_id"}] * 3
    assert len({s.mesh_id for s in trainer.train_data}) == 1


def test_views_of_one_storage_are_different_meshes():
    """Two views of one tensor (same data pointer, shape and dtype, other points) must
    not share structures: each gets those of its own points."""
    g = torch.Generator().manual_seed(2)
    big = torch.rand(60, 2, generator=g, dtype=F64)
    w = torch.full((30,), 1.0 / 30, dtype=F64)
    a, b = big[:30], big[::2]
    assert a.data_ptr() == b.data_ptr() and a.shape == b.shape
    samples = [MeshData(pos=p, weight=w, x=torch.ones(30, 1, dtype=F64),
                        y=torch.ones(30, 1, dtype=F64)) for p in (a, b)]
    model = _model()
    trainer = Trainer(model, samples, None, epochs=1, progress=False, log=lambda msg: None)
    own = model.mesh_transform()(MeshData(pos=b.clone(), weight=w,
                                          x=torch.ones(30, 1, dtype=F64)))
    assert torch.equal(trainer.train_data[1].mesh_enc, own.mesh_enc)
    assert trainer.train_data[1].mesh_enc is not trainer.train_data[0].mesh_enc


def test_structures_over_the_budget_are_not_kept(monkeypatch):
    import meshops.training.trainer as trainer_mod
    monkeypatch.setattr(trainer_mod, "STRUCTURE_BUDGET", 1000)   # bytes
    train = _shared_mesh_samples(4)
    with pytest.warns(UserWarning, match="over the 0.0 GB budget"):
        trainer = Trainer(_model(), train, None, epochs=1, progress=False, log=lambda m: None)
    assert trainer.train_data is train
