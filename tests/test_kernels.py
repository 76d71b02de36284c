"""The fused CPU attention kernel (meshops.kernels) against a plain softmax in float64."""

import math

import pytest
import torch

from meshops.kernels import attention_extension, kernels_enabled
from meshops.kernels.attention import fused_attention, fused_attention_supported


def _reference(q, k, v, bias, scale):
    """The formula, materialised: softmax(scale q k^T + bias) v, per head."""
    H = q.shape[1]
    k = k.expand(-1, H, -1, -1)
    v = v.expand(-1, H, -1, -1)
    s = scale * q @ k.transpose(-1, -2)
    if bias is not None:
        s = s + bias[:, None, None, :]
    return torch.softmax(s, -1) @ v


def test_kernel_builds():
    """On any machine with a compiler and AVX2 the kernel must build (CI has both);
    MESHOPS_KERNELS=0 is the documented way to run without it."""
    if not kernels_enabled():
        pytest.skip("MESHOPS_KERNELS=0")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("no AVX2")
    assert attention_extension() is not None


needs_kernel = pytest.mark.skipif(attention_extension() is None,
                                  reason="fused CPU attention kernel not available")


def _inputs(B, H, Hk, Nq, Nk, E, C, dtype=torch.float64, seed=0, excluded=0.1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Nq, E, generator=g, dtype=dtype)
    k = torch.randn(B, Hk, Nk, E, generator=g, dtype=dtype)
    v = torch.randn(B, Hk, Nk, C, generator=g, dtype=dtype)
    bias = torch.log(torch.rand(B, Nk, generator=g, dtype=dtype) + 0.1)
    drop = torch.rand(B, Nk, generator=g) < excluded
    drop[:, 0] = False  # every sample keeps a key
    bias = bias.masked_fill(drop, -math.inf)
    return q, k, v, bias


# (B, H, Hk, Nq, Nk, E, C): one key tile and several, a partial last tile, head widths
# that need padding, keys shared by the heads (Hk = 1), E != C, the widest heads
CASES = [
    (1, 1, 1, 7, 5, 3, 5),
    (2, 4, 4, 37, 300, 16, 16),
    (1, 3, 1, 70, 600, 3, 16),
    (2, 2, 2, 9, 513, 32, 8),
    (1, 1, 1, 12, 260, 17, 31),
]


@needs_kernel
@pytest.mark.parametrize("shape", CASES)
def test_forward_and_gradients_match_the_formula_float64(shape):
    q, k, v, bias = _inputs(*shape)
    scale = 0.7
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    refs = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out = fused_attention(*leaves, scale=scale)
    ref = _reference(*refs, scale)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    gout = torch.randn_like(out)
    out.backward(gout)
    ref.backward(gout)
    for name, a, b in zip("q k v bias".split(), leaves, refs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-11, atol=1e-11,
                                   msg=lambda m, n=name: f"grad {n}: {m}")


@needs_kernel
def test_gradcheck_float64():
    q, k, v, bias = _inputs(1, 2, 2, 5, 19, 3, 5, excluded=0.0)
    args = [t.requires_grad_() for t in (q, k, v, bias)]
    assert torch.autograd.gradcheck(lambda *a: fused_attention(*a, scale=0.9), args)


@needs_kernel
def test_float32_within_rounding_of_float64():
    """float32 with ATen's polynomial exp (relative error about 2e-6 per weight)."""
    q, k, v, bias = _inputs(2, 4, 4, 64, 1000, 16, 16)
    ref = _reference(q, k, v, bias, 0.25)
    out = fused_attention(q.float(), k.float(), v.float(), bias.float(), scale=0.25)
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert err < 2e-5


@needs_kernel
def test_excluded_keys_have_exactly_zero_weight():
    q, k, v, bias = _inputs(1, 2, 2, 16, 300, 8, 8, dtype=torch.float32, excluded=0.3)
    out = fused_attention(q, k, v, bias)
    v2 = v.clone()
    v2[..., torch.isinf(bias[0]), :] = 1e30
    assert torch.equal(fused_attention(q, k, v2, bias), out)


@needs_kernel
def test_large_scores_are_stable():
    """Scores of order 1e3 (softmax ratios e^1000) must not overflow: the online
    maximum is subtracted before the exponential."""
    q, k, v, bias = _inputs(1, 1, 1, 8, 700, 4, 8)
    out = fused_attention(q * 300, k, v, bias, scale=1.0)
    ref = _reference(q * 300, k, v, bias, 1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@needs_kernel
def test_bad_shapes_are_named():
    q, k, v, bias = _inputs(1, 2, 2, 4, 10, 4, 4)
    with pytest.raises(ValueError, match="bias has shape"):
        fused_attention(q, k, v, bias[:, :5])
    with pytest.raises(ValueError, match="k has shape"):
        fused_attention(q, k[..., :3], v, bias)
    with pytest.raises(ValueError, match="v has shape"):
        fused_attention(q, k, v[:, :, :9], bias)


@needs_kernel
def test_unsupported_inputs_are_refused():
    q, k, v, bias = _inputs(1, 1, 1, 4, 10, 4, 100, dtype=torch.float32)
    assert not fused_attention_supported(q, k, v, bias)  # 100 channels > 8 vectors
    with pytest.raises(RuntimeError, match="unsupported input"):
        fused_attention(q, k, v, bias)
    assert not fused_attention_supported(q.half(), k.half(), v.half())


@needs_kernel
def test_output_can_be_modified_in_place():
    """As with SDPA's output: the result is a fresh tensor, not a view of the kernel's
    padded buffer; the backward pass still sees the value it returned."""
    q, k, v, bias = _inputs(1, 2, 2, 6, 20, 4, 5)
    q.requires_grad_()
    y = fused_attention(q, k, v, bias)
    y.mul_(2)  # allowed; the autograd graph then refuses a backward through it
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@needs_kernel
def test_empty_dimensions_are_left_to_sdpa():
    q, k, v, bias = _inputs(1, 2, 2, 6, 20, 4, 5)
    assert fused_attention_supported(q, k, v, bias)
    assert not fused_attention_supported(q, k[:, :, :0], v[:, :, :0], bias[:, :0])
    assert not fused_attention_supported(q[:, :, :0], k, v, bias)


@needs_kernel
def test_torch_func_transforms_take_the_sdpa_path():
    """torch.func cannot see into the compiled kernel: under a transform the layers
    fall back to SDPA, so grad works as it does without the kernel."""
    from torch.func import functional_call, grad

    from meshops.nn.continuum import ContinuumAttention

    torch.manual_seed(0)
    layer = ContinuumAttention(4, heads=2).double()
    x = torch.randn(9, 4, dtype=torch.float64)
    w = torch.rand(9, dtype=torch.float64) + 0.1
    params = dict(layer.named_parameters())
    g = grad(lambda p: functional_call(layer, p, (x, None, w)).square().sum())(params)
    layer(x, None, w).square().sum().backward()  # the fused path, outside torch.func
    for name, p in layer.named_parameters():
        torch.testing.assert_close(g[name], p.grad, rtol=1e-10, atol=1e-12)
