"""The fused CPU attention kernel (meshops.kernels) against a plain softmax in float64."""

import math
import os
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import meshops.kernels.attention as kernel_module
from meshops.kernels import attention_extension, attention_kernel, build, kernels_enabled
from meshops.kernels.attention import fused_attention, fused_attention_supported
from meshops.kernels.build import Extension, KernelBuildError, KernelBuildTimeout


def _reference(q, k, v, bias, scale):
    """The formula, materialised: softmax(scale q k^T + bias) v, per head."""
    H = q.shape[1]
    k = k.expand(-1, H, -1, -1)
    v = v.expand(-1, H, -1, -1)
    s = scale * q @ k.transpose(-1, -2)
    if bias is not None:
        s = s + bias[:, None, None, :]
    return torch.softmax(s, -1) @ v


def test_kernel_builds(fused_kernel_available):
    """On any machine with a compiler and AVX2 the kernel must build (CI has both);
    MESHOPS_KERNELS=0 is the documented way to run without it."""
    if not kernels_enabled():
        pytest.skip("MESHOPS_KERNELS=0")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("no AVX2")
    assert fused_kernel_available


# built in a session fixture (conftest.py), never at collection
needs_kernel = pytest.mark.usefixtures("fused_kernel")


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
    _assert_same_gradients(out, ref, leaves, refs, 1e-11)


def _assert_same_gradients(out, ref, leaves, refs, tol):
    """Backpropagate one random cotangent through both; compare the inputs' gradients."""
    gout = torch.randn_like(out)
    out.backward(gout)
    ref.backward(gout)
    for name, a, b in zip("q k v bias".split(), leaves, refs):
        torch.testing.assert_close(a.grad, b.grad, rtol=tol, atol=tol,
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
    from meshops.kernels.attention import MAX_VECTORS, _width
    # one channel more than MAX_VECTORS SIMD vectors hold (8 x 8 on AVX2, 8 x 16 on
    # AVX-512: a fixed 100 fitted on the H100 machine's AVX-512 CPU)
    c = MAX_VECTORS * _width(torch.float32) + 1
    q, k, v, bias = _inputs(1, 1, 1, 4, 10, 4, c, dtype=torch.float32)
    assert not fused_attention_supported(q, k, v, bias)
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


# ------------------------------------------------------------- the PyTorch operator
# (B, H, Hk, Nq, Nk, E, C): keys and values per head, and one set shared by the heads
OP_CASES = [(2, 2, 2, 5, 19, 3, 5), (1, 3, 1, 4, 40, 8, 6)]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", OP_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_operator_passes_opcheck(dtype, shape, with_bias):
    """The custom operator's schema, fake implementation (shapes and dtypes under
    FakeTensor and AOT dispatch with dynamic shapes) and autograd registration are
    consistent with its CPU implementation (torch.library.opcheck)."""
    from torch.library import opcheck

    q, k, v, bias = _inputs(*shape, dtype=dtype, excluded=0.0)
    args = [t.requires_grad_() for t in (q, k, v, bias)]
    if not with_bias:
        args[3] = None
    opcheck(torch.ops.meshops.fused_attention.default, (*args, 0.6))
    out, lse = torch.ops.meshops.fused_attention(*args, 0.6)
    grad = torch.randn_like(out)
    # the backward operator has no derivative of its own (first order, as documented)
    plain = [None if t is None else t.detach() for t in args]
    opcheck(torch.ops.meshops.fused_attention_backward.default,
            (grad, *plain, out.detach(), lse.detach(), 0.6))


@needs_kernel
def test_backward_fake_has_the_strides_of_the_kernel_for_head_major_views():
    """Layers pass q, k, v as views [B, H, N, E] of [B, N, H, E] tensors (the heads
    split off the channels). The backward operator returns fresh contiguous gradients;
    its fake said "like q", so compiled training of transformer_no failed after half a
    minute of compiling on "expected ... stride 120==4" (issue 28)."""
    from torch.library import opcheck

    q, k, v, bias = _inputs(2, 2, 2, 5, 19, 3, 5)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out, lse = torch.ops.meshops.fused_attention(q, k, v, bias, 0.6)
    grad = torch.randn_like(out)
    args = (grad, q, k, v, bias, out, lse, 0.6)
    opcheck(torch.ops.meshops.fused_attention_backward.default, args)
    real = torch.ops.meshops.fused_attention_backward(*args)
    assert all(t.is_contiguous() for t in real)


@needs_kernel
def test_compiled_fullgraph_equals_eager():
    """torch.compile traces through the kernel (fullgraph: no graph break), and the
    compiled function and its gradients equal the eager ones."""
    import torch._dynamo

    def fn(q, k, v, bias):
        return torch.tanh(fused_attention(q, k, v, bias, scale=0.6)).square().sum(-1)

    q, k, v, bias = _inputs(2, 2, 1, 6, 30, 4, 5)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(q, k, v, bias)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(fn, fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    refs = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out, ref = compiled(*leaves), fn(*refs)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    _assert_same_gradients(out, ref, leaves, refs, 1e-12)


@needs_kernel
def test_second_derivatives_are_refused_by_name():
    """First order only (as documented): differentiating the backward pass raises,
    naming the operator, instead of giving a wrong second derivative."""
    q, k, v, bias = _inputs(1, 2, 2, 5, 7, 3, 4)
    q.requires_grad_()
    (g,) = torch.autograd.grad(fused_attention(q, k, v, bias).square().sum(), q,
                               create_graph=True)
    with pytest.raises(RuntimeError, match="fused_attention_backward.*no autograd formula"):
        g.sum().backward()


_NO_OPERATOR = """
import warnings, torch
from meshops.kernels.attention import fused_attention_supported
from meshops.nn.continuum import ContinuumAttention
q = torch.randn(1, 2, 5, 4)
print("supported", fused_attention_supported(q, q, q))
x, w = torch.randn(9, 4), torch.rand(9) + 0.1
print("finite", bool(torch.isfinite(ContinuumAttention(4, heads=2)(x, None, w)).all()))
print("registered", hasattr(torch.ops.meshops, "fused_attention"),
      hasattr(torch.ops.meshops, "fused_attention_backward"))
"""


def test_without_the_kernel_no_operator_is_registered(tmp_path):
    """MESHOPS_KERNELS=0: the layers run on PyTorch's attention and no meshops
    operator exists (nothing registered without its kernel)."""
    res = subprocess.run([sys.executable, "-c", _NO_OPERATOR], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=_env(MESHOPS_KERNELS="0"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:3] == ["supported False", "finite True",
                                          "registered False False"]


_HALF_REGISTERED = """
import warnings, torch
import meshops.kernels.attention as att
from torch._library.custom_ops import CustomOpDef
def fail(*args, **kwargs):
    raise RuntimeError("planted registration failure")
CustomOpDef.register_autograd = fail
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print("widths", att._simd_widths())
print("warned", any("not available (RuntimeError: planted registration failure)"
                    in str(w.message) for w in caught))
q = torch.randn(1, 2, 5, 4)
print("supported", att.fused_attention_supported(q, q, q))
print("registered", hasattr(torch.ops.meshops, "fused_attention"),
      hasattr(torch.ops.meshops, "fused_attention_backward"))
"""


@needs_kernel
def test_a_failed_registration_leaves_no_operator_and_falls_back():
    """A registration step that fails (a torch.library change) removes the operators
    registered before it and turns the kernel off with a warning."""
    res = subprocess.run([sys.executable, "-c", _HALF_REGISTERED], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=_env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:4] == ["widths (0, 0)", "warned True", "supported False",
                                          "registered False False"]


# ------------------------------------------------------------- building: never hang
ROOT = Path(__file__).resolve().parents[2]
needs_avx2 = pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                                reason="no AVX2: no kernel to build")


def _env(**extra):
    # the checkout first, then whatever the caller's PYTHONPATH held (packages
    # installed with --target, as on the GPU machine, must stay importable)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    env.pop("MESHOPS_KERNELS", None)
    env.update(extra)
    return env


@contextmanager
def _lock_held_by_other_process(path):
    """Another live process holding the OS lock ``path`` (as a builder does)."""
    code = ("import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def fake_compiler(monkeypatch):
    """Stands in for the compiler in the tests of the locking (no minute-long build)."""
    def compile_(ext, lib, timeout, env):
        lib.write_bytes(b"library")

    monkeypatch.setattr(build, "_toolchain", dict)
    monkeypatch.setattr(build, "_compile", compile_)


def test_cache_folder_is_keyed_by_source_torch_python_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    src = tmp_path / "k.cpp"
    src.write_text("int f() { return 1; }")
    ext = Extension("k", (src,), cflags=("-mavx2",))
    base = ext.folder()
    assert base.parent == tmp_path / "ext" / "meshops"
    assert f"torch{torch.__version__}" in base.name and sys.implementation.cache_tag in base.name
    assert ext.library() == base / "k.so"
    assert Extension("k", (src,), cflags=("-mavx512f",)).folder() != base  # CPU capability
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "9.9.9")
        assert ext.folder() != base
    with monkeypatch.context() as m:
        m.setattr(sys.implementation, "cache_tag", "cpython-399")
        assert ext.folder() != base
    assert ext.folder() == base
    src.write_text("int f() { return 2; }")
    assert ext.folder() != base


def test_lock_of_a_killed_builder_is_free_at_once(tmp_path):
    lock = tmp_path / "build.lock"
    with _lock_held_by_other_process(lock) as holder:
        start = time.perf_counter()
        with pytest.raises(KernelBuildTimeout, match=r"build lock .* more than 0.5 s"):
            with build.build_lock(lock, timeout=0.5):
                pass
        assert 0.5 <= time.perf_counter() - start < 30  # bounded (loaded CI is slow)
        holder.kill()  # kill -9: the lock file stays behind
        holder.wait()
        assert lock.exists()
        start = time.perf_counter()
        with build.build_lock(lock, timeout=60):
            waited = time.perf_counter() - start
    assert waited < 30, f"waited {waited:.1f} s on the lock of a dead process"


def test_build_killed_midway_leaves_nothing_that_blocks_the_next(tmp_path, monkeypatch,
                                                                  fake_compiler):
    """kill -9 of a builder holding the lock and its private build folder: the next
    build takes the lock at once, removes the leftovers and completes."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    src = tmp_path / "k.cpp"
    src.write_text("// kernel")
    code = ("import sys, tempfile, time\n"
            "from pathlib import Path\n"
            "from meshops.kernels import build\n"
            "def stuck(ext, lib, timeout, env):\n"
            "    tempfile.mkdtemp(prefix=build.TMP_PREFIX, dir=lib.parent)\n"
            "    print('compiling', flush=True)\n"
            "    time.sleep(600)\n"
            "build._compile, build._toolchain = stuck, dict\n"
            "build.ensure_built(build.Extension('k', (Path(sys.argv[1]),)), timeout=600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(src)], stdout=subprocess.PIPE,
                            text=True, env=_env(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext")))
    try:
        assert proc.stdout.readline().strip() == "compiling"
    finally:
        proc.kill()
        proc.wait()
    ext = Extension("k", (src,))
    assert list(ext.folder().glob(build.TMP_PREFIX + "*"))  # what the killed build left
    start = time.perf_counter()
    built = build.ensure_built(ext, timeout=60)
    assert time.perf_counter() - start < 30  # not the 60 s bound: nothing waited on the dead build
    assert built.path == ext.library() and built.path.read_bytes() == b"library"
    assert built.seconds is not None
    assert not list(ext.folder().glob(build.TMP_PREFIX + "*"))


def test_every_build_says_so_and_how_long_it_took(tmp_path, monkeypatch, caplog, fake_compiler):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    src = tmp_path / "k.cpp"
    src.write_text("// kernel")
    ext = Extension("k", (src,), title="the test kernel")
    with caplog.at_level("WARNING", logger="meshops.kernels"):
        first = build.ensure_built(ext)
        again = build.ensure_built(ext)
        forced = build.ensure_built(ext, force=True)
    notices = [r.getMessage() for r in caplog.records]
    assert first.seconds is not None and again.seconds is None and forced.seconds is not None
    assert sum("compiling the test kernel (takes one to three minutes" in m
               for m in notices) == 2
    assert sum(m.startswith("meshops: compiled the test kernel in ") and str(ext.library()) in m
               for m in notices) == 2


def _failing_compiler(tmp_path):
    cxx = tmp_path / "failing-c++"
    # answers PyTorch's version query as the real compiler, fails to compile anything
    cxx.write_text("#!/bin/sh\ncase \"$1\" in --version|-v|-dumpversion) exec c++ \"$@\";; esac\n"
                   "echo 'attention_cpu.cpp:1: error: boom' >&2\nexit 1\n")
    cxx.chmod(0o755)
    return cxx


@needs_avx2
def test_failed_compile_leaves_no_library_nor_build_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("CXX", str(_failing_compiler(tmp_path)))
    ext = attention_kernel()
    with pytest.raises(KernelBuildError, match="compiling failed: .*boom"):
        build.ensure_built(ext, timeout=120)
    assert [p.name for p in ext.folder().iterdir()] == ["build.lock"]


@needs_avx2
def test_held_lock_times_out_and_falls_back_to_sdpa_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("MESHOPS_KERNEL_TIMEOUT", "1.5")
    monkeypatch.delenv("MESHOPS_KERNELS", raising=False)
    monkeypatch.setattr(kernel_module, "_STATE", {})  # as in a fresh process
    folder = attention_kernel().folder()
    folder.mkdir(parents=True)
    q = torch.randn(1, 2, 5, 4)
    with _lock_held_by_other_process(folder / "build.lock"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            assert attention_extension() is None
            elapsed = time.perf_counter() - start
            assert attention_extension() is None
            assert not fused_attention_supported(q, q, q)  # the layers take SDPA
    assert 1.5 <= elapsed < 30
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1, msgs
    assert "build lock" in msgs[0] and "MESHOPS_KERNEL_TIMEOUT" in msgs[0]
    assert "using PyTorch's attention" in msgs[0]


def test_bad_timeout_setting_is_named(monkeypatch):
    monkeypatch.setenv("MESHOPS_KERNEL_TIMEOUT", "soon")
    with pytest.raises(KernelBuildError, match="MESHOPS_KERNEL_TIMEOUT='soon' is not a positive"):
        build.build_timeout()
    monkeypatch.setenv("MESHOPS_KERNEL_TIMEOUT", "-3")
    with pytest.raises(KernelBuildError, match="MESHOPS_KERNEL_TIMEOUT"):
        build.build_timeout()
    monkeypatch.setenv("MESHOPS_KERNEL_TIMEOUT", "90")
    assert build.build_timeout() == 90.0


def test_nothing_is_compiled_at_import_or_test_collection(tmp_path):
    """Collecting the tests that use the kernel (and importing the layers) builds
    nothing: a build there escapes pytest's timeout."""
    ext_dir = tmp_path / "ext"
    files = ["tests/kernels/test_kernels.py", "tests/nn/test_continuum.py",
             "tests/nn/test_position.py"]
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=_env(TORCH_EXTENSIONS_DIR=str(ext_dir)))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "compiling" not in res.stdout + res.stderr
    assert not ext_dir.exists()


def test_build_kernels_command_names_the_library(fused_kernel):
    """The default cache already holds the kernel (the session fixture built it), so
    the command finds it and says where it is."""
    res = subprocess.run([sys.executable, "-m", "meshops", "build-kernels"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=_env())
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip()
    assert line.startswith("fused CPU attention kernel: ") and line.endswith("(already built)")
    path = Path(line[len("fused CPU attention kernel: "):-len(" (already built)")])
    assert path == attention_kernel().library() and path.is_file()


@needs_avx2
def test_build_kernels_command_reports_a_missing_compiler(tmp_path):
    res = subprocess.run([sys.executable, "-m", "meshops", "build-kernels"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env=_env(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"),
                                  CXX=str(tmp_path / "no-such-c++")))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"meshops: error: cannot build the fused CPU attention kernel: no C++ compiler: "
        f"'{tmp_path / 'no-such-c++'}' is not on PATH (install g++, or set CXX)"]
    assert res.stdout == ""


def _build_processes(folder):
    """Processes working in a private build folder under ``folder`` (ninja, compilers)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"/{build.TMP_PREFIX}" in os.readlink(proc / "cwd") and \
                    os.readlink(proc / "cwd").startswith(str(folder)):
                found.append((proc / "cmdline").read_bytes().split(b"\0")[0].decode())
        except OSError:
            pass
    return found


def _wait_for_compiler(folder, proc, limit=300):
    deadline = time.monotonic() + limit
    while not any("cc1plus" in p or "c++" in p for p in _build_processes(folder)):
        assert proc.poll() is None and time.monotonic() < deadline, "no compiler started"
        time.sleep(0.5)


def _assert_no_build_processes(folder, grace=5):
    """Within a few seconds (signals take a moment) nothing works in ``folder``."""
    deadline = time.monotonic() + grace
    while (running := _build_processes(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running == [], f"processes of the stopped build still run: {running}"


@pytest.mark.slow
@needs_avx2
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_real_build_killed_midway_then_the_next_run_completes(tmp_path):
    """kill -9 of a process while its compiler runs: the compiler dies with it, and
    the next process compiles the kernel and uses it."""
    ext_dir = tmp_path / "ext"
    env = _env(TORCH_EXTENSIONS_DIR=str(ext_dir))
    run = "from meshops.kernels import attention_extension\nassert attention_extension()\n"
    first = subprocess.Popen([sys.executable, "-c", run], env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_for_compiler(ext_dir, first)
    finally:
        first.kill()
        first.wait()
    _assert_no_build_processes(ext_dir)
    assert list(ext_dir.glob(f"meshops/*/{build.TMP_PREFIX}*"))  # its leftovers
    res = subprocess.run([sys.executable, "-c", run + "import torch\n"
                          "from meshops.kernels.attention import fused_attention\n"
                          "import torch.nn.functional as F\n"
                          "q = torch.randn(1, 2, 9, 4, dtype=torch.float64)\n"
                          "torch.testing.assert_close(fused_attention(q, q, q), "
                          "F.scaled_dot_product_attention(q, q, q))\n"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compiled the fused CPU attention kernel in" in res.stderr
    assert not list(ext_dir.glob(f"meshops/*/{build.TMP_PREFIX}*"))


@pytest.mark.slow
@needs_avx2
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_compile_past_the_time_limit_is_stopped(tmp_path):
    """MESHOPS_KERNEL_TIMEOUT bounds the compile too: past it the compiler is stopped,
    nothing is left behind, and the layers fall back with one warning."""
    ext_dir = tmp_path / "ext"
    code = ("import time, warnings\n"
            "from meshops.kernels import attention_extension\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    start = time.perf_counter()\n"
            "    assert attention_extension() is None and attention_extension() is None\n"
            "print(time.perf_counter() - start)\n"
            "w = [x for x in w if str(x.message).startswith('meshops:')]\n"
            "print(len(w))\n"
            "print(w[0].message)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=_env(TORCH_EXTENSIONS_DIR=str(ext_dir),
                                               MESHOPS_KERNEL_TIMEOUT="25"))
    assert res.returncode == 0, res.stderr[-3000:]
    seconds, count, message = res.stdout.strip().splitlines()
    assert 25 <= float(seconds) < 60 and count == "1"
    assert "took more than 25 s (MESHOPS_KERNEL_TIMEOUT" in message
    _assert_no_build_processes(ext_dir)
    folder, = ext_dir.glob("meshops/*")
    assert [p.name for p in folder.iterdir()] == ["build.lock"]
