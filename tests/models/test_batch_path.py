"""A batch followed through each model's forward (issue 23): every call into meshops
is recorded (``sys.setprofile``), and the path is told in steps: the model's module
and :mod:`meshops.models.inputs` are entered once per forward, and no module is
entered again from deeper down while a call into it is still running (no bouncing
``A -> B -> A``, as ``PiT.forward`` did between ``search/graph.py``, ``nn/local.py``
and ``search/knn.py``). Checked with the mesh structures built in the forward and
with the structures stored on the samples, with and without query points."""

from __future__ import annotations

import os
import sys
from collections import Counter

import pytest
import torch
from torch_geometric.data import Batch

import meshops
from meshops.mesh.data import MeshData
from meshops.models import get_model

PACKAGE = os.path.dirname(meshops.__file__) + os.sep

CONFIGS = {
    "transformer_no": dict(width=16, layers=2, heads=2),
    "galerkin_transformer": dict(width=16, layers=2, heads=2),
    "patched_transformer": dict(width=16, layers=2, heads=2, num_patches=3,
                                pattern="alternate"),
    "pit": dict(width=16, heads=2, blocks=2, num_latent=20, quantile_in=0.2,
                quantile_out=0.2),
}
MODULES = {"transformer_no": "models/transformer_no.py",
           "galerkin_transformer": "models/galerkin_transformer.py",
           "patched_transformer": "models/patched.py", "pit": "models/pit.py"}


def follow(fn) -> tuple[list[str], Counter]:
    """Run ``fn`` and return the bounces (``a -> b -> a`` module paths) and how often
    each meshops module (path in the package) was entered from another module."""
    stack: list = []          # (frame, module) of the meshops frames running
    bounces: list[str] = []
    entered: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            if not path.startswith(PACKAGE):
                return
            module = path[len(PACKAGE):]
            running = [m for _, m in stack]
            if not running or running[-1] != module:
                entered[module] += 1
                if module in running:
                    loop = running[running.index(module):] + [module]
                    bounces.append(" -> ".join(loop) + f" ({frame.f_code.co_name})")
            stack.append((frame, module))
        elif event == "return" and stack and stack[-1][0] is frame:
            stack.pop()

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return bounces, entered


def _samples(query: bool):
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (60, 67):
        pos = torch.rand(n, 2, generator=g)
        d = MeshData(pos=pos, weight=torch.full((n,), 1.0 / n), x=torch.randn(n, 1, generator=g))
        if query:
            d.query_pos = torch.rand(20, 2, generator=g)
        out.append(d)
    return out


def test_the_tracer_sees_a_bounce():
    """Control: a call from meshops into a callback that calls meshops again is found."""
    from meshops.models.base import NeuralOperator

    class Model(NeuralOperator):
        def forward(self, data):
            return data

    model = Model()
    from meshops.training.seed import seed_everything  # a meshops frame on the stack

    bounces, entered = follow(lambda: model.run_block(lambda: seed_everything(0)))
    assert bounces == []     # models/base.py -> (test lambda) -> training/seed.py
    bounces, _ = follow(lambda: model.run_block(model.run_block, lambda: None))
    assert bounces == [] and entered["models/base.py"] == 1
    bounces, _ = follow(lambda: model.run_block(lambda: model.set_block_checkpointing(False)))
    assert len(bounces) == 0  # the test's lambda is not meshops: one models/base.py run

    def meshops_callback():
        return meshops.models.base.check_positive_int(1, "x")

    from meshops.models import structures
    bounces, _ = follow(lambda: structures.MeshDigest()(
        type("S", (), {"pos": _BouncingTensor(), "weight": torch.ones(1)})()))
    assert any("models/structures.py" in b and b.count("models/") >= 2 for b in bounces)


class _BouncingTensor(torch.Tensor):
    """A tensor whose ``detach`` calls back into meshops.models.structures (for the
    control above)."""

    @staticmethod
    def __new__(cls):
        return torch.Tensor._make_subclass(cls, torch.zeros(1, 2))

    def detach(self):
        from meshops.models import structures
        structures.MeshDigest().__repr__()
        return torch.zeros(1, 2)


@pytest.mark.parametrize("query", [False, True])
@pytest.mark.parametrize("stored", [False, True])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_batch_visits_each_module_in_steps(name, stored, query):
    torch.manual_seed(0)
    model = get_model(name, in_channels=1, out_channels=1, **CONFIGS[name]).eval()
    samples = _samples(query)
    if stored:
        transform = model.mesh_transform()
        samples = [transform(s) for s in samples]
    batch = Batch.from_data_list(samples, follow_batch=["query_pos"] if query else None)
    with torch.no_grad():
        model(batch)                       # first call: lazy set-up (kernels, backends)
        bounces, entered = follow(lambda: model(batch))
    assert bounces == []
    assert entered[MODULES[name]] == 1
    assert entered["models/inputs.py"] == 1
    assert entered["models/structures.py"] <= 1 and entered["models/latent.py"] <= 1
