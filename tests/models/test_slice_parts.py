"""The slice transformer on parts of the points (SliceTransformer.in_parts): the same
outputs and gradients as in one piece (float64, to rounding: the sums over the points
run in another order), and a checkpointed step that keeps the blocks' inputs only."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_geometric.data import Batch

from meshops import MeshData
from meshops.models import SliceTransformer
from meshops.training.footprint import PROBE_POINTS

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


def _sample(n: int, seed: int, query: int = 0) -> MeshData:
    g = torch.Generator().manual_seed(seed)
    f64 = dict(generator=g, dtype=torch.float64)
    fields = dict(x=torch.randn(n, 3, **f64), pos=torch.rand(n, 3, **f64),
                  weight=torch.rand(n, **f64))
    if query:
        fields.update(query_pos=torch.rand(query, 3, **f64), y=torch.randn(query, 4, **f64))
    else:
        fields["y"] = torch.randn(n, 4, **f64)
    return MeshData(**fields)


def _model(**kw) -> SliceTransformer:
    torch.manual_seed(0)
    model = SliceTransformer(3, 4, pos_dim=3, width=16, layers=2, heads=2, slices=5,
                             condition_on_inputs=True, adaptive_temperature=True,
                             min_measure=0.05, **kw).double()
    with torch.no_grad():   # away from the initialisation's near-uniform slices
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _step(model: SliceTransformer, batch, parts: bool):
    """Outputs and gradients (parameters, inputs) of a training step; ``parts``: with
    checkpointed blocks on parts of 8 points."""
    model = copy.deepcopy(model).train()
    if parts:
        model.PART_POINTS = 8
        model.set_block_checkpointing(True)
    batch = batch.clone()
    batch.x.requires_grad_(True)
    out = model(batch)
    # a loss that weighs every output differently: each one's gradient counts
    (out ** 2 * torch.linspace(-1, 2, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), [p.grad for p in model.parameters()] + [batch.x.grad]


CASES = {"one sample": [_sample(50, 1)],
         "two samples of different sizes (padding)": [_sample(50, 1), _sample(37, 2)],
         "query points": [_sample(45, 3, query=30)]}


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpointed_step_on_parts_is_the_step_in_one_piece(case):
    batch = Batch.from_data_list(CASES[case])
    model = _model()
    out, grads = _step(model, batch, parts=False)
    out_p, grads_p = _step(model, batch, parts=True)
    torch.testing.assert_close(out_p, out, rtol=1e-12, atol=1e-12)
    # some gradients are sums that nearly cancel (the slice projections'): their
    # rounding is relative to the largest terms, about the largest gradient's size
    scale = max(g.abs().max() for g in grads)
    for g_p, g in zip(grads_p, grads):
        torch.testing.assert_close(g_p, g, rtol=0, atol=1e-12 * float(scale))


@pytest.mark.parametrize("case", list(CASES))
def test_a_prediction_on_parts_is_the_prediction_in_one_piece(case):
    # without gradients each block's parts are updated in place
    batch = Batch.from_data_list(CASES[case])
    model = _model().eval()
    with torch.no_grad():
        whole = model(batch)
        model.PART_POINTS = 8
        parts = model(batch)
    torch.testing.assert_close(parts, whole, rtol=1e-12, atol=1e-12)


def test_parts_are_used_where_a_step_recomputes_or_nothing_is_recorded():
    model = _model()
    n = model.PART_POINTS + 1
    assert model.in_parts(n) is None                       # a plain training step
    model.set_block_checkpointing(True)
    assert model.in_parts(n) == model.PART_POINTS
    assert model.in_parts(model.PART_POINTS) is None       # one part: one piece
    model.eval()
    assert model.in_parts(n) is None                       # eval with gradients
    with torch.no_grad():
        model.set_block_checkpointing(False)
        assert model.in_parts(n) == model.PART_POINTS      # prediction
    # the memory probes of `meshops train` both run on parts: their difference is the
    # cost per point of the path that trains
    assert PROBE_POINTS[0] > SliceTransformer.PART_POINTS


def _saved_bytes(model, batch) -> int:
    """Bytes of the tensors a training step's forward pass keeps for the backward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(batch).sum()
    return sum(storages.values())


def test_a_checkpointed_step_on_parts_keeps_the_blocks_inputs_only():
    # What one piece keeps (a block's input, and the FiLM sites', the lifting's and the
    # head's activations at every point) against what parts keep: the inputs of the
    # blocks and of the head, [N, width] each, plus the inputs themselves.
    torch.manual_seed(0)
    model = SliceTransformer(3, 4, pos_dim=3, width=32, layers=2, condition_on_inputs=True
                             ).train().set_block_checkpointing(True)
    n = 4 * model.PART_POINTS
    batch = Batch.from_data_list([MeshData(x=torch.randn(n, 3), pos=torch.rand(n, 3),
                                           weight=torch.rand(n), y=torch.randn(n, 4))])
    parts = _saved_bytes(model, batch) / n
    model.PART_POINTS = n
    whole = _saved_bytes(model, batch) / n
    kept = (len(model.blocks) + 1) * model.width * 4          # float32 [N, width] each
    assert kept <= parts <= kept + 64, (parts, kept)
    assert whole > 2.5 * parts, (whole, parts)
