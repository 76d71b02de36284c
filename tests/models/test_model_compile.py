"""Whole models under ``torch.compile`` with precomputed mesh structures (issue 14, item 3):
no graph break (``torch._dynamo.explain``) in a PiT or TransformerNO forward on a fixed
mesh, and the compiled forward equals the eager one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch_geometric.data import Batch

import meshops
from meshops.mesh.data import MeshData
from meshops.models.inputs import read_inputs
from meshops.models.pit import LatentMesh, PiT
from meshops.models.transformer_no import TransformerNO

F64 = torch.float64
PACKAGE = Path(meshops.__file__).resolve().parent
LAYERS = PACKAGE / "nn"


def _samples(n_samples: int = 3, n: int = 40, seed: int = 0, same_mesh: bool = True):
    """Samples on one fixed mesh (other input functions), or each on its own mesh."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 2, generator=g, dtype=F64)
    weight = 0.5 / n + torch.rand(n, generator=g, dtype=F64) / n
    out = []
    for _ in range(n_samples):
        if not same_mesh:
            pos = torch.rand(n, 2, generator=g, dtype=F64)
        out.append(MeshData(pos=pos.clone(), weight=weight.clone(),
                            x=torch.randn(n, 1, generator=g, dtype=F64)))
    return out


def _pit() -> PiT:
    torch.manual_seed(0)
    return PiT(1, 2, width=8, heads=2, blocks=2, latent="fps", num_latent=12, quantile_in=0.2,
               quantile_out=0.3).double().eval()


def _tno() -> TransformerNO:
    torch.manual_seed(0)
    return TransformerNO(1, 2, width=8, layers=2, heads=2).double().eval()


def _case(name: str, same_mesh: bool = True):
    """A model and a batch of three samples on one mesh (or each on its own), with
    the model's mesh structures stored in the samples (PiT; TransformerNO has none)."""
    model = _pit() if name == "pit" else _tno()
    transform = model.mesh_transform()
    samples = _samples(same_mesh=same_mesh)
    if transform is not None:
        samples = [transform(s) for s in samples]
    return model, Batch.from_data_list(samples)


_EXPLAINED: dict[str, object] = {}


def _explain(name: str):
    """``torch._dynamo.explain`` of the model's forward (once per model and session)."""
    if name not in _EXPLAINED:
        model, data = _case(name)
        torch._dynamo.reset()
        _EXPLAINED[name] = torch._dynamo.explain(model)(data)
    return _EXPLAINED[name]


def _where(reason) -> str:
    frames = reason.user_stack or []
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-4:]))


def _in(frame, folder: Path) -> bool:
    return Path(frame.filename).resolve().is_relative_to(folder)


MODELS = ["pit", "transformer_no"]


@pytest.mark.parametrize("name", MODELS)
def test_graph_breaks_are_only_inside_the_layers(name):
    """The models' own code (input reading, precomputed structures, latent mesh) reads
    no tensor value while compiling: every graph break left lies in a layer
    (meshops/nn) or in what a layer calls."""
    explained = _explain(name)
    ours = [r for r in explained.break_reasons
            if any(_in(f, PACKAGE) for f in r.user_stack)
            and not any(_in(f, LAYERS) for f in r.user_stack)]
    assert not ours, "\n".join(f"{r.reason.splitlines()[0]} at {_where(r)}" for r in ours)


@pytest.mark.parametrize("name", MODELS)
def test_forward_on_a_fixed_mesh_has_no_graph_break(name):
    explained = _explain(name)
    assert explained.graph_break_count == 0, "\n".join(
        f"{r.reason.splitlines()[0]} at {_where(r)}" for r in explained.break_reasons)


@pytest.mark.parametrize("same_mesh", [True, False])
@pytest.mark.parametrize("name", MODELS)
def test_compiled_forward_equals_eager(name, same_mesh):
    """Compiled (dynamo + AOT autograd; the value checks skipped) the forward gives
    the eager output to rounding (float64), on one mesh and on several (PiT's latent
    meshes then differ: its processor takes the flat path)."""
    model, data = _case(name, same_mesh)
    eager = model(data)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")(data)
    assert compiled.shape == eager.shape == (data.pos.shape[0], 2)
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_inductor_forward_equals_eager(name):
    model, data = _case(name)
    eager = model(data)
    torch._dynamo.reset()
    compiled = torch.compile(model)(data)
    torch.testing.assert_close(compiled, eager, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", MODELS)
def test_compiled_forward_on_samples_of_different_sizes(name):
    """Samples of several meshes (sizes 30 + 43, 30 + 50, and two meshes of 40 points):
    the compiled forward reads their sizes (a graph break) and equals the eager one.
    Only samples that all carry one mesh digest (the models' mesh_transform) are taken
    for samples of one size, so an even total never passes for a fixed mesh."""
    model = _pit() if name == "pit" else _tno()
    transform = model.mesh_transform()
    for sizes, seeds in (((30, 43), (1, 2)), ((30, 50), (1, 2)), ((40, 40), (3, 4))):
        data = Batch.from_data_list([transform(_samples(1, n, seed=s)[0])
                                     for n, s in zip(sizes, seeds)])
        assert data.mesh_id[0] != data.mesh_id[1]
        eager = model(data)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager")
        torch.testing.assert_close(compiled(data), eager, rtol=1e-12, atol=1e-12)


def test_eager_forward_still_checks_values():
    """Only the compiled forward trusts its inputs: eager calls refuse bad values."""
    model, data = _case("transformer_no")
    data.pos[3, 1] = float("nan")
    with pytest.raises(ValueError, match="data.pos contains NaN or inf"):
        model(data)
    model, data = _case("pit")
    data.weight[5] = -1.0
    with pytest.raises(ValueError, match="data.weight must be finite and non-negative"):
        model(data)


@pytest.mark.parametrize("latent", ["fps", "input"])
@pytest.mark.parametrize("same_mesh", [True, False])
def test_shared_latent_mesh_is_known_from_the_structures(latent, same_mesh):
    """Whether a batch's samples share one latent mesh (the dense processor path) is
    read from the structures' digests, without comparing tensors, and agrees with the
    comparison; structures stored before the digest existed are compared as before."""
    model = PiT(1, 2, width=8, heads=2, blocks=1, latent=latent, num_latent=12,
                quantile_in=0.2, quantile_out=0.3).double()
    transform = model.mesh_transform()
    data = Batch.from_data_list([transform(s) for s in _samples(same_mesh=same_mesh)])
    assert (len(set(data.mesh_latent_id)) == 1) is same_mesh  # one digest per latent mesh
    inp = read_inputs(data, 1, 2, F64)
    lat = model.stored_structures(data, inp)[0]
    compared = LatentMesh(lat.pos, lat.weight, lat.batch, lat.index, 3)
    assert lat.shared is compared.shared is same_mesh
    del data.mesh_latent_id  # without the digests the tensors are compared
    assert model.stored_structures(data, inp)[0].shared is same_mesh


@pytest.mark.slow
def test_compiled_training_step_of_transformer_no_on_the_cpu(tmp_path, monkeypatch):
    """Issue 28: `meshops train --compile` of transformer_no on the CPU failed after
    ~35 s of compiling (the fused attention's backward operator had a fake with the
    strides of its head-major inputs). The Inductor step (a fresh cache: a stale one
    holds the old strides) gives the eager output and gradients, up to float32
    reassociation (1e-5 of the largest value)."""
    import copy

    from meshops.models import get_model

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = get_model("transformer_no", in_channels=1, out_channels=1, width=8, layers=1,
                      heads=2)
    eager = copy.deepcopy(model)
    samples = _samples(2, 30)
    for s in samples:
        s.pos, s.weight, s.x = s.pos.float(), s.weight.float(), s.x.float()
    batch = Batch.from_data_list(samples)
    out = torch.compile(model)(batch)
    ref = eager(batch)
    out.square().sum().backward()
    ref.square().sum().backward()
    assert float((out - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    top = max(float(p.grad.abs().max()) for p in eager.parameters())
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert float((p.grad - q.grad).abs().max()) <= 1e-5 * top, name
