"""PiT's mesh-only structures computed once per sample (issue 13, item 2), on the
models' one mechanism (:class:`meshops.models.structures.MeshStructures`, issue 23):
``PiT.mesh_transform()`` against the model building them per batch."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch

import meshops.models.latent as latent_mod
import meshops.search.graph as graph_mod
import meshops.search.neighbourhoods as neighbourhoods_mod
from meshops.mesh.data import MeshData
from meshops.models.pit import PiT
from meshops.models.structures import MeshStructures

F64 = torch.float64
N0, N1 = 9, 7          # structured samples for latent="grid"


def _samples(latent: str, query: bool, seed: int = 0):
    """Three samples of different meshes (a jittered 9 x 7 grid for latent='grid',
    point clouds of 40-60 points otherwise), float64, weights positive."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(3):
        if latent == "grid":
            xs, ys = torch.meshgrid(torch.linspace(0, 1, N0, dtype=F64),
                                    torch.linspace(0, 1, N1, dtype=F64), indexing="ij")
            pos = torch.stack([xs.reshape(-1), ys.reshape(-1)], 1)
            pos = pos + 0.02 * torch.rand(pos.shape, generator=g, dtype=F64)
        else:
            pos = torch.rand(40 + 10 * s, 2, generator=g, dtype=F64)
        n = pos.shape[0]
        d = MeshData(pos=pos, weight=0.5 + torch.rand(n, generator=g, dtype=F64) / n,
                     x=torch.randn(n, 1, generator=g, dtype=F64))
        if query:
            d.query_pos = torch.rand(15 + 5 * s, 2, generator=g, dtype=F64)
        out.append(d)
    return out


def _model(latent: str, ball: str) -> PiT:
    torch.manual_seed(0)
    kw = dict(grid_shape=[N0, N1], stride=2) if latent == "grid" else {}
    return PiT(1, 2, width=8, heads=2, blocks=1, latent=latent, num_latent=12, ball=ball,
               quantile_in=0.2, quantile_out=0.3, **kw).double().eval()


def _forbid_searches(monkeypatch):
    """Every function that builds a PiT structure fails, patched in the module that
    owns it."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a mesh structure was rebuilt in forward")
    for mod, name in ((neighbourhoods_mod, "local_graph"), (graph_mod, "measure_ball_graph"),
                      (latent_mod, "fps_latent"), (latent_mod, "site_latent"),
                      (latent_mod, "grid_latent"),
                      (latent_mod, "voronoi_weights")):
        monkeypatch.setattr(mod, name, forbidden)


@pytest.mark.parametrize("latent", ["grid", "fps", "sites", "input"])
@pytest.mark.parametrize("ball", ["measure", "count"])
@pytest.mark.parametrize("query", [False, True])
def test_precomputed_structures_give_the_same_outputs(latent, ball, query, monkeypatch):
    """A batch carrying the structures (built once per sample) gives the model's output
    without them to 1e-12 (float64; only the order of the edges of one destination may
    differ), and forward then does no search, sampling or aggregation at all."""
    model = _model(latent, ball)
    follow = ["query_pos"] if query else None
    plain = Batch.from_data_list(_samples(latent, query), follow_batch=follow)
    transform = model.mesh_transform()
    pre = Batch.from_data_list([transform(d) for d in _samples(latent, query)],
                               follow_batch=follow)
    single = transform(_samples(latent, query)[1])               # one sample, no batch
    with torch.no_grad():
        ref = model(plain)
        _forbid_searches(monkeypatch)
        out = model(pre)
        one = model(single)
    assert out.shape == ref.shape
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)
    rows = (plain.query_pos_batch if query else plain.batch) == 1
    assert one.shape == ref[rows].shape
    assert torch.allclose(one, ref[rows], rtol=0, atol=1e-12)


def test_structures_for_other_settings_are_rebuilt_with_a_warning():
    """Structures built for another model (here another encoder quantile) or another
    dtype are not used: the model warns and builds its own, so the output is its own."""
    model = _model("fps", "measure")
    other = _model("fps", "measure")
    other.quantile_in = 0.4
    data = Batch.from_data_list([other.mesh_transform()(d) for d in _samples("fps", False)])
    plain = Batch.from_data_list(_samples("fps", False))
    with torch.no_grad():
        with pytest.warns(UserWarning, match="PiT structures were built for other settings"):
            out = model(data)
        assert torch.equal(out, model(plain))
        f32 = _model("fps", "measure").float().mesh_transform()
        with pytest.warns(UserWarning, match="dtype=torch.float32"):
            model(Batch.from_data_list([f32(d) for d in _samples("fps", False)]))


def test_structures_transform_rejects_batches_and_other_models():
    model = _model("fps", "measure")
    with pytest.raises(ValueError, match="takes one sample"):
        model.mesh_transform()(Batch.from_data_list(_samples("fps", False)))
    with pytest.raises(TypeError, match="Linear has no mesh structures"):
        MeshStructures(torch.nn.Linear(2, 2))


def test_structures_without_query_points_are_not_used_for_a_batch_with_them():
    """The decoder graph is built for the points that are queried: structures built
    for a sample's own points are not used once it has query_pos (and vice versa)."""
    model = _model("fps", "count")
    t = model.mesh_transform()
    data = []
    for d in _samples("fps", True):
        q = d.query_pos
        del d.query_pos
        d = t(d)
        d.query_pos = q
        data.append(d)
    plain = Batch.from_data_list(_samples("fps", True), follow_batch=["query_pos"])
    with torch.no_grad():
        with pytest.warns(UserWarning, match="query_pos=False"):
            out = model(Batch.from_data_list(data, follow_batch=["query_pos"]))
        assert torch.equal(out, model(plain))
