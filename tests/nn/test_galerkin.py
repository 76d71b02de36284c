"""GalerkinAttention z = Q (K~^T diag(w) V~), FourierAttention z = (Q~ K~^T) diag(w) V."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.utils import to_dense_batch

from meshops.nn.galerkin import FourierAttention, GalerkinAttention

DT = torch.float64
SIZES = (5, 9, 3)
DST_SIZES = (4, 2, 6)
KINDS = {"galerkin": GalerkinAttention, "fourier": FourierAttention}
NORMED = {"galerkin": ("k", "v"), "fourier": ("q", "k")}


def make_batch(sizes, channels, seed, pos_dim=2):
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.randn(n, channels, generator=g, dtype=DT)
    pos = torch.rand(n, pos_dim, generator=g, dtype=DT)
    w = torch.rand(n, generator=g, dtype=DT) + 0.05
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return x, pos, w, batch


def layer_for(kind, in_channels, out_channels=8, heads=2, pos_dim=0, seed=0, **kw):
    torch.manual_seed(seed)
    layer = KINDS[kind](in_channels, out_channels, heads=heads, pos_dim=pos_dim, **kw).to(DT)
    with torch.no_grad():  # generic parameters, so that every one of them is tested
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return layer


def layer_norm(t, gamma, beta, eps):
    mean = t.mean(-1, keepdim=True)
    var = ((t - mean) ** 2).mean(-1, keepdim=True)
    return (t - mean) / torch.sqrt(var + eps) * gamma + beta


def reference(layer, x_src, x_dst, w, pos_src=None, pos_dst=None, kind=None):
    """One sample, per head, straight from the paper's formulas with w_j for 1/n:
    Galerkin z = Q (K~^T diag(w) V~), Fourier z = (Q~ K~^T) diag(w) V (explicit N x N)."""
    kind = kind or ("galerkin" if isinstance(layer, GalerkinAttention) else "fourier")
    H, D, p = layer.heads, layer.head_channels, layer.pos_dim
    q = x_dst @ layer.lin_q.weight.T + layer.lin_q.bias
    k = x_src @ layer.lin_k.weight.T + layer.lin_k.bias
    v = x_src @ layer.lin_v.weight.T + layer.lin_v.bias
    eps = next(iter(layer.norms.values())).eps
    heads = []
    for h in range(H):
        c = slice(h * D, (h + 1) * D)
        qh, kh, vh = q[:, c], k[:, c], v[:, c]
        for name in NORMED[kind]:  # the paper: K, V for Galerkin; Q, K for Fourier
            g, b = layer.norms[name].weight[h], layer.norms[name].bias[h]
            if name == "q":
                qh = layer_norm(qh, g, b, eps)
            if name == "k":
                kh = layer_norm(kh, g, b, eps)
            if name == "v":
                vh = layer_norm(vh, g, b, eps)
        if p:
            qh = torch.cat([pos_dst, qh], 1)
            kh = torch.cat([pos_src, kh], 1)
            vh = torch.cat([pos_src, vh], 1)
        if kind == "galerkin":
            z = qh @ (kh.T @ torch.diag(w) @ vh)
        else:
            z = (qh @ kh.T) @ torch.diag(w) @ vh
        heads.append(z)
    return torch.cat(heads, 1) @ layer.lin_out.weight.T + layer.lin_out.bias


def reference_flat(layer, xs, xd, w, bs, bd, ps=None, pd=None):
    out = []
    for i in range(int(bd.max()) + 1):
        s, d = bs == i, bd == i
        out.append(reference(layer, xs[s], xd[d], w[s],
                             None if ps is None else ps[s], None if pd is None else pd[d]))
    return torch.cat(out)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pos_dim", [0, 2])
def test_self_attention_matches_formula_flat(kind, pos_dim, device):
    layer = layer_for(kind, 6, pos_dim=pos_dim)
    x, pos, w, batch = make_batch(SIZES, 6, seed=1)
    out = device.run(layer, x, pos, w, batch)
    assert out.shape == (sum(SIZES), 8)
    device.assert_close(out, reference_flat(layer, x, x, w, batch, batch, pos, pos),
                        rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pos_dim", [0, 2])
def test_cross_attention_matches_formula_flat_and_dense(kind, pos_dim, device):
    layer = layer_for(kind, (6, 3), out_channels=8, pos_dim=pos_dim)
    xs, ps, ws, bs = make_batch(SIZES, 6, seed=2)
    xd, pd, _, bd = make_batch(DST_SIZES, 3, seed=3)
    ref = reference_flat(layer, xs, xd, ws, bs, bd, ps, pd)
    out = device.run(layer, (xs, xd), (ps, pd), ws, (bs, bd))
    assert out.shape == (sum(DST_SIZES), 8)
    device.assert_close(out, ref, rtol=0, atol=1e-10)
    # dense form, with garbage in padded source slots
    Xs, Ms = to_dense_batch(xs, bs)
    Ps = to_dense_batch(ps, bs)[0]
    Ws = to_dense_batch(ws, bs)[0]
    Xd, Md = to_dense_batch(xd, bd)
    Pd = to_dense_batch(pd, bd)[0]
    Xs = Xs.masked_fill(~Ms[..., None], float("nan"))
    Ps = Ps.masked_fill(~Ms[..., None], 1e6)
    out = device.run(layer.dense, (Xs, Xd), (Ps, Pd), Ws, mask=(Ms, Md))
    assert out.shape == (3, max(DST_SIZES), 8)
    device.assert_close(out[Md], ref, rtol=0, atol=1e-10)
    assert bool((out[~Md] == 0).all())


@pytest.mark.parametrize("kind", KINDS)
def test_padded_keys_contribute_nothing_even_with_positive_weight_given(kind, device):
    """Padding is excluded through the mask (its weight is forced to 0)."""
    layer = layer_for(kind, 6, pos_dim=2)
    x, pos, w, _ = make_batch((7,), 6, seed=4)
    ref = reference(layer, x, x, w, pos, pos)
    X = torch.cat([x, torch.randn(3, 6, dtype=DT)])[None]
    P = torch.cat([pos, torch.rand(3, 2, dtype=DT)])[None]
    W = torch.cat([w, torch.ones(3, dtype=DT)])[None]
    M = torch.arange(10)[None] < 7
    out = device.run(layer.dense, X, P, W, mask=M)
    device.assert_close(out[0, :7], ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_uniform_weights_reproduce_paper_one_over_n(kind):
    """w = 1/n is exactly the paper's (5)/(6): Q(K~^T V~)/n and (Q~K~^T)V/n."""
    layer = layer_for(kind, 6)
    n = 13
    x = torch.randn(n, 6, dtype=DT)
    out = layer(x, None, torch.full((n,), 1.0 / n, dtype=DT))
    H, D = layer.heads, layer.head_channels
    q = layer.lin_q(x).view(n, H, D).transpose(0, 1)
    k = layer.lin_k(x).view(n, H, D).transpose(0, 1)
    v = layer.lin_v(x).view(n, H, D).transpose(0, 1)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if name in NORMED[kind]:
            ln = [torch.nn.functional.layer_norm(t[h], (D,), layer.norms[name].weight[h],
                                                 layer.norms[name].bias[h], layer.norms[name].eps)
                  for h in range(H)]
            if name == "q":
                q = torch.stack(ln)
            elif name == "k":
                k = torch.stack(ln)
            else:
                v = torch.stack(ln)
    if kind == "galerkin":
        z = q @ (k.transpose(1, 2) @ v) / n
    else:
        z = (q @ k.transpose(1, 2)) @ v / n
    paper = layer.lin_out(z.transpose(0, 1).reshape(n, H * D))
    torch.testing.assert_close(out, paper, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_samples_do_not_interact(kind, device):
    layer = layer_for(kind, (6, 3), pos_dim=2)
    xs, ps, ws, bs = make_batch(SIZES, 6, seed=5)
    xd, pd, _, bd = make_batch(DST_SIZES, 3, seed=6)
    out = device.run(layer, (xs, xd), (ps, pd), ws, (bs, bd))
    xs2, ps2, ws2, xd2 = xs.clone(), ps.clone(), ws.clone(), xd.clone()
    xs2[bs == 1] += 3.0
    ps2[bs == 1] += 1.0
    ws2[bs == 1] *= 4.0
    xd2[bd == 1] -= 2.0
    out2 = device.run(layer, (xs2, xd2), (ps2, pd), ws2, (bs, bd))
    keep = bd != 1
    assert torch.equal(out2[keep], out[keep])
    assert (out2[~keep] - out[~keep]).abs().max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_permutation_equivariance(kind):
    layer = layer_for(kind, 6, pos_dim=2)
    x, pos, w, batch = make_batch(SIZES, 6, seed=7)
    out = layer(x, pos, w, batch)
    perm = torch.cat([torch.randperm(n, generator=torch.Generator().manual_seed(n)) + o
                      for n, o in zip(SIZES, (0, 5, 14))])
    torch.testing.assert_close(layer(x[perm], pos[perm], w[perm], batch), out[perm],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_quadrature_property_duplicate_points_half_weight(kind):
    layer = layer_for(kind, 6, pos_dim=2)
    x, pos, w, batch = make_batch(SIZES, 6, seed=8)
    out = layer(x, pos, w, batch)
    order = torch.argsort(torch.cat([batch, batch]), stable=True)
    xs, ps = torch.cat([x, x])[order], torch.cat([pos, pos])[order]
    ws, bs = torch.cat([w / 2, w / 2])[order], torch.cat([batch, batch])[order]
    torch.testing.assert_close(layer((xs, x), (ps, pos), ws, (bs, batch)), out,
                               rtol=0, atol=1e-12)
    origin = torch.cat([torch.arange(len(x)), torch.arange(len(x))])[order]
    torch.testing.assert_close(layer(xs, ps, ws, bs), out[origin], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_x_weight_pos(kind, device64):
    layer = device64.module(layer_for(kind, (3, 2), out_channels=4, heads=2, pos_dim=1))
    xs, xd, ps, pd, w, bs, bd = device64.to((
        torch.randn(5, 3, dtype=DT, requires_grad=True),
        torch.randn(4, 2, dtype=DT, requires_grad=True),
        torch.rand(5, 1, dtype=DT, requires_grad=True),
        torch.rand(4, 1, dtype=DT, requires_grad=True),
        (torch.rand(5, dtype=DT) + 0.1).requires_grad_(),
        torch.tensor([0, 0, 0, 1, 1]), torch.tensor([0, 1, 1, 1])))
    assert torch.autograd.gradcheck(
        lambda a, b, c, d, e: layer((a, b), (c, d), e, (bs, bd)), (xs, xd, ps, pd, w))


@pytest.mark.parametrize("kind", KINDS)
def test_zero_weight_sample_has_zero_attention_term(kind):
    """An empty source integral is 0 (no normalisation): only lin_out's bias is left."""
    layer = layer_for(kind, 6)
    x, _, w, batch = make_batch(SIZES, 6, seed=9)
    out = layer(x, None, torch.where(batch == 2, 0.0, w), batch)
    torch.testing.assert_close(out[batch == 2], layer.lin_out.bias.expand(3, -1),
                               rtol=0, atol=0)


def test_initialisation_is_xavier_plus_diagonal():
    eta, delta = 1e-2, 1e-2
    torch.manual_seed(0)
    layer = GalerkinAttention((12, 16), 16, heads=4, eta=eta, delta=delta)
    for lin, fan_in in ((layer.lin_q, 16), (layer.lin_k, 12), (layer.lin_v, 12)):
        W = lin.weight.detach()
        m = min(W.shape)
        rest = W.clone()
        rest[:m, :m] -= delta * torch.eye(m)
        bound = eta * math.sqrt(6.0 / (fan_in + 16))
        assert rest.abs().max() <= bound + 1e-7
        assert rest.abs().max() > 0.5 * bound  # really a (scaled) xavier draw
        assert torch.all(lin.bias == 0)
    for norm in layer.norms.values():
        assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0)
    assert set(layer.norms) == {"k", "v"}
    assert set(FourierAttention(8).norms) == {"q", "k"}


def test_pos_dim_grows_head_dimension():
    layer = GalerkinAttention(8, 8, heads=2, pos_dim=3)
    assert layer.lin_out.in_features == 2 * (4 + 3)
    assert repr(layer) == "GalerkinAttention(8, 8, heads=2, pos_dim=3)"
    assert repr(FourierAttention(64, 64, heads=4)) == "FourierAttention(64, 64, heads=4)"


def test_invalid_arguments():
    with pytest.raises(ValueError, match="not divisible by heads"):
        GalerkinAttention(8, 6, heads=4)
    with pytest.raises(ValueError, match="pos_dim"):
        FourierAttention(8, heads=2, pos_dim=-1)
    layer = GalerkinAttention(6, 8, heads=2, pos_dim=2).to(DT)
    x, pos, w, batch = make_batch(SIZES, 6, seed=10)
    with pytest.raises(ValueError, match="needs pos"):
        layer(x, None, w, batch)
    with pytest.raises(ValueError, match="expected pos_dim=2"):
        layer(x, pos[:, :1], w, batch)
    with pytest.raises(ValueError, match="non-negative"):
        layer(x, pos, -w, batch)
    with pytest.raises(ValueError, match="finite"):
        layer(x, pos, w / 0, batch)
    with pytest.raises(ValueError, match="weight has shape"):
        layer(x, pos, w[1:], batch)
    with pytest.raises(ValueError, match="pos has 16 rows"):
        layer(x, pos[1:], w, batch)
    with pytest.raises(ValueError, match="batch has 18 rows"):
        layer(x, pos, w, torch.cat([batch, batch[-1:]]))
    with pytest.raises(ValueError, match="different batch sizes"):
        layer.dense((torch.randn(2, 3, 6, dtype=DT), torch.randn(3, 3, 6, dtype=DT)),
                    None, torch.rand(2, 3, dtype=DT))


@pytest.mark.parametrize("cls", [GalerkinAttention, FourierAttention])
def test_row_blocks_give_the_same_result(cls, monkeypatch):
    """The two passes over row blocks used without autograd (sizes 7 here, with a
    ragged last block and cross-attention of different sizes) equal a single block
    to float64 rounding; with autograd the layer takes one block, and its gradient
    does not depend on ROWS."""
    import meshops.nn.galerkin as gal
    torch.manual_seed(0)
    layer = cls((8, 6), 8, heads=2, pos_dim=2).double()
    xs, xd = torch.randn(2, 23, 8, dtype=torch.float64), torch.randn(2, 17, 6, dtype=torch.float64)
    ps, pd = torch.rand(2, 23, 2, dtype=torch.float64), torch.rand(2, 17, 2, dtype=torch.float64)
    w = torch.rand(2, 23, dtype=torch.float64)
    xs.requires_grad_(True)
    one = layer.dense((xs, xd), (ps, pd), w)
    g_one = torch.autograd.grad(one.square().sum(), xs)[0]
    monkeypatch.setattr(gal, "ROWS", 7)
    monkeypatch.setattr(gal, "BLOCK_ABOVE", 10)
    blocks = layer.dense((xs, xd), (ps, pd), w)
    g_blocks = torch.autograd.grad(blocks.square().sum(), xs)[0]
    with torch.no_grad():
        no_grad_blocks = layer.dense((xs, xd), (ps, pd), w)
    assert torch.allclose(one, no_grad_blocks, rtol=0, atol=1e-14)
    assert not torch.equal(one, no_grad_blocks)     # really summed in another order
    assert torch.allclose(one, blocks, rtol=0, atol=1e-14)
    assert torch.allclose(g_one, g_blocks, rtol=0, atol=1e-13)
