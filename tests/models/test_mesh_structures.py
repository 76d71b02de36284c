"""Mesh-only structures of PatchedTransformer and GalerkinTransformer computed once per
sample (issue 13, item 2): :meth:`mesh_transform` against the models building them per
batch, and a Trainer epoch on a fixed dataset without any partition or neighbour search."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch

import meshops.search.graph as graph_mod
from meshops.mesh.data import MeshData
from meshops.models import GalerkinTransformer, PatchedTransformer, TransformerNO
from meshops.models.structures import MeshStructures
from meshops.nn.patch import PatchAttention
from meshops.training import Trainer

F64 = torch.float64


def _samples(query: bool, sizes=(40, 50, 60), seed: int = 0, targets: bool = False):
    """Point clouds of different sizes (float64, positive weights), with query points
    and targets there when asked."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        pos = torch.rand(n, 2, generator=g, dtype=F64)
        d = MeshData(pos=pos, weight=0.5 + torch.rand(n, generator=g, dtype=F64) / n,
                     x=torch.randn(n, 1, generator=g, dtype=F64))
        if query:
            d.query_pos = torch.rand(n // 3, 2, generator=g, dtype=F64)
        if targets:
            d.y = torch.randn((n // 3 if query else n), 2, generator=g, dtype=F64)
        out.append(d)
    return out


def _batch(samples, query: bool):
    return Batch.from_data_list(samples, follow_batch=["query_pos"] if query else None)


_PATCHED = {
    "alternate-kd": dict(pattern="alternate", method="kd", num_patches=4, layers=4),
    "window-voxel": dict(pattern="window", method="voxel", num_patches=5, layers=2),
    "token-kmeans": dict(pattern="token", method="kmeans", num_patches=3, layers=2),
    "patch_size-kd": dict(pattern="alternate", method="kd", patch_size=16, layers=2),
}


def _patched(**kw) -> PatchedTransformer:
    torch.manual_seed(0)
    return PatchedTransformer(1, 2, width=8, heads=2, num_basis=3, **kw).double().eval()


def _galerkin() -> GalerkinTransformer:
    torch.manual_seed(0)
    return GalerkinTransformer(1, 2, width=8, heads=2, layers=2).double().eval()


class _Searches:
    """Counts the calls of every partition and neighbour search the models can reach:
    the layers' partition and the query interpolation's search, each patched where it
    is defined (the class, the module)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for owner, name in ((PatchAttention, "partition"),
                            (graph_mod, "knn_interpolation_weights")):
            monkeypatch.setattr(owner, name, self._counting(getattr(owner, name)))

    def _counting(self, fn):
        def wrapper(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)
        return wrapper


@pytest.mark.parametrize("config", sorted(_PATCHED))
@pytest.mark.parametrize("query", [False, True])
def test_patched_structures_give_bit_identical_outputs_without_search(config, query,
                                                                      monkeypatch):
    """A batch carrying the structures (built once per sample) gives exactly the output
    of the model building them for the batch (float64), and its forward does no
    partition or neighbour search."""
    model = _patched(**_PATCHED[config])
    transform = model.mesh_transform()
    pre = _batch([transform(d) for d in _samples(query)], query)
    single = transform(_samples(query)[1])
    with torch.no_grad():
        ref = model(_batch(_samples(query), query))
        ref_one = model(_samples(query)[1])
        searches = _Searches(monkeypatch)
        out = model(pre)
        one = model(single)
    assert searches.calls == 0
    assert torch.equal(out, ref)
    assert torch.equal(one, ref_one)


def test_galerkin_structures_give_bit_identical_outputs_without_search(monkeypatch):
    model = _galerkin()
    transform = model.mesh_transform()
    pre = _batch([transform(d) for d in _samples(True)], True)
    with torch.no_grad():
        ref = model(_batch(_samples(True), True))
        searches = _Searches(monkeypatch)
        out = model(pre)
    assert searches.calls == 0
    assert torch.equal(out, ref)


def test_a_sample_smaller_than_interp_k_falls_back_to_building():
    """With a 3-point sample in the batch the batch interpolates from 3 neighbours,
    fewer than the others' stored structures hold: the model builds the interpolation
    itself and the output is still that of the plain batch."""
    model = _patched(pattern="window", method="kd", num_patches=4, layers=2)
    sizes = (40, 3, 50)
    transform = model.mesh_transform()
    pre = _batch([transform(d) for d in _samples(True, sizes)], True)
    with torch.no_grad():
        assert torch.equal(model(pre), model(_batch(_samples(True, sizes), True)))


def test_structures_for_other_settings_are_rebuilt_with_a_warning():
    model = _galerkin()
    other = _galerkin()
    other.interp_k = 2
    data = _batch([other.mesh_transform()(d) for d in _samples(True)], True)
    with torch.no_grad():
        with pytest.warns(UserWarning, match="built for other settings"):
            out = model(data)
        assert torch.equal(out, model(_batch(_samples(True), True)))
    patched = _patched(pattern="window", method="kd", num_patches=4, layers=2)
    data = _batch([patched.mesh_transform()(d) for d in _samples(False)], False)
    with torch.no_grad(), pytest.warns(UserWarning, match="interp_k=4"):
        _patched(pattern="window", method="voxel", num_patches=4, layers=2)(data)


def test_structures_transform_rejects_batches_and_models_without_structures():
    model = _galerkin()
    with pytest.raises(ValueError, match="takes one sample"):
        model.mesh_transform()(_batch(_samples(True), True))
    with pytest.raises(TypeError, match="TransformerNO has no mesh structures"):
        MeshStructures(TransformerNO(1, 1, width=8, heads=2, layers=1))


def test_misshaped_stored_partitions_are_refused():
    model = _patched(**_PATCHED["alternate-kd"])
    d = model.mesh_transform()(_samples(False)[0])
    d.mesh_parts = d.mesh_parts[:, :1]
    with pytest.raises(ValueError, match=r"data.mesh_parts must be \[N=40, 2\]"):
        model(d)
    d = _galerkin().mesh_transform()(_samples(True)[0])
    d.mesh_interp_weight = d.mesh_interp_weight[:-1]
    with pytest.raises(ValueError, match="data.mesh_interp has 52 entries but "
                                         "data.mesh_interp_weight has 51"):
        _galerkin()(d)


@pytest.mark.parametrize("make", [lambda: _patched(**_PATCHED["alternate-kd"]).train(),
                                  lambda: _galerkin().train()])
def test_a_training_epoch_does_no_search(make, monkeypatch):
    """The Trainer stores the structures once; then an epoch (training and validation)
    on the fixed dataset calls no partition or neighbour search, and it ends with the
    same weights as an epoch that builds them in every step."""
    searches = _Searches(monkeypatch)
    weights = []
    for precompute in (True, False):
        model = make()
        trainer = Trainer(model, _samples(True, targets=True), _samples(True, (30,), 1, True),
                          epochs=1, batch_size=2, progress=False, log=lambda m: None,
                          precompute=precompute)
        built = searches.calls
        trainer.fit()
        during = searches.calls - built
        if precompute:
            assert built > 0 and during == 0
        else:
            assert built == 0 and during > 0      # the counter sees the per-step searches
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
        searches.calls = 0
    for k in weights[0]:
        assert torch.equal(weights[0][k], weights[1][k]), k
