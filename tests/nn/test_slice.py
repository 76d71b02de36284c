"""SliceAttention (issue 27, item 3): Transolver's slice attention with quadrature
weights, in float64 against a plain reference written here; batched, padded and cross
forms; weight-scale invariance. Convergence under refinement and the graded-mesh test
are in tests/nn/test_consistency.py."""

from __future__ import annotations

import math

import pytest
import torch

from meshops.nn.slice import SliceAttention


@torch.no_grad()
def reference(layer: SliceAttention, x_src, weight, x_dst=None):
    """The formula of the docstring with loops over heads, slices and points."""
    x_dst = x_src if x_dst is None else x_dst
    H, M, d = layer.heads, layer.slices, layer.head_channels
    f = layer.lin_f(x_src)
    xs = layer.lin_x(x_src)
    xd = (layer.lin_x_dst or layer.lin_x)(x_dst)
    w = weight / weight.sum()
    heads = []
    def tau(h, x):
        """The temperature of every point ``[N, 1]`` (a column of one value unless
        adaptive)."""
        log_tau = float(layer.log_temperature[h].detach()) + torch.zeros(len(x), 1,
                                                                          dtype=x.dtype)
        if layer.lin_temperature is not None:
            log_tau = log_tau + layer.lin_temperature(x)
        return log_tau.exp()

    for h in range(H):
        cols = slice(h * d, (h + 1) * d)
        s_src = torch.softmax(layer.lin_slice(xs[:, cols]) / tau(h, xs[:, cols]), dim=-1)
        s_dst = torch.softmax(layer.lin_slice(xd[:, cols]) / tau(h, xd[:, cols]), dim=-1)
        tokens = []
        for j in range(M):
            num = sum(w[i] * s_src[i, j] * f[i, cols] for i in range(len(w)))
            den = sum(w[i] * s_src[i, j] for i in range(len(w)))
            tokens.append(num / (den + layer.EPS))
        z = torch.stack(tokens)                                  # [M, d]
        q, k, v = layer.lin_qkv(z).chunk(3, dim=-1)
        logits = q @ k.T / math.sqrt(d)
        if layer.min_measure:  # each key weighs m / (m + mu) of its slice's measure m
            mass = torch.stack([sum(w[i] * s_src[i, j] for i in range(len(w)))
                                for j in range(M)])
            e = (mass / (mass + layer.min_measure))[None, :] * torch.exp(logits)
            att = (e / e.sum(-1, keepdim=True)) @ v
        else:
            att = torch.softmax(logits, dim=-1) @ v              # [M, d]
        heads.append(s_dst @ att)
    return layer.lin_out(torch.cat(heads, dim=-1))


def _layer(c_in=5, out=8, heads=2, slices=3, **kw):
    torch.manual_seed(0)
    layer = SliceAttention(c_in, out, heads=heads, slices=slices, **kw).double()
    with torch.no_grad():
        layer.log_temperature.copy_(torch.tensor([-0.3, 0.4], dtype=torch.float64)[:heads])
    return layer


def test_matches_the_reference_in_float64():
    layer = _layer()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 5, generator=g, dtype=torch.float64)
    w = torch.rand(30, generator=g, dtype=torch.float64)
    torch.testing.assert_close(layer(x, None, w), reference(layer, x, w), rtol=1e-12,
                               atol=1e-12)


def test_adaptive_temperature_matches_the_reference_and_starts_as_the_plain_layer():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(30, 5, generator=g, dtype=torch.float64)
    w = torch.rand(30, generator=g, dtype=torch.float64)
    plain, ada = _layer(), _layer(adaptive_temperature=True)
    missing = ada.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["lin_temperature.bias", "lin_temperature.weight"]
    # zero offsets at the start: the same outputs as the plain layer
    torch.testing.assert_close(ada(x, None, w), plain(x, None, w), rtol=1e-14, atol=1e-14)
    with torch.no_grad():
        ada.lin_temperature.weight.copy_(torch.randn(1, 4, generator=g, dtype=torch.float64))
        ada.lin_temperature.bias.fill_(0.2)
    got = ada(x, None, w)
    torch.testing.assert_close(got, reference(ada, x, w), rtol=1e-12, atol=1e-12)
    assert float((got - plain(x, None, w)).detach().abs().max()) > 1e-3   # it acts
    assert "adaptive_temperature=True" in repr(ada)


def test_min_measure_matches_the_reference_and_mutes_an_empty_slice():
    """Tokens muted below a measure: the formula of the docstring; a slice that covers
    no point changes no other token, where the plain layer lets its token, whatever it
    is, enter every other's attention; and slices far larger than the floor attend as
    in the plain layer."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(30, 5, generator=g, dtype=torch.float64)
    w = torch.rand(30, generator=g, dtype=torch.float64)
    layer = _layer(min_measure=0.2)
    torch.testing.assert_close(layer(x, None, w), reference(layer, x, w), rtol=1e-12,
                               atol=1e-12)
    assert "min_measure=0.2" in repr(layer)
    # every slice here covers about a third of the domain: a floor 1e-9 changes nothing
    torch.testing.assert_close(_layer(min_measure=1e-9)(x, None, w), _layer()(x, None, w),
                               rtol=1e-7, atol=1e-7)

    def without_slice_0(mu):
        """A layer of 4 slices whose slice 0 no point chooses (a logit 1e4 below the
        others), and the same layer without that slice."""
        four, three = _layer(slices=4, min_measure=mu), _layer(slices=3, min_measure=mu)
        with torch.no_grad():
            four.lin_slice.bias.copy_(torch.tensor([-1e4, 0.0, 0.0, 0.0]))
            for name in ("lin_f", "lin_x", "lin_qkv", "lin_out"):
                getattr(three, name).load_state_dict(getattr(four, name).state_dict())
            three.lin_slice.weight.copy_(four.lin_slice.weight[1:])
            three.lin_slice.bias.zero_()
            three.log_temperature.copy_(four.log_temperature)
        return four(x, None, w), three(x, None, w)

    four, three = without_slice_0(0.01)
    torch.testing.assert_close(four, three, rtol=1e-12, atol=1e-12)
    four, three = without_slice_0(0.0)
    assert float((four - three).detach().abs().max()) > 1e-3


def test_cross_form_matches_the_reference():
    layer = _layer(c_in=(5, 3))
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(20, 5, generator=g, dtype=torch.float64)
    xd = torch.randn(7, 3, generator=g, dtype=torch.float64)
    w = torch.rand(20, generator=g, dtype=torch.float64)
    got = layer((xs, xd), (None, None), w, (torch.zeros(20, dtype=torch.long),
                                            torch.zeros(7, dtype=torch.long)))
    torch.testing.assert_close(got, reference(layer, xs, w, xd), rtol=1e-12, atol=1e-12)


def test_batch_padding_and_dense_form_agree_with_one_sample_at_a_time():
    layer = _layer()
    g = torch.Generator().manual_seed(3)
    sizes = (11, 17, 5)
    xs = [torch.randn(n, 5, generator=g, dtype=torch.float64) for n in sizes]
    ws = [torch.rand(n, generator=g, dtype=torch.float64) for n in sizes]
    one = [layer(x, None, w) for x, w in zip(xs, ws)]
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    flat = layer(torch.cat(xs), None, torch.cat(ws), batch)
    torch.testing.assert_close(flat, torch.cat(one), rtol=1e-12, atol=1e-12)
    n = max(sizes)
    X = torch.zeros(3, n, 5, dtype=torch.float64)
    W = torch.zeros(3, n, dtype=torch.float64)
    mask = torch.zeros(3, n, dtype=torch.bool)
    for i, (x, w) in enumerate(zip(xs, ws)):
        X[i, :len(x)], W[i, :len(x)], mask[i, :len(x)] = x, w, True
    X[~mask] = float("nan")  # garbage on padding must not reach real rows
    dense = layer.dense(X, None, W, mask)
    torch.testing.assert_close(dense[mask], torch.cat(one), rtol=1e-12, atol=1e-12)
    assert bool((dense[~mask] == 0).all())


def test_self_attention_chooses_the_slices_once_also_on_a_padded_batch(monkeypatch):
    # The slice weights of the points are the layer's costliest part (a softmax over
    # [B, H, N, M]); in self-attention the source's are the destination's. Masking the
    # padding must not hide that the two sides are one (it did: they were computed twice,
    # a third of the training step of the slice transformer).
    layer = _layer()
    calls = []
    real = SliceAttention.slice_weights

    def counted(self, x, lin):
        calls.append(tuple(x.shape))
        return real(self, x, lin)

    monkeypatch.setattr(SliceAttention, "slice_weights", counted)
    g = torch.Generator().manual_seed(8)
    sizes = (11, 17)
    x = torch.randn(sum(sizes), 5, generator=g, dtype=torch.float64)
    w = torch.rand(sum(sizes), generator=g, dtype=torch.float64)
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    layer(x, None, w, batch)
    assert calls == [(2, 17, 5)]
    calls.clear()
    layer(x[:11], None, w[:11], torch.zeros(11, dtype=torch.long))
    assert calls == [(1, 11, 5)]


def test_invariant_to_the_scale_of_the_weights_and_the_order_of_the_points():
    layer = _layer()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(25, 5, generator=g, dtype=torch.float64)
    w = torch.rand(25, generator=g, dtype=torch.float64)
    out = layer(x, None, w)
    torch.testing.assert_close(layer(x, None, 1e6 * w), out, rtol=1e-12, atol=1e-12)
    perm = torch.randperm(25, generator=g)
    torch.testing.assert_close(layer(x[perm], None, w[perm]), out[perm], rtol=1e-12,
                               atol=1e-12)


def test_a_zero_weight_point_is_not_in_any_token():
    """A point of weight 0 changes no token: its own output is the read-back of the
    others' tokens, and everyone else's output is that without it."""
    layer = _layer()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(12, 5, generator=g, dtype=torch.float64)
    w = torch.rand(12, generator=g, dtype=torch.float64)
    w0 = w.clone()
    w0[3] = 0.0
    x2 = x.clone()
    x2[3] = 100.0  # any value
    drop = torch.arange(12) != 3
    torch.testing.assert_close(layer(x2, None, w0)[drop], layer(x[drop], None, w[drop]),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw, message", [
    ({"slices": 0}, "slices must be a positive integer"),
    ({"min_measure": 1.0}, "min_measure must be a fraction of the domain"),
    ({"min_measure": -0.1}, "min_measure must be a fraction of the domain"),
    ({"temperature": 0.0}, "temperature must be positive"),
    ({"out": 7}, "not divisible by heads"),
])
def test_bad_sizes_are_refused(kw, message):
    out = kw.pop("out", 8)
    with pytest.raises(ValueError, match=message):
        SliceAttention(4, out, heads=2, **kw)


def test_a_sample_without_weight_is_refused():
    layer = _layer()
    with pytest.raises(ValueError, match="no source point with positive weight"):
        layer(torch.randn(4, 5, dtype=torch.float64), None, torch.zeros(4, dtype=torch.float64))


def test_repr_and_reset():
    layer = _layer()
    assert repr(layer) == "SliceAttention(5, 8, heads=2, slices=3)"
    before = layer.lin_f.weight.clone()
    layer.reset_parameters()
    assert not torch.equal(before, layer.lin_f.weight)
    assert float(layer.log_temperature.detach().exp()[0]) == pytest.approx(0.5)


def test_the_slice_transformer_starts_with_each_heads_own_temperature():
    # its small initialisation redraws every linear map; the per-point temperature's
    # offsets must come back to zero after it, as the layer's docstring says
    from meshops.models.slice_transformer import SliceTransformer

    torch.manual_seed(0)
    model = SliceTransformer(1, 2, width=16, layers=2, heads=2, slices=4,
                             adaptive_temperature=True)
    for blk in model.blocks:
        lin = blk.attention.lin_temperature
        assert not lin.weight.any() and not lin.bias.any()
