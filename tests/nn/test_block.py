"""TransformerBlock: attention + FFN, norms and residuals around any meshops attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import scatter, to_dense_batch

from meshops.nn.block import TransformerBlock
from meshops.nn.continuum import ContinuumAttention
from meshops.nn.galerkin import FourierAttention, GalerkinAttention
from meshops.nn.position import PositionAttention

DT = torch.float64
SIZES = (5, 9, 3)
DST_SIZES = (4, 2, 6)
C = 8


def make_batch(sizes, channels, seed):
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.randn(n, channels, generator=g, dtype=DT)
    pos = torch.rand(n, 2, generator=g, dtype=DT)
    w = torch.rand(n, generator=g, dtype=DT) + 0.05
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return x, pos, w, batch


ATTENTIONS = {
    "continuum": lambda cin: ContinuumAttention(cin, C, heads=2),
    "galerkin": lambda cin: GalerkinAttention(cin, C, heads=2, pos_dim=2),
    "fourier": lambda cin: FourierAttention(cin, C, heads=2),
}


def build(kind, cross=False, src_channels=None, pre_norm=True, activation="gelu", seed=0):
    torch.manual_seed(seed)
    cin = (src_channels or C, C) if cross else C
    block = TransformerBlock(ATTENTIONS[kind](cin), C, ffn_ratio=2, pre_norm=pre_norm,
                             activation=activation, cross=cross, src_channels=src_channels)
    block = block.to(DT)
    with torch.no_grad():  # generic parameters (norm affine maps included)
        for p in block.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return block


def ffn(block, h, act=F.gelu):
    return block.ffn[3](act(block.ffn[0](h)))


def ln(norm, t):
    mean = t.mean(-1, keepdim=True)
    var = ((t - mean) ** 2).mean(-1, keepdim=True)
    return (t - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


@pytest.mark.parametrize("kind", ATTENTIONS)
def test_pre_norm_self_block_is_manual_composition(kind, device):
    block = build(kind)
    x, pos, w, batch = make_batch(SIZES, C, seed=1)
    out = device.run(block, x, pos, w, batch)
    h = x + block.attention(ln(block.norm1, x), pos, w, batch)
    ref = h + ffn(block, ln(block.norm2, h))
    device.assert_close(out, ref, rtol=0, atol=1e-12)
    # dense form gives the same values and zeros on padding
    X, M = to_dense_batch(x, batch)
    P = to_dense_batch(pos, batch)[0]
    W = to_dense_batch(w, batch)[0]
    dense = device.run(block.dense, X, P, W, mask=M)
    device.assert_close(dense[M], ref, rtol=0, atol=1e-12)
    assert bool((dense[~M] == 0).all())


@pytest.mark.parametrize("kind", ATTENTIONS)
def test_post_norm_self_block_is_manual_composition(kind, device):
    block = build(kind, pre_norm=False, activation="relu")
    x, pos, w, batch = make_batch(SIZES, C, seed=2)
    h = ln(block.norm1, x + block.attention(x, pos, w, batch))
    ref = ln(block.norm2, h + ffn(block, h, F.relu))
    device.assert_close(device.run(block, x, pos, w, batch), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ATTENTIONS)
def test_pre_norm_cross_block_is_manual_composition(kind, device):
    block = build(kind, cross=True, src_channels=6)
    assert block.norm_src.normalized_shape == (6,)
    xs, ps, ws, bs = make_batch(SIZES, 6, seed=3)
    xd, pd, _, bd = make_batch(DST_SIZES, C, seed=4)
    out = device.run(block, (xs, xd), (ps, pd), ws, (bs, bd))
    h = xd + block.attention((ln(block.norm_src, xs), ln(block.norm1, xd)), (ps, pd), ws, (bs, bd))
    ref = h + ffn(block, ln(block.norm2, h))
    assert out.shape == (sum(DST_SIZES), C)
    device.assert_close(out, ref, rtol=0, atol=1e-12)
    Xs, Ms = to_dense_batch(xs, bs)
    Xd, Md = to_dense_batch(xd, bd)
    dense = device.run(block.dense, (Xs, Xd),
                       (to_dense_batch(ps, bs)[0], to_dense_batch(pd, bd)[0]),
                       to_dense_batch(ws, bs)[0], mask=(Ms, Md))
    device.assert_close(dense[Md], ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ATTENTIONS)
def test_post_norm_cross_block_is_manual_composition(kind, device):
    block = build(kind, cross=True, pre_norm=False)
    assert block.norm_src is None  # post-norm uses the source as given
    xs, ps, ws, bs = make_batch(SIZES, C, seed=5)
    xd, pd, _, bd = make_batch(DST_SIZES, C, seed=6)
    h = ln(block.norm1, xd + block.attention((xs, xd), (ps, pd), ws, (bs, bd)))
    ref = ln(block.norm2, h + ffn(block, h))
    device.assert_close(device.run(block, (xs, xd), (ps, pd), ws, (bs, bd)), ref, rtol=0,
                        atol=1e-12)


@pytest.mark.parametrize("kind", ATTENTIONS)
def test_block_keeps_samples_apart_and_all_parameters_learn(kind):
    block = build(kind, cross=True)
    xs, ps, ws, bs = make_batch(SIZES, C, seed=7)
    xd, pd, _, bd = make_batch(DST_SIZES, C, seed=8)
    out = block((xs, xd), (ps, pd), ws, (bs, bd))
    noise = torch.randn(xs.shape, dtype=DT, generator=torch.Generator().manual_seed(0))
    xs2 = torch.where((bs == 0)[:, None], xs + noise, xs)
    out2 = block((xs2, xd), (ps, pd), ws, (bs, bd))
    assert torch.equal(out[bd != 0], out2[bd != 0])
    assert (out[bd == 0] - out2[bd == 0]).abs().max() > 1e-6
    out.square().sum().backward()
    for name, p in block.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_dropout_only_in_training():
    torch.manual_seed(0)
    block = TransformerBlock(ContinuumAttention(C, heads=2), C, dropout=0.5).to(DT)
    x, pos, w, batch = make_batch(SIZES, C, seed=9)
    block.eval()
    h = x + block.attention(block.norm1(x), pos, w, batch)
    ref = h + ffn(block, block.norm2(h))
    torch.testing.assert_close(block(x, pos, w, batch), ref, rtol=0, atol=1e-12)
    block.train()
    assert not torch.allclose(block(x, pos, w, batch), ref)


class WeightedMean(torch.nn.Module):
    """A minimal layer with only the common flat signature (stand-in for the other
    meshops layers): every point gets the weighted mean of its sample."""

    def __init__(self, channels):
        super().__init__()
        self.out_channels = channels
        self.lin = torch.nn.Linear(channels, channels)

    def forward(self, x, pos, weight, batch=None):
        if batch is None:
            batch = x.new_zeros(x.shape[0], dtype=torch.long)
        num = scatter(self.lin(x) * weight[:, None], batch, 0, reduce="sum")
        den = scatter(weight, batch, 0, reduce="sum")
        return (num / den[:, None])[batch]


def test_block_only_needs_the_common_signature():
    torch.manual_seed(0)
    block = TransformerBlock(WeightedMean(C), C, hidden_channels=5, activation=torch.tanh).to(DT)
    assert block.hidden_channels == 5
    x, pos, w, batch = make_batch(SIZES, C, seed=10)
    h = x + block.attention(block.norm1(x), pos, w, batch)
    ref = h + ffn(block, block.norm2(h), torch.tanh)
    torch.testing.assert_close(block(x, pos, w, batch), ref, rtol=0, atol=1e-12)


def test_block_with_window_attention_if_available():
    patch = pytest.importorskip("meshops.nn.patch", exc_type=ImportError)
    if not hasattr(patch, "WindowAttention"):
        pytest.skip("meshops.nn.patch.WindowAttention not available")
    torch.manual_seed(0)
    attn = patch.WindowAttention(C, heads=2, num_patches=2)
    block = TransformerBlock(attn, C).to(DT)
    x, pos, w, batch = make_batch(SIZES, C, seed=11)
    try:
        attn(x, pos, w, batch)
    except ImportError as err:  # a backend of that layer is missing in this environment
        pytest.skip(f"WindowAttention unusable here: {err}")
    h = x + block.attention(block.norm1(x), pos, w, batch)
    ref = h + ffn(block, block.norm2(h))
    torch.testing.assert_close(block(x, pos, w, batch), ref, rtol=0, atol=1e-12)
    X, M = to_dense_batch(x, batch)
    dense = block.dense(X, to_dense_batch(pos, batch)[0], to_dense_batch(w, batch)[0], mask=M)
    torch.testing.assert_close(dense[M], ref, rtol=0, atol=1e-12)


def test_invalid_arguments():
    attn = ContinuumAttention(C, heads=2).to(DT)
    with pytest.raises(ValueError, match="outputs 8 channels"):
        TransformerBlock(attn, 16)
    with pytest.raises(ValueError, match="norm must be"):
        TransformerBlock(attn, C, norm="batch")
    with pytest.raises(ValueError, match="activation must be"):
        TransformerBlock(attn, C, activation="swish2")
    with pytest.raises(ValueError, match="only used by cross"):
        TransformerBlock(attn, C, src_channels=4)
    x, pos, w, batch = make_batch(SIZES, C, seed=12)
    with pytest.raises(ValueError, match="cross=True"):
        TransformerBlock(attn, C).to(DT)((x, x), (pos, pos), w, (batch, batch))
    with pytest.raises(ValueError, match="needs x=\\(x_src, x_dst\\)"):
        TransformerBlock(attn, C, cross=True).to(DT)(x, pos, w, batch)
    with pytest.raises(ValueError, match="non-negative"):
        TransformerBlock(attn, C).to(DT)(x, pos, -w, batch)
    with pytest.raises(ValueError, match="x has 6 channels, expected 8"):
        TransformerBlock(attn, C).to(DT)(x[:, :6], pos, w, batch)
    cross = TransformerBlock(ContinuumAttention((6, C), C, heads=2), C, cross=True,
                             src_channels=6).to(DT)
    with pytest.raises(ValueError, match="x_src has 8 channels, expected src_channels=6"):
        cross((x, x), (pos, pos), w, (batch, batch))


def test_wrapping_keeps_the_attention_weights_until_reset():
    attn = GalerkinAttention(C, heads=2)
    with torch.no_grad():
        attn.lin_q.weight.fill_(0.5)
    block = TransformerBlock(attn, C)
    assert bool((block.attention.lin_q.weight == 0.5).all())
    block.reset_parameters()
    assert not bool((block.attention.lin_q.weight == 0.5).any())


def test_repr_and_norm_none():
    block = TransformerBlock(ContinuumAttention(64, 64, heads=4), 64)
    assert repr(block) == ("TransformerBlock(ContinuumAttention(64, 64, heads=4), channels=64, "
                           "hidden_channels=128)")
    plain = TransformerBlock(ContinuumAttention(C, heads=2), C, norm=None).to(DT)
    x, pos, w, batch = make_batch(SIZES, C, seed=13)
    h = x + plain.attention(x, pos, w, batch)
    torch.testing.assert_close(plain(x, pos, w, batch), h + ffn(plain, h), rtol=0, atol=1e-12)


EMPTY_ATTENTIONS = {
    "continuum": lambda cin: ContinuumAttention(cin, C, heads=2),
    "position": lambda cin: PositionAttention(cin if isinstance(cin, int) else cin[0], C,
                                              heads=2),
}


@pytest.mark.parametrize("kind", EMPTY_ATTENTIONS)
def test_empty_inputs_give_empty_outputs_and_gradients(kind):
    """A block over no points (flat with and without a batch vector, dense, cross with
    no destination points) returns an empty [0, C] output, and backward through its
    (empty) sum gives zero gradients to every parameter that takes part."""
    torch.manual_seed(0)
    block = TransformerBlock(EMPTY_ATTENTIONS[kind](C), C).to(DT)
    x = torch.randn(0, C, dtype=DT, requires_grad=True)
    pos = torch.rand(0, 2, dtype=DT)
    w = torch.rand(0, dtype=DT)
    for batch in (None, torch.zeros(0, dtype=torch.long)):
        out = block(x, pos, w, batch)
        assert out.shape == (0, C) and out.dtype == DT
        out.sum().backward()
        assert x.grad.shape == (0, C)
        assert bool((block.ffn[0].weight.grad == 0).all())
        block.zero_grad()
    out = block.dense(x[None].expand(2, 0, C), pos[None].expand(2, 0, 2), w[None].expand(2, 0))
    assert out.shape == (2, 0, C)
    out.sum().backward()
    cross = TransformerBlock(EMPTY_ATTENTIONS[kind]((C, C)), C, cross=True).to(DT)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(5, C, dtype=DT, generator=g).requires_grad_()
    ps, ws = torch.rand(5, 2, dtype=DT, generator=g), torch.rand(5, dtype=DT, generator=g) + 0.1
    out = cross((xs, x), (ps, pos), ws)
    assert out.shape == (0, C)
    out.sum().backward()
    assert bool((xs.grad == 0).all())
    with pytest.raises(ValueError, match="no source point with positive weight"):
        cross((x, xs), (pos, ps), w)
