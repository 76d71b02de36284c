"""Chunked prediction (meshops.inference.chunked, ``meshops predict --chunk-size``): the global
context once, the output points in chunks, each output the one the whole forward pass
gives (float64, per model)."""

import numpy as np
import pytest
import torch

from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.inference.chunked import can_chunk, predict_chunked
from meshops.mesh.data import MeshData
from meshops.models import (
    GalerkinTransformer,
    PatchedTransformer,
    PiT,
    SliceTransformer,
    TransformerNO,
)

N, M = 300, 140


def _data(query: bool, seed: int = 0) -> MeshData:
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(N, 2, generator=g, dtype=torch.float64)
    weight = torch.rand(N, generator=g, dtype=torch.float64) / N + 0.5 / N
    x = torch.sin(3 * pos[:, :1]) + pos[:, 1:] ** 2
    d = MeshData(pos=pos, weight=weight, x=x)
    if query:
        d.query_pos = torch.rand(M, 2, generator=g, dtype=torch.float64)
    return d


def _model(name: str):
    torch.manual_seed(0)
    models = {
        "pit": lambda: PiT(1, 2, width=16, heads=2, blocks=2, num_latent=40,
                           quantile_in=0.1, quantile_out=0.1),
        "pit_count": lambda: PiT(1, 2, width=16, heads=2, blocks=1, num_latent=40,
                                 quantile_in=0.1, quantile_out=0.1, ball="count"),
        "pit_input": lambda: PiT(1, 2, width=16, heads=2, blocks=1, latent="input",
                                 quantile_in=0.05, quantile_out=0.05),
        "tno": lambda: TransformerNO(1, 2, width=16, layers=2, heads=2),
        "tno_pointwise": lambda: TransformerNO(1, 2, width=16, layers=2, heads=2,
                                               decoder="pointwise"),
        "galerkin": lambda: GalerkinTransformer(1, 2, width=16, layers=2, heads=2),
        "patched": lambda: PatchedTransformer(1, 2, width=16, layers=4, heads=2,
                                              num_patches=6, method="kd", pattern="alternate"),
        "slice": lambda: SliceTransformer(1, 2, width=16, layers=2, heads=2, slices=4),
    }
    model = models[name]().double()
    # normalisers, as a trained model has: predict_chunked applies them like predict
    norm_in, norm_out = UnitGaussianNormalizer(1), UnitGaussianNormalizer(2)
    norm_in.mean.fill_(0.3), norm_in.std.fill_(2.0)
    norm_out.mean.copy_(torch.tensor([1.0, -2.0])), norm_out.std.copy_(torch.tensor([3.0, 0.5]))
    return model.set_normalizers(norm_in.double(), norm_out.double())


CASES = [("pit", False), ("pit", True), ("pit_count", False), ("pit_input", True),
         ("tno", False), ("tno", True), ("tno_pointwise", False), ("galerkin", False),
         ("galerkin", True), ("patched", False), ("patched", True), ("slice", False),
         ("slice", True)]


@pytest.mark.parametrize("name,query", CASES)
def test_chunks_give_the_whole_prediction(name, query):
    model, data = _model(name), _data(query)
    want = model.predict(data)
    got = predict_chunked(model, data, chunk_size=37, progress=False)
    assert got.shape == want.shape == ((M if query else N), 2)
    # float64: the same formula with sums in another order
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_pit_encoder_groups_give_the_whole_encoder(monkeypatch):
    """A small chunk splits PiT's encoder into several groups of latent points (k-d
    parts) and its Voronoi weights into several chunks of input points."""
    import meshops.search as search

    model, data = _model("pit"), _data(False)
    parts, real = [], search.partition

    def spy(pos, num_parts, *args, **kwargs):
        parts.append(num_parts)
        return real(pos, num_parts, *args, **kwargs)

    monkeypatch.setattr(search, "partition", spy)
    got = predict_chunked(model, data, chunk_size=4, progress=False)
    assert parts and parts[0] > 1
    torch.testing.assert_close(got, model.predict(data), rtol=1e-10, atol=1e-12)


def test_other_inputs_or_batches_are_predicted_in_one_piece():
    model = _model("tno")
    data = _data(False)
    data.params = torch.ones(1, 3, dtype=torch.float64)
    assert can_chunk(model) and not can_chunk(model, data)
    from torch_geometric.data import Batch

    batch = Batch.from_data_list([_data(False), _data(False, 1)])
    assert not can_chunk(model, batch)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        predict_chunked(model, _data(False), chunk_size=0)


def test_conditioned_models_are_predicted_in_one_piece():
    """A PiT conditioned on its input means (the default for parametric maps) gives
    ``predict`` exactly: the chunked path would run it unconditioned."""
    torch.manual_seed(0)
    model = PiT(1, 2, width=16, heads=2, blocks=1, num_latent=40, quantile_in=0.1,
                quantile_out=0.1, condition_on_inputs=True).double()
    torch.nn.init.normal_(model.conditioning.film.weight, std=0.5)  # away from identity
    model.conditioning.params_normalizer.fitted.fill_(True)
    data = _data(False)
    assert not can_chunk(model) and not can_chunk(model, data)
    torch.testing.assert_close(predict_chunked(model, data, chunk_size=17),
                               model.predict(data), rtol=0, atol=0)


def test_predict_command_in_chunks_writes_the_one_piece_prediction(tmp_path, capsys):
    from _meshes import square_mesh

    from meshops import cli
    from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh

    data = tmp_path / "data"
    data.mkdir()
    for k in range(4):
        pts, cells = square_mesh(6 + k, "triangle", amount=0.2, seed=k)
        f = np.sin((1 + k) * pts[:, 0]) + pts[:, 1]
        write_mesh(data / f"s{k}.vtu",
                   mesh_from_arrays(pts, cells, {"f": f, "u": f * pts[:, 0] + 1}))
    run = tmp_path / "run"
    assert cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "u",
                     "--model", "pit", "--model-config", "width=8", "blocks=1", "num_latent=12",
                     "--epochs", "1", "--val-fraction", "0", "--out", str(run)]) == 0
    outs = {}
    for size in ("7", "0"):
        assert cli.main(["predict", str(run), str(data), "-o", str(tmp_path / size),
                         "--chunk-size", size]) == 0
        outs[size] = [read_mesh(tmp_path / size / f"s{k}.vtu").fields["u_pred"]
                      for k in range(4)]
    for a, b in zip(outs["7"], outs["0"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)   # float32 model
    capsys.readouterr()
    assert cli.main(["predict", str(run), str(data), "-o", str(tmp_path / "x"),
                     "--chunk-size", "-1"]) == 2
    assert "--chunk-size must be >= 0" in capsys.readouterr().err
