"""ContinuumAttention: softmax(QK^T/sqrt(d) + log w) V with quadrature weights."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.utils import to_dense_batch

import meshops.nn.functional as CA  # chooses the kernel for every layer
from meshops.nn.continuum import ContinuumAttention

DT = torch.float64
SIZES = (5, 9, 3)
DST_SIZES = (4, 2, 6)
#: the fused CPU kernel; its tests skip where it cannot be built (conftest's fused_kernel
#: fixture; tests/kernels/test_kernels.py insists on it on AVX2 machines)
FUSED = ("fused",)
IMPLS = ("sdpa", "fold", "naive") + FUSED


def make_batch(sizes, channels, seed, pos_dim=2):
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.randn(n, channels, generator=g, dtype=DT)
    pos = torch.rand(n, pos_dim, generator=g, dtype=DT)
    w = torch.rand(n, generator=g, dtype=DT) + 0.05
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return x, pos, w, batch


def layer_for(in_channels, out_channels=8, heads=2, impl="sdpa", seed=0):
    torch.manual_seed(seed)
    layer = ContinuumAttention(in_channels, out_channels, heads=heads, impl=impl).to(DT)
    with torch.no_grad():  # non-zero biases so that they are tested as well
        for lin in (layer.lin_q, layer.lin_k, layer.lin_v, layer.lin_out):
            lin.bias.normal_()
    return layer


def reference(layer, x_src, x_dst, w):
    """Per sample, straight from the formula:
    A_i = sum_j w_j exp(q_i.k_j/sqrt(d)) v_j / sum_j w_j exp(q_i.k_j/sqrt(d))."""
    H, D = layer.heads, layer.head_channels
    q = x_dst @ layer.lin_q.weight.T + layer.lin_q.bias
    k = x_src @ layer.lin_k.weight.T + layer.lin_k.bias
    v = x_src @ layer.lin_v.weight.T + layer.lin_v.bias
    heads = []
    for h in range(H):
        c = slice(h * D, (h + 1) * D)
        e = torch.exp(q[:, c] @ k[:, c].T / math.sqrt(D))  # [Nd, Ns]
        num = (e * w[None, :]) @ v[:, c]
        den = (e * w[None, :]).sum(1, keepdim=True)
        heads.append(num / den)
    return torch.cat(heads, 1) @ layer.lin_out.weight.T + layer.lin_out.bias


def reference_flat(layer, x_src, x_dst, w, b_src, b_dst):
    out = [reference(layer, x_src[b_src == i], x_dst[b_dst == i], w[b_src == i])
           for i in range(int(b_dst.max()) + 1)]
    return torch.cat(out)


@pytest.mark.parametrize("impl", IMPLS)
def test_self_attention_matches_formula_flat(impl, device):
    layer = layer_for(6, impl=impl)
    x, pos, w, batch = make_batch(SIZES, 6, seed=1)
    out = device.run(layer, x, pos, w, batch)
    assert out.shape == (sum(SIZES), 8)
    device.assert_close(out, reference_flat(layer, x, x, w, batch, batch), rtol=0, atol=1e-10)
    # pos is not used by this layer
    device.assert_close(device.run(layer, x, None, w, batch), out, rtol=0, atol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_cross_attention_matches_formula_flat(impl, device):
    layer = layer_for((6, 3), out_channels=8, impl=impl)
    xs, ps, ws, bs = make_batch(SIZES, 6, seed=2)
    xd, pd, _, bd = make_batch(DST_SIZES, 3, seed=3)
    out = device.run(layer, (xs, xd), (ps, pd), ws, (bs, bd))
    assert out.shape == (sum(DST_SIZES), 8)
    device.assert_close(out, reference_flat(layer, xs, xd, ws, bs, bd), rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_dense_form_matches_formula_and_zeroes_padding(impl, device):
    layer = layer_for((6, 3), impl=impl)
    xs, _, ws, bs = make_batch(SIZES, 6, seed=4)
    xd, _, _, bd = make_batch(DST_SIZES, 3, seed=5)
    Xs, Ms = to_dense_batch(xs, bs)
    Ws = to_dense_batch(ws, bs)[0]
    Xd, Md = to_dense_batch(xd, bd)
    # garbage in padded slots, even a positive weight, must not matter
    Xs = Xs.masked_fill(~Ms[..., None], 1e6)
    Ws = Ws.masked_fill(~Ms, 1.0)
    out = device.run(layer.dense, (Xs, Xd), None, Ws, mask=(Ms, Md))
    assert out.shape == (3, max(DST_SIZES), 8)
    device.assert_close(out[Md], reference_flat(layer, xs, xd, ws, bs, bd), rtol=0, atol=1e-10)
    assert bool((out[~Md] == 0).all())
    # self form, single mask
    layer = layer_for(6, impl=impl)
    out = device.run(layer.dense, Xs, None, Ws, mask=Ms)
    device.assert_close(out[Ms], reference_flat(layer, xs, xs, ws, bs, bs), rtol=0, atol=1e-10)
    # without mask: every slot is a real point
    X = torch.randn(2, 7, 6, dtype=DT)
    W = torch.rand(2, 7, dtype=DT)
    out = device.run(layer.dense, X, None, W)
    for b in range(2):
        device.assert_close(out[b], reference(layer, X[b], X[b], W[b]), rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_samples_do_not_interact(impl, device):
    layer = layer_for((6, 3), impl=impl)
    xs, _, ws, bs = make_batch(SIZES, 6, seed=6)
    xd, _, _, bd = make_batch(DST_SIZES, 3, seed=7)
    out = device.run(layer, (xs, xd), None, ws, (bs, bd))
    xs2, ws2, xd2 = xs.clone(), ws.clone(), xd.clone()
    xs2[bs == 1] += 3.0
    ws2[bs == 1] *= torch.linspace(0.1, 5, int((bs == 1).sum()), dtype=DT)
    xd2[bd == 1] -= 2.0
    out2 = device.run(layer, (xs2, xd2), None, ws2, (bs, bd))
    keep = bd != 1
    assert torch.equal(out2[keep], out[keep])
    assert (out2[~keep] - out[~keep]).abs().max() > 1e-3  # the change was seen by sample 1


def test_permutation_equivariance():
    layer = layer_for(6)
    x, _, w, batch = make_batch(SIZES, 6, seed=8)
    out = layer(x, None, w, batch)
    # permute points within each sample (batch stays sorted)
    perm = torch.cat([torch.randperm(n, generator=torch.Generator().manual_seed(n)) + o
                      for n, o in zip(SIZES, (0, 5, 14))])
    torch.testing.assert_close(layer(x[perm], None, w[perm], batch), out[perm],
                               rtol=0, atol=1e-12)
    # cross: permuting the source leaves the output unchanged
    xd = torch.randn(4, 6, dtype=DT)
    bd = torch.tensor([0, 1, 1, 2])
    ref = layer((x, xd), None, w, (batch, bd))
    torch.testing.assert_close(layer((x[perm], xd), None, w[perm], (batch, bd)), ref,
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_quadrature_property_duplicate_points_half_weight(impl):
    """Splitting every source point into two copies of half weight is the same rule."""
    layer = layer_for(6, impl=impl)
    x, _, w, batch = make_batch(SIZES, 6, seed=9)
    out = layer(x, None, w, batch)
    # cross form: duplicated source, original queries
    order = torch.argsort(torch.cat([batch, batch]), stable=True)
    xs = torch.cat([x, x])[order]
    ws = torch.cat([w / 2, w / 2])[order]
    bs = torch.cat([batch, batch])[order]
    torch.testing.assert_close(layer((xs, x), None, ws, (bs, batch)), out, rtol=0, atol=1e-12)
    # self form on the duplicated set: every copy gets the original output
    origin = torch.cat([torch.arange(len(x)), torch.arange(len(x))])[order]
    torch.testing.assert_close(layer(xs, None, ws, bs), out[origin], rtol=0, atol=1e-12)


def test_uniform_weights_give_standard_attention():
    """w = const reproduces the plain softmax attention of the paper (Theorem 6)."""
    layer = layer_for(6)
    x = torch.randn(11, 6, dtype=DT)
    out = layer(x, None, torch.full((11,), 0.37, dtype=DT))
    # plain softmax attention (no weights at all)
    q = (x @ layer.lin_q.weight.T + layer.lin_q.bias).view(11, 2, 4).transpose(0, 1)
    k = (x @ layer.lin_k.weight.T + layer.lin_k.bias).view(11, 2, 4).transpose(0, 1)
    v = (x @ layer.lin_v.weight.T + layer.lin_v.bias).view(11, 2, 4).transpose(0, 1)
    plain = torch.softmax(q @ k.transpose(1, 2) / 2.0, -1) @ v
    plain = layer.lin_out(plain.transpose(0, 1).reshape(11, 8))
    torch.testing.assert_close(out, plain, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", ("sdpa", "naive") + FUSED)
def test_gradcheck_x_and_weight(impl, device64):
    layer = device64.module(layer_for((3, 2), out_channels=4, heads=2, impl=impl))
    xs, xd, w, bs, bd = device64.to((
        torch.randn(5, 3, dtype=DT, requires_grad=True),
        torch.randn(4, 2, dtype=DT, requires_grad=True),
        (torch.rand(5, dtype=DT) + 0.1).requires_grad_(),
        torch.tensor([0, 0, 0, 1, 1]), torch.tensor([0, 1, 1, 1])))
    assert torch.autograd.gradcheck(lambda a, b, c: layer((a, b), None, c, (bs, bd)),
                                    (xs, xd, w))
    xself = device64.to(torch.randn(5, 3, dtype=DT, requires_grad=True))
    layer = device64.module(layer_for(3, out_channels=4, heads=2, impl=impl))
    assert torch.autograd.gradcheck(lambda a, c: layer(a, None, c, bs), (xself, w))


def test_padding_and_zero_weights_give_finite_gradients(fused_kernel_available):
    """Padded query rows, zero-weight keys and an all-padding sample: no NaN anywhere."""
    for impl in [i for i in IMPLS if i != "fused" or fused_kernel_available]:
        layer = layer_for(3, out_channels=4, heads=2, impl=impl)
        X = torch.randn(3, 6, 3, dtype=DT, requires_grad=True)
        W = torch.rand(3, 6, dtype=DT)
        W[0, 1] = 0.0  # a real point with zero weight
        W = W.requires_grad_()
        M = torch.ones(3, 6, dtype=torch.bool)
        M[1, 4:] = False
        M[2] = False  # empty slot in the batch
        out = layer.dense(X, None, W, mask=M)
        assert torch.isfinite(out).all() and bool((out[2] == 0).all())
        out.square().sum().backward()
        assert torch.isfinite(X.grad).all() and torch.isfinite(W.grad).all(), impl
        assert bool((X.grad[2] == 0).all()) and bool((X.grad[1, 4:] == 0).all())
        assert W.grad[0, 1] == 0  # zero weight: no NaN from d log(w)/dw


class _RecordOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names, self.max_numel = set(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.names.add(str(func.overloadpacket.__name__))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


@pytest.mark.parametrize("impl", ("sdpa",) + FUSED)
@pytest.mark.parametrize("weight_grad", [False, True])
def test_fused_paths_never_materialise_attention_matrix(impl, weight_grad):
    """The SDPA and fused-kernel paths build no tensor of N x N entries, forward and
    backward, with or without a gradient w.r.t. the weights."""
    n = 96
    layer = ContinuumAttention(8, heads=2, impl=impl)
    x = torch.randn(2 * n, 8, requires_grad=True)
    w = torch.rand(2 * n).requires_grad_(weight_grad)
    batch = torch.arange(2).repeat_interleave(n)
    with _RecordOps() as rec:
        layer(x, None, w, batch).square().sum().backward()
    if impl == "sdpa":
        assert any("scaled_dot_product" in name for name in rec.names), rec.names
    assert rec.max_numel < n * n, rec.max_numel
    # the naive reference path does build it (so the check above can fail)
    layer.impl = "naive"
    with _RecordOps() as rec:
        layer(x, None, w, batch).square().sum().backward()
    assert rec.max_numel >= 2 * n * n


def test_auto_takes_the_fused_kernel_where_it_applies(monkeypatch, fused_kernel_available):
    calls = []
    real = CA.fused_attention

    def spy(*args, **kw):
        calls.append(args[0].shape)
        return real(*args, **kw)

    monkeypatch.setattr(CA, "fused_attention", spy)
    layer = ContinuumAttention(6, 8, heads=2).to(DT)
    assert layer.impl == "auto"
    x, _, w, batch = make_batch(SIZES, 6, seed=12)
    out = layer(x, None, w, batch)
    assert len(calls) == (1 if fused_kernel_available else 0)
    torch.testing.assert_close(out, reference_flat(layer, x, x, w, batch, batch), rtol=0,
                               atol=1e-10)
    calls.clear()
    layer.dropout = 0.5
    layer.train()(x, None, w, batch)  # attention dropout: PyTorch's path
    assert calls == []
    layer.impl = "fused"
    if fused_kernel_available:
        with pytest.raises(ValueError, match="no attention dropout"):
            layer(x, None, w, batch)


def test_dropout_only_in_training():
    layer = ContinuumAttention(6, 8, heads=2, dropout=0.5).to(DT)
    x, _, w, batch = make_batch(SIZES, 6, seed=10)
    layer.eval()
    torch.testing.assert_close(layer(x, None, w, batch),
                               reference_flat(layer, x, x, w, batch, batch), rtol=0, atol=1e-10)
    layer.train()
    torch.manual_seed(0)
    assert not torch.allclose(layer(x, None, w, batch), layer.eval()(x, None, w, batch))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="not divisible by heads"):
        ContinuumAttention(8, 6, heads=4)
    with pytest.raises(ValueError, match="impl"):
        ContinuumAttention(8, impl="flash")
    layer = layer_for(6)
    x, pos, w, batch = make_batch(SIZES, 6, seed=11)
    with pytest.raises(ValueError, match="non-negative"):
        layer(x, None, torch.where(torch.arange(17) == 3, -1.0, w), batch)
    with pytest.raises(ValueError, match="finite"):
        layer(x, None, torch.where(torch.arange(17) == 3, float("nan"), w), batch)
    with pytest.raises(ValueError, match="finite"):
        layer(x, None, torch.where(torch.arange(17) == 3, float("inf"), w), batch)
    with pytest.raises(ValueError, match="weight has shape"):
        layer(x, None, w[:-1], batch)
    with pytest.raises(ValueError, match="pos has 16 rows"):
        layer(x, pos[:-1], w, batch)
    with pytest.raises(ValueError, match="batch has 16 rows"):
        layer(x, None, w, batch[:-1])
    with pytest.raises(ValueError, match="sorted"):
        layer(x, None, w, batch.flip(0))
    with pytest.raises(ValueError, match="channels, expected 6"):
        layer(x[:, :5], None, w, batch)
    with pytest.raises(ValueError, match="both be given"):
        layer((x, x), None, w, (batch, None))
    # a sample with queries but no weighted source point: 0/0
    with pytest.raises(ValueError, match="sample 1 has destination points"):
        layer(x, None, torch.where(batch == 1, 0.0, w), batch)
    with pytest.raises(ValueError, match="mask has shape"):
        layer.dense(x[None], None, w[None], mask=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="weight has shape"):
        layer.dense(x[None], None, w[None, :-1])


def test_repr_and_reset():
    layer = ContinuumAttention(64, 64, heads=4)
    assert repr(layer) == "ContinuumAttention(64, 64, heads=4)"
    cross = ContinuumAttention((16, 8), 32, heads=2)
    assert repr(cross) == "ContinuumAttention((16, 8), 32, heads=2)"
    before = layer.lin_q.weight.clone()
    layer.reset_parameters()
    assert not torch.equal(before, layer.lin_q.weight)


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_inputs_give_empty_outputs_and_gradients(impl):
    """No points (flat, with and without a batch vector; dense; cross with no
    destination points) gives an empty [0, C_out] output as the other layers do, and
    backward through its (empty) sum gives zero gradients of the right shapes."""
    layer = layer_for(3, out_channels=4, heads=2, impl=impl)
    x = torch.randn(0, 3, dtype=DT, requires_grad=True)
    w = torch.rand(0, dtype=DT, requires_grad=True)
    for batch in (None, torch.zeros(0, dtype=torch.long)):
        out = layer(x, None, w, batch)
        assert out.shape == (0, 4) and out.dtype == DT
        out.sum().backward()
        assert x.grad.shape == (0, 3) and w.grad.shape == (0,)
        assert layer.lin_out.weight.grad is not None
        assert bool((layer.lin_out.weight.grad == 0).all())
        layer.zero_grad()
    X = torch.randn(2, 0, 3, dtype=DT, requires_grad=True)
    out = layer.dense(X, None, torch.rand(2, 0, dtype=DT))
    assert out.shape == (2, 0, 4)
    out.sum().backward()
    assert X.grad.shape == (2, 0, 3)
    # cross-attention onto no destination points: the source gets zero gradients
    xs = torch.randn(5, 3, dtype=DT, requires_grad=True)
    ws = torch.rand(5, dtype=DT) + 0.1
    for b in (None, (torch.zeros(5, dtype=torch.long), torch.zeros(0, dtype=torch.long))):
        out = layer((xs, x), None, ws, b)
        assert out.shape == (0, 4)
        out.sum().backward()
        assert bool((xs.grad == 0).all())
        xs.grad = None


def test_empty_source_with_destination_points_is_an_error():
    """The softmax over no source points is 0/0: refused, naming the sample, rather
    than an IndexError from the reduction over an empty dimension."""
    layer = layer_for(3, out_channels=4, heads=2)
    xd = torch.randn(4, 3, dtype=DT)
    with pytest.raises(ValueError, match="sample 0 has destination points but no source"):
        layer((torch.randn(0, 3, dtype=DT), xd), None, torch.rand(0, dtype=DT))
    with pytest.raises(ValueError, match="sample 0 has destination points but no source"):
        layer.dense((torch.randn(1, 0, 3, dtype=DT), xd[None]), None, torch.rand(1, 0, dtype=DT))
