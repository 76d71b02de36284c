"""Tests for meshops.nn.patch: windowed and patch-token continuum attention."""

import math

import pytest
import torch
from torch.autograd import gradcheck

import meshops.nn.patch as patch_mod
from meshops.nn.patch import (
    PatchAttention,
    PatchTokenAttention,
    WindowAttention,
    patch_attention,
    rotate_positions,
)

DT = torch.float64


def _sample(n, c, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, d, generator=g, dtype=DT)
    x = torch.randn(n, c, generator=g, dtype=DT)
    w = torch.rand(n, generator=g, dtype=DT) + 0.1
    return x, pos, w


def _batch(sizes, c, d=2, seed=0):
    xs, ps, ws = zip(*(_sample(n, c, d, seed + i) for i, n in enumerate(sizes)))
    batch = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    return torch.cat(xs), torch.cat(ps), torch.cat(ws), batch


def _layer(cls, *args, **kwargs):
    torch.manual_seed(kwargs.pop("seed", 0))
    return cls(*args, **kwargs).to(DT)


def _groups(parts, batch):
    """Index sets of the patches, one list per sample (reference bookkeeping)."""
    out = []
    for b in torch.unique(batch):
        ids = [torch.nonzero((batch == b) & (parts == p)).flatten()
               for p in torch.unique(parts[batch == b])]
        out.append([i for i in ids if i.numel()])
    return out


def _heads(t, h):
    return t.view(t.shape[0], h, -1)


# ----------------------------------------------------------------------------- references
def ref_window(layer, x, w, parts, batch):
    H = layer.heads
    q, k, v = (_heads(t, H) for t in layer.lin_qkv(x).chunk(3, dim=-1))
    dh = q.shape[-1]
    out = torch.zeros_like(q)
    for sample in _groups(parts, batch):
        for idx in sample:
            for h in range(H):
                s = q[idx, h] @ k[idx, h].T / math.sqrt(dh)
                a = w[idx][None, :] * torch.exp(s - s.max(1, keepdim=True).values)
                out[idx, h] = (a / a.sum(1, keepdim=True)) @ v[idx, h]
    return layer.lin_out(out.reshape(x.shape[0], -1))


def ref_token(layer, x, pos, w, parts, batch):
    H, M = layer.heads, layer.num_basis
    y = torch.zeros(x.shape[0], layer.out_channels, dtype=x.dtype)
    u = x @ layer.lin_in.weight.T
    for sample in _groups(parts, batch):
        tokens, meas, xis = [], [], []
        for idx in sample:
            m = w[idx].sum()
            c = (w[idx, None] * pos[idx]).sum(0) / m
            s = torch.sqrt((w[idx] * ((pos[idx] - c) ** 2).sum(1)).sum() / m)
            xi = (pos[idx] - c) / s
            gm = layer.g(xi)
            t = torch.zeros(M, u.shape[1], dtype=x.dtype)
            for a, i in enumerate(idx):           # explicit quadrature over patch members
                t += w[i] * gm[a][:, None] * u[i][None, :]
            tokens.append(layer.embed((t / m).reshape(-1)))
            meas.append(m)
            xis.append(xi)
        T, meas = torch.stack(tokens), torch.stack(meas)
        q, k, v = (_heads(z, H) for z in layer.lin_qkv(T).chunk(3, dim=-1))
        o = torch.zeros_like(q)
        for h in range(H):
            s = q[:, h] @ k[:, h].T / math.sqrt(q.shape[-1])
            a = meas[None, :] * torch.exp(s)
            o[:, h] = (a / a.sum(1, keepdim=True)) @ v[:, h]
        coeff = layer.lin_out(o.reshape(len(sample), -1)).view(len(sample), M, -1)
        for p, idx in enumerate(sample):
            y[idx] = layer.h(xis[p]) @ coeff[p]
    return y


# ----------------------------------------------------------------------------- front
def test_front_dispatch_and_repr():
    a = patch_attention(8, heads=2, num_patches=4)
    b = patch_attention(8, heads=2, num_patches=4, mode="token", num_basis=3)
    assert type(a) is WindowAttention and type(b) is PatchTokenAttention
    assert isinstance(a, PatchAttention) and isinstance(b, PatchAttention)
    assert "num_patches=4" in repr(a) and "num_basis=3" in repr(b)


# ----------------------------------------------------------------------------- windowed
def test_window_matches_reference(device):
    x, pos, w, batch = _batch([70, 45], 8)
    layer = _layer(WindowAttention, 8, 6, heads=2, num_patches=5)
    parts = layer.partition(pos, batch)
    out = device.run(layer, x, pos, w, batch)
    ref = ref_window(layer, x, w, parts, batch)
    assert out.shape == (115, 6)
    device.assert_close(out, ref, atol=1e-10, rtol=0)


def test_window_one_patch_is_global_attention():
    x, pos, w, batch = _batch([30, 20], 4)
    layer = _layer(WindowAttention, 4, heads=2, num_patches=1)
    out = layer(x, pos, w, batch)
    q, k, v = (_heads(t, 2) for t in layer.lin_qkv(x).chunk(3, dim=-1))
    ref = torch.zeros_like(q)
    for b in range(2):
        idx = torch.nonzero(batch == b).flatten()
        s = torch.einsum("ihd,jhd->hij", q[idx], k[idx]) / math.sqrt(2)
        a = torch.softmax(s + torch.log(w[idx]), dim=-1)
        ref[idx] = torch.einsum("hij,jhd->ihd", a, v[idx])
    assert torch.allclose(out, layer.lin_out(ref.reshape(50, 4)), atol=1e-12, rtol=0)


def _dependency(f, x):
    """[N, N] boolean: output point i depends on input point j (exact zeros of the Jacobian).

    Output channels are contracted with generic coefficients (one backward pass per point).
    """
    r = torch.linspace(1.0, 2.0, f(x).shape[1], dtype=x.dtype)
    jac = torch.autograd.functional.jacobian(lambda z: f(z) @ r, x)     # [N, N, C_in]
    return (jac != 0).any(2)


def test_window_locality_and_shift_crosses_borders():
    x, pos, w = _sample(48, 4, seed=3)
    l0 = _layer(WindowAttention, 4, heads=2, num_patches=4, seed=1)
    l1 = _layer(WindowAttention, 4, heads=2, num_patches=4, shift=True, seed=2)
    p0, p1 = l0.partition(pos), l1.partition(pos)
    same0 = p0[:, None] == p0[None, :]
    same1 = p1[:, None] == p1[None, :]
    # one layer: a point depends on exactly the points of its own patch
    assert torch.equal(_dependency(lambda z: l0(z, pos, w), x), same0)
    # two layers with the same partition: still confined to the patch
    assert torch.equal(_dependency(lambda z: l0(l0(z, pos, w), pos, w), x), same0)
    # alternate partition: dependencies reach other patches (patch_1 ∘ patch_0 reachability)
    dep = _dependency(lambda z: l1(l0(z, pos, w), pos, w), x)
    reach = (same1.double() @ same0.double()) > 0
    assert torch.equal(dep, reach)
    assert (dep & ~same0).sum() > 0.2 * dep.numel()


@pytest.mark.parametrize("d,method", [(1, "kd"), (2, "voxel"), (3, "kd"), (2, "kmeans")])
def test_shifted_partition_crosses_borders(d, method):
    _, pos, _ = _sample(200, 1, d=d, seed=d)
    a = WindowAttention(4, num_patches=4, method=method).partition(pos)
    b = WindowAttention(4, num_patches=4, method=method, shift=True).partition(pos)
    # some pair of points shares a patch in one partition but not in the other
    assert ((a[:, None] == a[None, :]) & (b[:, None] != b[None, :])).any()
    assert len(torch.unique(b)) >= 3
    # the rotation is orthogonal (distances preserved)
    rot = rotate_positions(torch.eye(d, dtype=DT))
    assert torch.allclose(rot @ rot.T, torch.eye(d, dtype=DT), atol=1e-14)


def test_window_tensor_sizes_scale_like_n_squared_over_p(monkeypatch):
    seen = []

    real = patch_mod.weighted_attention

    def spy(q, k, v, log_w):
        seen.append((tuple(q.shape), tuple(log_w.shape)))
        return real(q, k, v, log_w)

    monkeypatch.setattr(patch_mod, "weighted_attention", spy)
    N, P = 4096, 64
    x, pos, w = _sample(N, 8, seed=5)
    layer = WindowAttention(8, heads=2, num_patches=P).to(DT)
    with torch.no_grad():
        layer(x, pos, w)
    (G, H, n, dh), mshape = seen[-1]
    assert (G, H, dh) == (P, 2, 4)
    assert mshape == (G, n)                            # a weight per key, no [n, n] mask
    assert n <= 1.25 * N / P                           # balanced windows
    assert G * n * n <= 1.25 * N * N / P               # attention scores O(N·N/P), not N²


def test_degenerate_patches_are_finite():
    """A zero-measure patch and a one-point patch give finite outputs and gradients."""
    x, pos, w = _sample(40, 4, seed=6)
    parts = (pos[:, 0] > 0.5).long()
    parts[7] = 2                                        # a one-point patch
    w = torch.where(parts == 1, torch.zeros_like(w), w)
    for cls in (WindowAttention, PatchTokenAttention):
        layer = _layer(cls, 4, num_patches=3)
        xr, pr = x.clone().requires_grad_(), pos.clone().requires_grad_()
        out = layer(xr, pr, w, parts=parts)
        (out ** 2).sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(xr.grad).all(), cls
        if cls is PatchTokenAttention:      # positions only matter through ξ there
            assert torch.isfinite(pr.grad).all()
    # windowed attention over a single point returns its own value
    win = _layer(WindowAttention, 4, num_patches=3)
    v_7 = win.lin_qkv(x[7:8]).chunk(3, dim=-1)[2]
    assert torch.allclose(win(x, pos, w, parts=parts)[7:8], win.lin_out(v_7), atol=1e-14)


# ----------------------------------------------------------------------------- token
def test_token_matches_reference(device):
    x, pos, w, batch = _batch([50, 33, 41], 6)
    layer = _layer(PatchTokenAttention, 6, 5, heads=2, num_patches=6, num_basis=4,
                   token_channels=3, embed_dim=8, hidden=7)
    parts = layer.partition(pos, batch)
    layer(x, pos, w, batch)     # materialise the lazy basis MLPs before copying the layer
    out = device.run(layer, x, pos, w, batch)
    ref = ref_token(layer, x, pos, w, parts, batch)
    assert out.shape == (124, 5)
    device.assert_close(out, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("mode", ["window", "token"])
def test_batched_samples_do_not_mix(mode, device):
    x, pos, w, batch = _batch([37, 52], 4)
    layer = _layer(patch_attention, 4, heads=2, num_patches=5, mode=mode)
    layer(x, pos, w, batch)     # materialise lazy basis MLPs (token) before copying
    layer = device.module(layer)
    out = device.run(layer, x, pos, w, batch)
    a, b = batch == 0, batch == 1
    device.assert_close(out[a], device.run(layer, x[a], pos[a], w[a]), atol=1e-12, rtol=0)
    device.assert_close(out[b], device.run(layer, x[b], pos[b], w[b]), atol=1e-12, rtol=0)
    # part ids that repeat across samples (0..P-1 in each) still keep samples apart
    local = torch.cat([layer.partition(device.to(pos[a]), None),
                       layer.partition(device.to(pos[b]), None)])
    device.assert_close(device.run(layer, x, pos, w, batch, parts=local), out, atol=1e-12,
                        rtol=0)


@pytest.mark.parametrize("mode", ["window", "token"])
def test_partition_covers_and_balances(mode):
    x, pos, w, batch = _batch([100, 61], 4)
    layer = patch_attention(4, num_patches=8, mode=mode)
    parts = layer.partition(pos, batch)
    assert parts.shape == (161,) and parts.dtype == torch.long and (parts >= 0).all()
    for b in range(2):
        counts = torch.unique(parts[batch == b], return_counts=True)[1]
        assert len(counts) == 8 and counts.sum() == (batch == b).sum()
        assert counts.max() - counts.min() <= 1


def test_sample_smaller_than_num_patches():
    x, pos, w, batch = _batch([40, 5], 4)
    layer = _layer(WindowAttention, 4, num_patches=8)
    parts = layer.partition(pos, batch)
    assert len(torch.unique(parts[batch == 1])) == 5        # one patch per point
    assert len(torch.unique(parts[batch == 0])) == 8
    out = layer(x, pos, w, batch)
    v = layer.lin_qkv(x[batch == 1]).chunk(3, dim=-1)[2]
    assert torch.allclose(out[batch == 1], layer.lin_out(v), atol=1e-14)


@pytest.mark.parametrize("mode", ["window", "token"])
@pytest.mark.parametrize("shift", [False, True])
def test_patch_size_gives_patches_of_bounded_size_per_sample(mode, shift):
    # Samples of 300, 97 and 64 points with patch_size 32: ceil(n / 32) = 10, 4, 2
    # balanced k-d patches (one more in the alternate partition only without a rotation,
    # which d = 2 has), i.e. at most 32 points per patch; ids never shared by samples.
    x, pos, w, batch = _batch([300, 97, 64], 4)
    layer = _layer(patch_attention, 4, heads=2, patch_size=32, mode=mode, shift=shift)
    parts = layer.partition(pos, batch)
    for b, want in enumerate([10, 4, 2]):
        ids, counts = torch.unique(parts[batch == b], return_counts=True)
        assert len(ids) == want and counts.max() <= 32 and counts.max() - counts.min() <= 1
        assert not set(ids.tolist()) & set(parts[batch != b].tolist())
    # Same numbers as the layer with num_patches = ceil(n / 32), sample by sample.
    out = layer(x, pos, w, batch)
    for b, want in enumerate([10, 4, 2]):
        fixed = _layer(patch_attention, 4, heads=2, num_patches=want, mode=mode, shift=shift)
        fixed.load_state_dict(layer.state_dict())
        m = batch == b
        assert torch.allclose(out[m], fixed(x[m], pos[m], w[m]), atol=1e-12, rtol=0)
    assert "patch_size=32" in repr(layer)


@pytest.mark.parametrize("mode", ["window", "token"])
def test_patch_size_with_extra_patch_and_equal_samples(mode):
    # d = 1 has no rotation: the alternate partition takes one patch more,
    # ceil(50/16) + 1 = 5; a 1-point sample gets one patch, not 2.
    x, pos, w, batch = _batch([50, 1], 4, d=1)
    layer = _layer(patch_attention, 4, heads=2, patch_size=16, mode=mode, shift=True)
    parts = layer.partition(pos, batch)
    assert len(torch.unique(parts[batch == 0])) == 5 and len(torch.unique(parts[batch == 1])) == 1
    out = layer(x, pos, w, batch)
    for b in range(2):
        m = batch == b
        assert torch.allclose(out[m], layer(x[m], pos[m], w[m]), atol=1e-12, rtol=0)
    # Samples of equal size share one patch count and take the batched path.
    x, pos, w, batch = _batch([64, 64], 4)
    parts = _layer(patch_attention, 4, patch_size=16, mode=mode).partition(pos, batch)
    for b in range(2):
        counts = torch.unique(parts[batch == b], return_counts=True)[1]
        assert counts.tolist() == [16] * 4
    assert len(torch.unique(parts)) == 8


@pytest.mark.parametrize("kw", [dict(num_patches=4), dict(patch_size=10)])
def test_partition_with_an_empty_sample_and_empty_input(kw):
    # A fully masked row of ``dense`` is a sample without points in the middle.
    _, pos, _, batch = _batch([40, 40], 4)
    batch = torch.where(batch == 1, 2, batch)
    parts = WindowAttention(4, **kw).partition(pos, batch)
    for b in (0, 2):                            # 4 patches: num_patches, or ceil(40 / 10)
        counts = torch.unique(parts[batch == b], return_counts=True)[1]
        assert len(counts) == 4 and counts.sum() == 40
    assert not set(parts[batch == 0].tolist()) & set(parts[batch == 2].tolist())
    assert WindowAttention(4, **kw).partition(pos[:0]).shape == (0,)


def test_patch_size_invalid():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="patch_size must be None or an integer >= 1"):
            WindowAttention(4, patch_size=bad)


# ----------------------------------------------------------------------------- shared properties
@pytest.mark.parametrize("mode", ["window", "token"])
def test_duplicating_points_with_half_weight_is_invariant(mode):
    x, pos, w, batch = _batch([45, 30], 4)
    layer = _layer(patch_attention, 4, heads=2, num_patches=4, mode=mode)
    parts = layer.partition(pos, batch)
    out = layer(x, pos, w, batch, parts=parts)
    dup = lambda t: torch.repeat_interleave(t, 2, dim=0)   # noqa: E731  (keeps batch sorted)
    out2 = layer(dup(x), dup(pos), dup(w) / 2, dup(batch), parts=dup(parts))
    assert torch.allclose(out2[::2], out, atol=1e-12, rtol=0)
    assert torch.allclose(out2[1::2], out, atol=1e-12, rtol=0)


@pytest.mark.parametrize("mode", ["window", "token"])
def test_permutation_equivariance(mode):
    x, pos, w = _sample(150, 4, seed=9)
    layer = _layer(patch_attention, 4, heads=2, num_patches=6, mode=mode)
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(1))
    out = layer(x, pos, w)
    assert torch.allclose(layer(x[perm], pos[perm], w[perm]), out[perm], atol=1e-12, rtol=0)
    parts = layer.partition(pos)
    assert torch.equal(layer.partition(pos[perm]), parts[perm])


def test_dense_form_matches_flat():
    x, pos, w, batch = _batch([20, 13], 4)
    for mode in ("window", "token"):
        layer = _layer(patch_attention, 4, num_patches=3, mode=mode)
        flat = layer(x, pos, w, batch)
        from torch_geometric.utils import to_dense_batch
        xd, mask = to_dense_batch(x, batch)
        pd, _ = to_dense_batch(pos, batch)
        wd, _ = to_dense_batch(w, batch)
        out = layer.dense(xd, pd, wd, mask)
        assert torch.allclose(out[mask], flat, atol=1e-12, rtol=0)
        assert (out[~mask] == 0).all()


def test_gradcheck(device64):
    x, pos, w, batch = device64.to(_batch([7, 5], 4, seed=2))
    win = device64.module(_layer(WindowAttention, 4, heads=2, num_patches=3))
    parts = win.partition(pos, batch)
    tok = device64.module(_layer(PatchTokenAttention, 4, 3, heads=2, num_patches=3,
                                 num_basis=3, hidden=5))
    tok(x, pos, w, batch)   # materialise the lazy basis MLPs
    xr, pr, wr = (t.clone().requires_grad_() for t in (x, pos, w))
    assert gradcheck(lambda a, c: win(a, pos, c, batch, parts=parts), (xr, wr), fast_mode=True)
    assert gradcheck(lambda a, b, c: tok(a, b, c, batch, parts=parts), (xr, pr, wr),
                     fast_mode=True)


def test_invalid_arguments():
    x, pos, w = _sample(10, 4)
    with pytest.raises(ValueError, match="divisible by heads"):
        WindowAttention(6, heads=4)
    with pytest.raises(ValueError, match="divisible by heads"):
        PatchTokenAttention(4, heads=3, embed_dim=8)
    with pytest.raises(ValueError, match="num_patches"):
        patch_attention(4, num_patches=0)
    with pytest.raises(ValueError, match="mode"):
        patch_attention(4, mode="global")
    for mode in ("window", "token"):
        layer = patch_attention(4, num_patches=2, mode=mode).to(DT)
        with pytest.raises(ValueError, match="non-negative"):
            layer(x, pos, -w)
        with pytest.raises(ValueError, match="weight has shape"):
            layer(x, pos, w[:-1])
        with pytest.raises(ValueError, match="pos"):
            layer(x, pos[:-1], w)
        with pytest.raises(ValueError, match=r"x must have shape \[N, 4\]"):
            layer(x[:, :3], pos, w)
        with pytest.raises(ValueError, match="parts"):
            layer(x, pos, w, parts=-torch.ones(10, dtype=torch.long))
        with pytest.raises(ValueError, match="batch must be sorted"):
            layer(x, pos, w, batch=torch.tensor([1] * 5 + [0] * 5))
