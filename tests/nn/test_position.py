"""PositionAttention / position_kernel against a dense reference of PiT's formula.

The reference is written here from the paper (eq. (5)/(9) with quadrature weights):
explicit distance matrix, exp, weights, row normalisation.  float64 throughout.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from meshops.nn import functional as PF
from meshops.nn import position as P
from meshops.nn.position import PositionAttention, position_kernel

DT = torch.float64
#: "fused" tests skip where the CPU kernel cannot be built (conftest's fused_kernel
#: fixture; tests/kernels/test_kernels.py insists on it on AVX2 machines)
PATHS = ["kernel", "sdpa", "fused"]


# ----------------------------------------------------------------------- reference
def ref_kernel(pos_src, pos_dst, w, lam):
    """[H, Nd, Ns]: w_j exp(-lam_h |x_i - y_j|^2) / sum_l (...)."""
    D = ((pos_dst[:, None, :] - pos_src[None, :, :]) ** 2).sum(-1)
    K = w[None, None, :] * torch.exp(-lam[:, None, None] * D[None])
    return K / K.sum(-1, keepdim=True)


def ref_posatt(layer, x_src, pos_src, pos_dst, w):
    """One sample: heads split the channels of x W_V + b."""
    V = x_src @ layer.lin.weight.T
    if layer.lin.bias is not None:
        V = V + layer.lin.bias
    K = ref_kernel(pos_src, pos_dst, w, layer.lam)
    H, c = layer.heads, layer.out_channels // layer.heads
    return torch.cat([K[h] @ V[:, h * c:(h + 1) * c] for h in range(H)], 1)


def make(cin=5, cout=6, heads=2, path="kernel", lam=(3.0, 11.0), seed=0):
    torch.manual_seed(seed)
    layer = PositionAttention(cin, cout, heads=heads, lam_init=list(lam)[:heads], impl=path)
    with torch.no_grad():
        layer.lin.bias.normal_()
    return layer.double()


def batch_vec(sizes):
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def sample(sizes, cin=5, d=2, offset=0.0, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    pos = torch.rand(n, d, generator=g, dtype=DT) + offset
    x = torch.randn(n, cin, generator=g, dtype=DT)
    w = torch.rand(n, generator=g, dtype=DT) + 0.1
    return x, pos, w, batch_vec(sizes)


# (cin, cout, heads): W_V before the kernel, and after it (heads * cin < cout)
CONFIGS = [(5, 6, 2), (2, 8, 2), (3, 3, 1)]


# -------------------------------------------------------------- reference equality
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_self_flat_batch_matches_reference(path, cfg, device):
    cin, cout, heads = cfg
    layer = make(cin, cout, heads, path)
    assert layer.project_after == (heads * cin < cout)
    sizes = [7, 12, 4]
    x, pos, w, b = sample(sizes, cin)
    out = device.run(layer, x, pos, w, b)
    assert out.shape == (sum(sizes), cout)
    for s in range(3):
        m = b == s
        ref = ref_posatt(layer, x[m], pos[m], pos[m], w[m])
        device.assert_close(out[m], ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_cross_flat_batch_matches_reference(path, cfg, device):
    cin, cout, heads = cfg
    layer = make(cin, cout, heads, path)
    src_sizes, dst_sizes = [7, 12, 4], [5, 3, 9]
    x, ps, w, bs = sample(src_sizes, cin, seed=2)
    _, pd, _, bd = sample(dst_sizes, cin, seed=3)
    out = device.run(layer, (x, None), (ps, pd), w, (bs, bd))
    assert out.shape == (sum(dst_sizes), cout)
    for s in range(3):
        ref = ref_posatt(layer, x[bs == s], ps[bs == s], pd[bd == s], w[bs == s])
        device.assert_close(out[bd == s], ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", PATHS)
def test_dense_form_with_padding_matches_reference(path, device):
    layer = make(path=path)
    B, Ns, Nd = 3, 9, 6
    g = torch.Generator().manual_seed(4)
    x = torch.randn(B, Ns, 5, generator=g, dtype=DT)
    ps = torch.rand(B, Ns, 2, generator=g, dtype=DT)
    pd = torch.rand(B, Nd, 2, generator=g, dtype=DT)
    w = torch.rand(B, Ns, generator=g, dtype=DT) + 0.1
    ns, nd = [9, 5, 2], [6, 4, 1]
    ms = torch.arange(Ns)[None] < torch.tensor(ns)[:, None]
    md = torch.arange(Nd)[None] < torch.tensor(nd)[:, None]
    # garbage in padded slots must not matter
    x = x.masked_fill(~ms[..., None], float("nan"))
    out = device.run(layer.dense, (x, None), (ps, pd), w, mask=(ms, md))
    assert out.shape == (B, Nd, 6)
    for s in range(B):
        ref = ref_posatt(layer, x[s, :ns[s]], ps[s, :ns[s]], pd[s, :nd[s]], w[s, :ns[s]])
        device.assert_close(out[s, :nd[s]], ref, rtol=0, atol=1e-10)
        assert bool((out[s, nd[s]:] == 0).all())
    # self form: one mask for both sides
    out = device.run(layer.dense, x, ps, w, mask=ms)
    for s in range(B):
        ref = ref_posatt(layer, x[s, :ns[s]], ps[s, :ns[s]], ps[s, :ns[s]], w[s, :ns[s]])
        device.assert_close(out[s, :ns[s]], ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", PATHS)
def test_no_information_crosses_samples(path, device):
    layer = make(path=path)
    sizes = [7, 12, 4]
    x, pos, w, b = sample(sizes)
    out = device.run(layer, x, pos, w, b)
    m = b == 1
    x2, pos2, w2 = x.clone(), pos.clone(), w.clone()
    x2[m] += 5.0
    pos2[m] = torch.rand(int(m.sum()), 2, dtype=DT) * 3
    w2[m] *= 7.0
    out2 = device.run(layer, x2, pos2, w2, b)
    device.assert_close(out2[~m], out[~m], rtol=0, atol=1e-14)
    assert (out2[m] - out[m]).abs().max() > 1e-3


# ------------------------------------------------------------- shared-mesh kernel
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("path", PATHS)
def test_shared_mesh_dense_equals_per_sample(path, cfg, monkeypatch):
    cin, cout, heads = cfg
    layer = make(cin, cout, heads, path)
    B, Ns, Nd = 5, 11, 7
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, Ns, cin, generator=g, dtype=DT)
    ps = torch.rand(Ns, 2, generator=g, dtype=DT)
    pd = torch.rand(Nd, 2, generator=g, dtype=DT)
    w = torch.rand(Ns, generator=g, dtype=DT) + 0.1

    calls = []
    real_kernel, real_sdpa = P._dense_kernel, P.F.scaled_dot_product_attention
    real_fused = PF.fused_attention

    def spy_kernel(*args):
        out = real_kernel(*args)
        calls.append(("kernel", tuple(out.shape)))
        return out

    def spy_sdpa(q, k, v, **kw):
        calls.append(("sdpa", tuple(q.shape)))
        return real_sdpa(q, k, v, **kw)

    def spy_fused(q, k, v, *args, **kw):
        calls.append(("fused", tuple(q.shape)))
        return real_fused(q, k, v, *args, **kw)

    monkeypatch.setattr(P, "_dense_kernel", spy_kernel)
    monkeypatch.setattr(P.F, "scaled_dot_product_attention", spy_sdpa)
    monkeypatch.setattr(PF, "fused_attention", spy_fused)
    out = layer.dense((x, None), (ps, pd), w)
    # the position-only part was evaluated once, for all B samples
    if path == "kernel":
        assert calls == [("kernel", (heads, Nd, Ns))]
    else:
        assert len(calls) == 1 and calls[0][0] == path and calls[0][1][0] == 1
    monkeypatch.undo()
    for s in range(B):
        torch.testing.assert_close(out[s], layer((x[s], None), (ps, pd), w), rtol=0, atol=1e-10)
        torch.testing.assert_close(out[s], ref_posatt(layer, x[s], ps, pd, w), rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", [p for p in PATHS if p != "kernel"])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_sdpa_equals_materialised_far_from_origin(cfg, path):
    """Centring makes the dot-product expansion exact to rounding at offset 1e3."""
    cin, cout, heads = cfg
    lam = (20.0, 200.0)
    sizes, dsizes = [40, 25], [30, 17]
    x, ps, w, bs = sample(sizes, cin, offset=1e3, seed=6)
    _, pd, _, bd = sample(dsizes, cin, offset=1e3, seed=7)
    a = make(cin, cout, heads, "kernel", lam)((x, None), (ps, pd), w, (bs, bd))
    b = make(cin, cout, heads, path, lam)((x, None), (ps, pd), w, (bs, bd))
    torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
    # shared mesh, dense form
    xb = torch.randn(3, 40, cin, dtype=DT)
    a = make(cin, cout, heads, "kernel", lam).dense((xb, None), (ps[:40], pd[:30]), w[:40])
    b = make(cin, cout, heads, path, lam).dense((xb, None), (ps[:40], pd[:30]), w[:40])
    torch.testing.assert_close(b, a, rtol=0, atol=1e-10)


def test_uncentred_expansion_would_fail():
    """Sanity check of the previous test: without centring, the expansion
    2 lam x.y - lam |y|^2 loses ~lam |y|^2 eps, far more than 1e-10."""
    _, ps, w, _ = sample([40], offset=1e3, seed=6)
    _, pd, _, _ = sample([30], offset=1e3, seed=7)
    lam = 200.0
    exact = torch.softmax(-lam * ((pd[:, None] - ps[None]) ** 2).sum(-1) + w.log(), -1)
    naive = torch.softmax(2 * lam * pd @ ps.T - lam * (ps * ps).sum(-1) + w.log(), -1)
    assert (naive - exact).abs().max() > 1e-9


@pytest.mark.parametrize("cfg", CONFIGS)
def test_sdpa_path_uses_the_fused_kernel(cfg):
    """The memory-light path must take PyTorch's fused (flash) kernel, which never
    materialises N_dst x N_src; restricting SDPA to it raises if it cannot be used
    (e.g. unequal head dimensions of q/k and v)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cin, cout, heads = cfg
    layer = make(cin, cout, heads, "sdpa")
    x, ps, w, b = sample([9, 6], cin, seed=20)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        layer(x, ps, w, b).sum().backward()
        layer.dense(x[None, :9].expand(3, -1, -1), ps[:9], w[:9]).sum().backward()
    assert torch.isfinite(layer.lam_raw.grad).all()


def test_sdpa_float32_accuracy():
    """float32 SDPA path against the float64 reference on a mesh far from the
    origin: rounding stays at the level of lam R^2 eps_32, not lam |y|^2 eps_32."""
    cin, cout, heads = 4, 8, 2
    layer = make(cin, cout, heads, "sdpa", lam=(20.0, 200.0))
    x, ps, w, _ = sample([300], cin, offset=1e3, seed=21)
    _, pd, _, _ = sample([50], cin, offset=1e3, seed=22)
    # the reference sees the same (float32-representable) points
    x, ps, pd, w = (t.float().double() for t in (x, ps, pd, w))
    ref = ref_posatt(layer, x, ps, pd, w)
    out = layer.float()((x.float(), None), (ps.float(), pd.float()), w.float())
    assert (out.double() - ref).abs().max() < 2e-5 * ref.abs().max()  # measured 2.5e-6


def test_auto_path_switches_on_size(monkeypatch, fused_kernel_available):
    """Materialised kernel while small; above KERNEL_LIMIT the fused CPU kernel where
    it was built, else SDPA."""
    layer = make(path="auto")
    x, pos, w, _ = sample([30])
    seen = []

    def spy(name):
        real = getattr(PF, name)

        def wrapped(*args, **kw):
            seen.append(name)
            return real(*args, **kw)
        return wrapped

    for name in ("_folded", "fused_attention"):
        monkeypatch.setattr(PF, name, spy(name))
    small = layer(x, pos, w)
    assert not seen
    monkeypatch.setattr(PF, "KERNEL_LIMIT", 100)
    big = layer(x, pos, w)
    assert seen == ["fused_attention" if fused_kernel_available else "_folded"]
    torch.testing.assert_close(big, small, rtol=0, atol=1e-10)


# ---------------------------------------------------------------- precomputed kernel
@pytest.mark.parametrize("cfg", CONFIGS)
def test_precomputed_kernel_shared_across_layers(cfg):
    cin, cout, heads = cfg
    a, b = make(cin, cout, heads, seed=0), make(cin, cout, heads, seed=1)
    with torch.no_grad():
        b.lam_raw.copy_(a.lam_raw)  # equal lambda, different W_V
    sizes, dsizes = [7, 12, 4], [5, 3, 9]
    x, ps, w, bs = sample(sizes, cin, seed=8)
    _, pd, _, bd = sample(dsizes, cin, seed=9)
    K = a.kernel((ps, pd), w, (bs, bd))
    assert K.shape == (3, heads, 9, 12)
    torch.testing.assert_close(K.sum(-1), torch.ones(3, heads, 9, dtype=DT), rtol=0, atol=1e-12)
    for s, n in enumerate(sizes):
        assert bool((K[s, :, :, n:] == 0).all())  # padded sources carry nothing
        torch.testing.assert_close(K[s, :, :dsizes[s], :n], ref_kernel(ps[bs == s], pd[bd == s],
                                   w[bs == s], a.lam), rtol=0, atol=1e-12)
    for layer in (a, b):
        torch.testing.assert_close(layer((x, None), None, None, (bs, bd), kernel=K),
                                   layer((x, None), (ps, pd), w, (bs, bd)), rtol=0, atol=1e-12)
    # one mesh pair, unbatched kernel, dense batch
    K1 = position_kernel(ps[:7], pd[:5], w[:7], a.lam)
    assert K1.shape == (heads, 5, 7)
    xb = torch.randn(4, 7, cin, dtype=DT)
    torch.testing.assert_close(b.dense(xb, None, None, kernel=K1),
                               b.dense((xb, None), (ps[:7], pd[:5]), w[:7]), rtol=0, atol=1e-12)


def test_kernel_shape_mismatch_raises():
    layer = make()
    x, pos, w, _ = sample([6])
    K = layer.kernel(pos, w)
    with pytest.raises(ValueError, match="kernel has shape"):
        layer(x[:5], None, None, kernel=K)
    with pytest.raises(ValueError, match="kernel has shape"):
        layer(x, None, None, kernel=K[:1])


# --------------------------------------------------------------------- properties
@pytest.mark.parametrize("path", PATHS)
def test_permutation_equivariance(path):
    layer = make(path=path)
    x, ps, w, _ = sample([13], seed=10)
    _, pd, _, _ = sample([8], seed=11)
    out = layer((x, None), (ps, pd), w)
    perm_s, perm_d = torch.randperm(13), torch.randperm(8)
    out_s = layer((x[perm_s], None), (ps[perm_s], pd), w[perm_s])
    torch.testing.assert_close(out_s, out, rtol=0, atol=1e-12)
    out_d = layer((x, None), (ps, pd[perm_d]), w)
    torch.testing.assert_close(out_d, out[perm_d], rtol=0, atol=1e-12)
    self_out = layer(x, ps, w)
    torch.testing.assert_close(layer(x[perm_s], ps[perm_s], w[perm_s]), self_out[perm_s],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("path", PATHS)
def test_duplicated_points_with_halved_weights(path):
    """Quadrature property: the layer sees the rule, not the point count."""
    layer = make(path=path)
    x, ps, w, _ = sample([15], seed=12)
    _, pd, _, _ = sample([9], seed=13)
    out = layer((x, None), (ps, pd), w)
    out2 = layer((torch.cat([x, x]), None), (torch.cat([ps, ps]), pd), torch.cat([w, w]) / 2)
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-12)
    # self-attention on the original mesh as destination
    out = layer(x, ps, w)
    out2 = layer((torch.cat([x, x]), None), (torch.cat([ps, ps]), ps), torch.cat([w, w]) / 2)
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-12)
    # duplicate only some points: halving their weights keeps the output, keeping
    # the weights (what an unweighted softmax does) does not
    idx = torch.tensor([0, 3, 4, 9])
    w_half = w.clone()
    w_half[idx] /= 2
    xs, pss = torch.cat([x, x[idx]]), torch.cat([ps, ps[idx]])
    out = layer((x, None), (ps, pd), w)
    torch.testing.assert_close(layer((xs, None), (pss, pd), torch.cat([w_half, w_half[idx]])),
                               out, rtol=0, atol=1e-12)
    naive = layer((xs, None), (pss, pd), torch.cat([w, w[idx]]))
    assert (naive - out).abs().max() > 1e-3


@pytest.mark.parametrize("path", PATHS)
def test_zero_weight_points_drop_out_and_gradients_stay_finite(path):
    layer = make(path=path)
    x, ps, w, _ = sample([12], seed=14)
    _, pd, _, _ = sample([5], seed=15)
    w0 = w.clone()
    w0[[1, 4, 7]] = 0
    keep = w0 > 0
    out = layer((x, None), (ps, pd), w0)
    torch.testing.assert_close(out, layer((x[keep], None), (ps[keep], pd), w[keep]),
                               rtol=0, atol=1e-12)
    out.square().sum().backward()
    assert torch.isfinite(layer.lam_raw.grad).all() and bool((layer.lam_raw.grad != 0).all())
    assert torch.isfinite(layer.lin.weight.grad).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cfg", [(3, 4, 2), (1, 4, 2)])
def test_gradcheck_layer(path, cfg, device64):
    cin, cout, heads = cfg
    layer = device64.module(make(cin, cout, heads, path))
    x, ps, w, b = device64.to(sample([4, 3], cin, seed=16))
    _, pd, _, bd = device64.to(sample([3, 2], cin, seed=17))
    params = dict(layer.named_parameters())

    def f(x, lam_raw, ps, pd):
        return functional_call(layer, {**params, "lam_raw": lam_raw},
                               ((x, None), (ps, pd), w, (b, bd)))

    inputs = (x.requires_grad_(), params["lam_raw"].detach().clone().requires_grad_(),
              ps.requires_grad_(), pd.requires_grad_())
    assert torch.autograd.gradcheck(f, inputs)


def test_gradcheck_position_kernel():
    _, ps, w, _ = sample([5], seed=18)
    _, pd, _, _ = sample([4], seed=19)
    lam = torch.tensor([0.7, 4.0], dtype=DT, requires_grad=True)
    inputs = (ps.requires_grad_(), pd.requires_grad_(), w.requires_grad_(), lam)
    assert torch.autograd.gradcheck(lambda a, b, c, d: position_kernel(a, b, c, d), inputs)


def test_lambda_is_positive_per_head_parameter():
    layer = PositionAttention(4, 8, heads=4, lam_init=[0.01, 1.0, 30.0, 1e3])
    torch.testing.assert_close(layer.lam, torch.tensor([0.01, 1.0, 30.0, 1e3]), rtol=1e-5,
                               atol=0)
    with torch.no_grad():
        layer.lam_raw.fill_(-50.0)
    assert bool((layer.lam > 0).all())
    layer.reset_parameters()
    torch.testing.assert_close(layer.lam[2], torch.tensor(30.0), rtol=1e-5, atol=0)


def test_heads_have_independent_lambdas():
    """Head h uses lam_h on its own channel slice: changing lam_1 leaves head 0."""
    layer = make(4, 4, 2)
    x, pos, w, _ = sample([10], 4)
    out = layer(x, pos, w)
    with torch.no_grad():
        layer.lam_raw[1] += 2.0
    out2 = layer(x, pos, w)
    torch.testing.assert_close(out2[:, :2], out[:, :2], rtol=0, atol=0)
    assert (out2[:, 2:] - out[:, 2:]).abs().max() > 1e-4


# ------------------------------------------------------------------------ errors
def test_invalid_arguments():
    with pytest.raises(ValueError, match="not divisible by heads"):
        PositionAttention(4, 6, heads=4)
    with pytest.raises(ValueError, match="lam_init must be finite and positive"):
        PositionAttention(4, 4, lam_init=0.0)
    with pytest.raises(ValueError, match="lam_init has 1 values but heads=2"):
        PositionAttention(4, 4, heads=2, lam_init=[1.0])
    with pytest.raises(ValueError, match="impl must be one of"):
        PositionAttention(4, impl="fast")
    with pytest.raises(ValueError, match="lam must be finite and positive"):
        position_kernel(torch.rand(3, 2), torch.rand(2, 2), torch.ones(3), torch.tensor([-1.0]))

    layer = make()
    x, pos, w, b = sample([6, 5])
    with pytest.raises(ValueError, match="weight has shape"):
        layer(x, pos, w[:-1], b)
    bad = w.clone()
    bad[3] = -1.0
    with pytest.raises(ValueError, match="non-negative; entry 3"):
        layer(x, pos, bad, b)
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        layer(x, pos, bad, b)
    with pytest.raises(ValueError, match="pos_src has 10 rows, expected 11"):
        layer(x, pos[:-1], w, b)
    with pytest.raises(ValueError, match="different dimensions"):
        layer((x, None), (pos, torch.rand(4, 3, dtype=DT)), w)
    with pytest.raises(ValueError, match="channels, expected 5"):
        layer(x[:, :4], pos, w, b)
    with pytest.raises(ValueError, match="both be given"):
        layer((x, None), (pos, pos), w, (b, None))
    zero = w.clone()
    zero[b == 1] = 0
    with pytest.raises(ValueError, match="sample 1 has destination points but no source"):
        layer(x, pos, zero, b)
    with pytest.raises(ValueError, match="weight must be"):
        layer.dense(x[None], pos, w[None, None])
    with pytest.raises(ValueError, match="inconsistent batch sizes"):
        layer.dense(x[None].expand(2, -1, -1), pos, w[None].expand(3, -1))


def test_repr():
    assert repr(PositionAttention(16, 32, heads=4)) == "PositionAttention(16, 32, heads=4)"


@pytest.mark.parametrize("path", [p for p in PATHS if p != "kernel"])
def test_empty_batch_on_a_shared_mesh(path):
    layer = make(3, 8, 2, path)
    g = torch.Generator().manual_seed(3)
    pos = torch.rand(50, 2, generator=g, dtype=DT)
    w = torch.rand(50, generator=g, dtype=DT) + 0.1
    out = layer.dense((torch.randn(0, 50, 3, dtype=DT), None), (pos, pos[:20]), w)
    assert out.shape == (0, 20, 8)


@pytest.mark.parametrize("path", PATHS + ["auto"])
def test_empty_inputs_give_empty_outputs_and_gradients(path):
    """No points (flat, with and without a batch vector; dense, batched and on a shared
    mesh; cross with no destination points) gives an empty output of width C_out as
    the other layers do, and backward through its (empty) sum works."""
    layer = make(3, 8, 2, path)
    x = torch.randn(0, 3, dtype=DT, requires_grad=True)
    pos = torch.rand(0, 2, dtype=DT, requires_grad=True)
    w = torch.rand(0, dtype=DT)
    for batch in (None, torch.zeros(0, dtype=torch.long)):
        out = layer(x, pos, w, batch)
        assert out.shape == (0, 8) and out.dtype == DT
        out.sum().backward()
        assert x.grad.shape == (0, 3) and pos.grad.shape == (0, 2)
        assert bool((layer.lam_raw.grad == 0).all())
        layer.zero_grad()
    X = torch.randn(2, 0, 3, dtype=DT, requires_grad=True)
    for p, wd in ((pos.detach()[None].expand(2, 0, 2), torch.rand(2, 0, dtype=DT)),
                  (pos.detach(), w)):  # batched positions, and one mesh shared by the batch
        out = layer.dense(X, p, wd)
        assert out.shape == (2, 0, 8)
        out.sum().backward()
        assert X.grad.shape == (2, 0, 3)
    # cross-attention onto no destination points: the source gets zero gradients
    g = torch.Generator().manual_seed(5)
    xs = torch.randn(6, 3, dtype=DT, generator=g).requires_grad_()
    ps = torch.rand(6, 2, dtype=DT, generator=g)
    ws = torch.rand(6, dtype=DT, generator=g) + 0.1
    for b in (None, (torch.zeros(6, dtype=torch.long), torch.zeros(0, dtype=torch.long))):
        out = layer((xs, None), (ps, pos.detach()), ws, b)
        assert out.shape == (0, 8)
        out.sum().backward()
        assert bool((xs.grad == 0).all())
        xs.grad = None
    assert position_kernel(pos, pos, w, [1.0, 2.0]).shape == (2, 0, 0)
    assert position_kernel(ps, pos, ws, [1.0, 2.0]).shape == (2, 0, 6)


def test_empty_source_with_destination_points_is_an_error():
    """The softmax over no source points is 0/0: refused, naming the sample, rather
    than an IndexError from the reduction over an empty dimension."""
    layer = make(3, 8, 2)
    pd = torch.rand(4, 2, dtype=DT)
    empty = (torch.randn(0, 3, dtype=DT), torch.rand(0, 2, dtype=DT), torch.rand(0, dtype=DT))
    with pytest.raises(ValueError, match="sample 0 has destination points but no source"):
        layer((empty[0], None), (empty[1], pd), empty[2])
    with pytest.raises(ValueError, match="sample 0 has destination points but no source"):
        layer.dense((empty[0][None], None), (empty[1], pd), empty[2])
    with pytest.raises(ValueError, match="sample 0 has destination points but no source"):
        position_kernel(empty[1], pd, empty[2], 1.0)


def test_position_kernel_of_a_one_sample_batch_is_the_unbatched_kernel():
    # a one-sample batch has no padding layout (no mask): the kernel must not need one
    g = torch.Generator().manual_seed(11)
    p = torch.rand(10, 2, generator=g, dtype=torch.float64)
    w = torch.rand(10, generator=g, dtype=torch.float64)
    batched = position_kernel(p, p, w, 1.0, batch=torch.zeros(10, dtype=torch.long))
    torch.testing.assert_close(batched[0], position_kernel(p, p, w, 1.0), rtol=0, atol=0)
