"""The layer contract of meshops.nn (issue 14, items 1, 2 and 4): one attention
primitive, one validated point set, one keyword and one default across layers, and
no old names left (0.1.0 was never released: no deprecation shims)."""

import inspect
import math

import pytest
import torch

from meshops.nn import (
    ContinuumAttention,
    FourierAttention,
    GalerkinAttention,
    LocalAttention,
    LocalPositionAttention,
    PatchTokenAttention,
    PositionAttention,
    TransformerBlock,
    WindowAttention,
    batch_points,
    patch_attention,
    weighted_attention,
)
from meshops.nn.functional import choose_impl

DT = torch.float64


def _qkv(B=2, H=3, nq=5, nk=7, e=4, c=4, k_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, nq, e, generator=g, dtype=DT)
    k = torch.randn(B, k_heads or H, nk, e, generator=g, dtype=DT)
    v = torch.randn(B, k_heads or H, nk, c, generator=g, dtype=DT)
    w = torch.rand(B, nk, generator=g, dtype=DT) + 0.1
    w[0, 2] = 0.0                                     # an excluded key
    return q, k, v, w


def _reference(q, k, v, w, scale):
    """sum_j w_j exp(s q.k_j) v_j / sum_j w_j exp(s q.k_j), written out per entry."""
    B, H, nq, _ = q.shape
    out = torch.zeros(B, H, nq, v.shape[-1], dtype=DT)
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, min(h, k.shape[1] - 1)], v[b, min(h, v.shape[1] - 1)]
            for i in range(nq):
                a = w[b] * torch.exp(scale * (kh @ q[b, h, i]))
                out[b, h, i] = (a[:, None] * vh).sum(0) / a.sum()
    return out


@pytest.mark.parametrize("impl", ["auto", "fused", "sdpa", "fold", "naive"])
@pytest.mark.parametrize("shared_keys", [False, True])
def test_weighted_attention_is_the_weighted_softmax(impl, shared_keys, fused_kernel_available):
    if impl == "fused" and not fused_kernel_available:
        pytest.skip("fused kernel not built")
    q, k, v, w = _qkv(k_heads=1 if shared_keys else None, c=6 if shared_keys else 4)
    logw = torch.log(w)
    for scale in (None, 0.7):
        s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        out = weighted_attention(q, k, v, logw, scale=scale, impl=impl)
        torch.testing.assert_close(out, _reference(q, k, v, w, s), rtol=0, atol=1e-12)


def test_weighted_attention_gradient_through_the_weights():
    """The fold path (SDPA when log w requires grad) differentiates through w as the
    explicit softmax does, and gives 0 (not NaN) at a zero weight."""
    q, k, v, w = _qkv()
    grads = {}
    for impl in ("sdpa", "naive"):
        lw = w.clone().requires_grad_()
        logw = torch.log(torch.where(lw > 0, lw, torch.ones_like(lw))).masked_fill(lw == 0,
                                                                                 float("-inf"))
        assert choose_impl(q, k, v, logw, impl) == ("fold" if impl == "sdpa" else "naive")
        weighted_attention(q, k, v, logw, impl=impl).square().sum().backward()
        grads[impl] = lw.grad
    assert torch.isfinite(grads["sdpa"]).all()
    torch.testing.assert_close(grads["sdpa"], grads["naive"], rtol=0, atol=1e-12)


def test_weighted_attention_rejects_bad_impl_and_fused_dropout():
    q, k, v, w = _qkv()
    with pytest.raises(ValueError, match="impl must be one of"):
        weighted_attention(q, k, v, w.log(), impl="flash")
    with pytest.raises(ValueError, match="no attention dropout"):
        weighted_attention(q, k, v, w.log(), impl="fused", dropout_p=0.5)


# ------------------------------------------------------------------ validated points
def test_one_sample_has_no_padding_layout():
    # A batch of one sample (what the training loop passes at batch size 1, with PyG's
    # batch vector of zeros) has no padding: its dense form is a view, with no index
    # copy and no mask for the layers to apply.
    pos, w = torch.rand(9, 2), torch.rand(9)
    pts = batch_points(pos, w, torch.zeros(9, dtype=torch.long))
    assert pts.index is None and pts.mask is None and pts.max_points == 9
    x = torch.randn(9, 3)
    dense = pts.to_dense(x)
    assert dense.shape == (1, 9, 3) and dense.data_ptr() == x.data_ptr()
    assert pts.to_flat(dense).data_ptr() == x.data_ptr()
    two = batch_points(pos, w, torch.tensor([0] * 4 + [1] * 5))
    assert two.mask.shape == (2, 5) and int(two.mask.sum()) == 9


def test_batch_points_validates_once_and_layers_trust_it():
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(9, 2, generator=g, dtype=DT)
    w = torch.rand(9, generator=g, dtype=DT) + 0.1
    batch = torch.tensor([0] * 4 + [1] * 5)
    x = torch.randn(9, 8, generator=g, dtype=DT)
    pts = batch_points(pos, w, batch)
    assert (pts.num_graphs, pts.max_points) == (2, 5)
    # the dense layout round-trips and pads with zeros
    dense = pts.to_dense(x)
    assert dense.shape == (2, 5, 8) and torch.equal(dense[0, 4], torch.zeros(8, dtype=DT))
    assert torch.equal(pts.to_flat(dense), x)
    layer = ContinuumAttention(8, heads=2).to(DT)
    torch.testing.assert_close(layer(x, pts), layer(x, pos, w, batch), rtol=0, atol=0)
    block = TransformerBlock(layer, 8).to(DT)
    torch.testing.assert_close(block(x, pts), block(x, pos, w, batch), rtol=0, atol=0)
    with pytest.raises(ValueError, match="sorted"):
        batch_points(pos, w, batch.flip(0))
    with pytest.raises(ValueError, match="non-negative"):
        batch_points(pos, -w, batch)
    with pytest.raises(ValueError, match="batch_points"):
        layer(x, pts, w)                          # weight beside a Points: ambiguous
    with pytest.raises(ValueError, match="the Points hold"):
        layer(x[:5], pts)


# ------------------------------------------------------------------ names and defaults
LAYERS = [ContinuumAttention, GalerkinAttention, FourierAttention, PositionAttention,
          LocalPositionAttention, LocalAttention, WindowAttention, PatchTokenAttention]


@pytest.mark.parametrize("cls", LAYERS)
def test_one_signature_convention(cls):
    params = inspect.signature(cls).parameters
    assert list(params)[:2] == ["in_channels", "out_channels"]
    assert params["heads"].default == 4


def test_patch_attention_is_a_plain_factory():
    params = inspect.signature(patch_attention).parameters
    assert list(params)[:3] == ["in_channels", "out_channels", "mode"]
    assert type(patch_attention(8, mode="window")) is WindowAttention
    assert type(patch_attention(8, 4, mode="token", num_basis=3)) is PatchTokenAttention
    with pytest.raises(ValueError, match="mode must be one of"):
        patch_attention(8, mode="global")


def test_one_initialisation_scheme():
    """Glorot weights and zero biases for the projections (Galerkin keeps its paper's
    init): a bias is exactly zero and the weights lie in the Glorot interval."""
    torch.manual_seed(0)
    for layer, lin in ((WindowAttention(8, heads=2), "lin_qkv"),
                       (PatchTokenAttention(8, heads=2), "embed"),
                       (PositionAttention(8), "lin"),
                       (ContinuumAttention(8), "lin_q")):
        m = getattr(layer, lin)
        bound = math.sqrt(6.0 / sum(m.weight.shape))
        assert torch.equal(m.bias, torch.zeros_like(m.bias))
        assert m.weight.abs().max() <= bound
        assert m.weight.abs().max() > 0.8 * bound


# ------------------------------------------------------------------ lambda
def _points(seed=2, n=11):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 4, generator=g, dtype=DT), torch.rand(n, 2, generator=g, dtype=DT),
            torch.rand(n, generator=g, dtype=DT) + 0.1)


@pytest.mark.parametrize("cls,kw", [(PositionAttention, {}),
                                    (LocalPositionAttention, {"k": 4})])
def test_lam_param_exp(cls, kw):
    """lam = exp(lam_raw) with lam_param="exp": the same lambda (and hence output) at
    initialisation as the softplus layer, and log-linear in the raw parameter."""
    x, pos, w = _points()
    soft = cls(4, 4, heads=2, lam_init=[2.0, 30.0], **kw).to(DT)
    exp = cls(4, 4, heads=2, lam_init=[2.0, 30.0], lam_param="exp", **kw).to(DT)
    for layer in (soft, exp):          # float64 raw parameters, the same W_V
        torch.manual_seed(0)
        layer.reset_parameters()
    torch.testing.assert_close(exp.lam, torch.tensor([2.0, 30.0], dtype=DT), rtol=1e-12, atol=0)
    torch.testing.assert_close(exp.lam_raw, torch.log(exp.lam), rtol=0, atol=1e-15)
    torch.testing.assert_close(exp(x, pos, w), soft(x, pos, w), rtol=0, atol=1e-12)
    assert "lam_param='exp'" in repr(exp)
    with pytest.raises(ValueError, match="lam_param"):
        cls(4, 4, heads=2, lam_param="tan", **kw)


def test_lam_passed_explicitly_is_used():
    """forward(..., lam=other.lam) equals a layer whose own lambda is other's, and the
    gradient reaches the other layer's parameter (PiT's shared_lambda)."""
    x, pos, w = _points()
    torch.manual_seed(0)
    a = PositionAttention(4, 4, heads=2, lam_init=[1.0, 5.0]).to(DT)
    src = PositionAttention(4, 4, heads=2, lam_init=[3.0, 40.0]).to(DT)
    b = PositionAttention(4, 4, heads=2, lam_init=[3.0, 40.0]).to(DT)
    b.lin.load_state_dict(a.lin.state_dict())
    out = a(x, pos, w, lam=src.lam)
    torch.testing.assert_close(out, b(x, pos, w), rtol=0, atol=1e-12)
    out.sum().backward()
    assert src.lam_raw.grad is not None and a.lam_raw.grad is None


@pytest.mark.parametrize("make", [
    lambda: ContinuumAttention(8, heads=2), lambda: GalerkinAttention(8, heads=2),
    lambda: PositionAttention(8, heads=2), lambda: LocalAttention(8, heads=2, k=3),
    lambda: LocalPositionAttention(8, heads=2, k=3)])
def test_a_missing_weight_is_named(make):
    """Flat and dense forms refuse ``weight=None`` with the message naming the weights
    (the layer contract's first version let it reach an AttributeError deep inside)."""
    layer = make()
    x, pos = torch.randn(10, 8), torch.rand(10, 2)
    with pytest.raises(ValueError, match="weight must be a tensor of quadrature weights"):
        layer(x, pos, None)
    if hasattr(layer, "dense") and not isinstance(layer, (LocalAttention,
                                                          LocalPositionAttention)):
        with pytest.raises(ValueError, match=r"^weight must be "):
            layer.dense(x[None], pos[None], None)


@pytest.mark.parametrize("mode", ["window", "token"])
def test_patch_weights_beside_given_groups_are_checked(mode):
    """``groups=`` replaces the positions and the batch, not the weights: those are still
    checked (a NaN or negative weight was silently treated as 0 on that path)."""
    layer = patch_attention(8, 8, heads=2, num_patches=2, mode=mode)
    x, pos, w = torch.randn(10, 8), torch.rand(10, 2), torch.ones(10)
    groups = layer.groups(pos, w)
    for bad, msg in ((torch.full((10,), float("nan")), "finite and non-negative"),
                     (-torch.ones(10), "finite and non-negative"),
                     (torch.ones(7), r"weight has shape \(7,\)")):
        with pytest.raises(ValueError, match=msg):
            layer(x, pos, bad, groups=groups)
