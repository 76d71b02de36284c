"""GPU checks of continuum attention: which fused SDPA kernel runs, N = 1,000,000
forward+backward in bf16/fp16, achieved TFLOP/s against the card's peak.

Without a CUDA device (or with ``--device cpu``) :func:`run_gpu` returns
``{"available": False, "note": "no GPU ..."}`` and nothing is measured.

How the kernel is identified (both are recorded):

1. *restriction*: the layer is run under ``torch.nn.attention.sdpa_kernel(backend)``
   for each of FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION and MATH; a
   backend that cannot take the call raises, so the list of accepting backends says
   which fused kernels are eligible for it (flash takes no attention bias, so the
   ``log w`` bias rules it out unless the weights are folded into K);
2. *profiler*: the CUDA kernels of one default (unrestricted) forward+backward are
   listed with ``torch.profiler``; their names (``fmha_cutlass...``/``efficient`` for
   the memory-efficient kernel, ``flash`` for flash, ``cudnn`` for cuDNN) say which one
   PyTorch actually dispatched.

FLOP count (FlashAttention convention): forward ``4 N_dst N_src d H`` (``QK^T`` and
``PV``), backward 2.5 x forward, so forward+backward = 3.5 x forward.  Projections
are not counted (they are O(N), negligible at this size).

Implementations compared side by side (each run names its ``impl``):

* continuum attention (``ContinuumAttention``, 64 channels, 4 heads of 16) through
  SDPA with the ``[B, 1, 1, N]`` ``log w`` bias (``impl="sdpa"``, the series the
  kernel probe above describes) and through FlexAttention with ``log w`` as its
  ``score_mod`` (``impl="flex"``), N = 4k ... 1M;
* PiT's position attention (``PositionAttention``, 64 channels, 4 heads, one mesh):
  the dot-product expansion through SDPA with ``log w`` folded into the keys
  (``impl="sdpa"``) and FlexAttention with the exact ``-lam |x-y|^2 + log w`` as its
  ``score_mod`` (``impl="flex"``).  Its FLOPs are counted as the FlexAttention kernel
  multiplies: ``QK^T`` at the padded width 16 (the query/key inputs are zeros) and
  ``PV`` at the value width c: forward ``2 N^2 H (16 + c)``, backward 2.5 x forward.

The exponential ceiling: an H100 SXM does 989 TFLOP/s of bf16 matrix products but
about 3.9 T exponentials/s (FlashAttention-3 paper), and attention needs one per score
forward and one backward (recomputed).  With head width ``d`` the best possible time
per score is ``max(4d/P, 1/X) + max(10d/P, 1/X)`` (P the matmul peak, X the
exponential rate), so the fraction of peak cannot exceed ``14 d / P`` over that time:
44 % at d = 16, 78 % at d = 32, 100 % at d >= 64 (:func:`exp_ceiling`; printed with
every run).  The wide case (256 channels, 4 heads of 64) is the one not bound by it.
"""

from __future__ import annotations

import time
from typing import Any, Optional

#: Dense (no sparsity) bf16/fp16 tensor-core peak, TFLOP/s, by name fragments
#: (checked in order; all fragments of an entry must occur in the device name).
PEAK_TFLOPS = [
    (("h100", "pcie"), 756.0),
    (("h100", "nvl"), 835.0),
    (("h100",), 989.4),
    (("h200",), 989.4),
    (("gh200",), 989.4),
    (("b200",), 2250.0),
    (("a100",), 312.0),
    (("l40s",), 362.1),
    (("l40",), 181.0),
    (("l4",), 121.0),
    (("a10g",), 70.0),
    (("a10",), 125.0),
    (("v100",), 125.0),
    (("t4",), 65.0),
]

C, H = 64, 4

#: Special-function (exp2) throughput, T/s, by name fragments as for PEAK_TFLOPS
#: (H100 SXM: 3.9 T/s, FlashAttention-3 paper, Shah et al. 2024, sec. 1).
EXP_TPS = [(("h100", "pcie"), 3.0), (("h100",), 3.9), (("h200",), 3.9), (("gh200",), 3.9)]

#: Sizes of the FlexAttention / SDPA comparison (full run; --quick keeps the middle two).
SIZES = [4096, 16384, 65536, 262144, 1_000_000]


def _by_name(table, name: str) -> Optional[float]:
    """The value of the first entry of ``table`` whose fragments all occur in ``name``."""
    low = name.lower()
    return next((value for frags, value in table if all(f in low for f in frags)), None)


def peak_tflops(name: str) -> Optional[float]:
    return _by_name(PEAK_TFLOPS, name)


def exp_rate(name: str) -> Optional[float]:
    return _by_name(EXP_TPS, name)


def attention_flops(n_dst: int, n_src: int, head_dim: int, heads: int, batch: int = 1,
                    backward: bool = True, value_dim: Optional[int] = None) -> float:
    """``QK^T`` at ``head_dim`` and ``PV`` at ``value_dim`` (default ``head_dim``):
    forward ``2 N_dst N_src H (head_dim + value_dim)``, forward+backward 3.5 x that."""
    value_dim = head_dim if value_dim is None else value_dim
    fwd = 2.0 * n_dst * n_src * (head_dim + value_dim) * heads * batch
    return fwd * 3.5 if backward else fwd


def exp_ceiling(head_dim: float, peak_tflops: float, exp_tps: float,
                backward: bool = True) -> float:
    """The largest fraction of ``peak_tflops`` attention with ``head_dim``-wide heads can
    reach when each score costs one exponential forward (and one backward) at
    ``exp_tps`` T/s, overlapped perfectly with the products (see the module)."""
    P, X = peak_tflops * 1e12, exp_tps * 1e12
    t = max(4 * head_dim / P, 1 / X) + (max(10 * head_dim / P, 1 / X) if backward else 0)
    flops = 4 * head_dim * (3.5 if backward else 1.0)
    return min(1.0, flops / t / P)


def _layer(n: int, device: str, dtype, channels: int = C, heads: int = H, impl: str = "sdpa"):
    import torch

    from meshops.nn.continuum import ContinuumAttention

    torch.manual_seed(0)
    att = ContinuumAttention(channels, channels, heads=heads, impl=impl).to(device=device,
                                                                          dtype=dtype)
    x = torch.randn(n, channels, device=device, dtype=dtype, requires_grad=True)
    w = torch.full((n,), 1.0 / n, device=device, dtype=dtype)
    return att, x, w


def _fwdbwd(att, x, w):
    att.zero_grad(set_to_none=True)
    x.grad = None
    att(x, None, w).float().sum().backward()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def probe_backends(device: str, dtype, n: int = 4096) -> dict[str, str]:
    """Which SDPA backends accept continuum attention's call (``"ok"`` or the error)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    att, x, w = _layer(n, device, dtype)
    out = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            out[name] = "not in this torch"
            continue
        try:
            with sdpa_kernel([backend]):
                _fwdbwd(att, x, w)
            _sync(device)
            out[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - the message is the evidence
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        finally:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
    return out


def profile_kernels(device: str, dtype, n: int = 65536) -> list[str]:
    """Names of the attention kernels of one default forward+backward."""
    from torch.profiler import ProfilerActivity, profile

    att, x, w = _layer(n, device, dtype)
    _fwdbwd(att, x, w)
    _sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda")
                                     else [])
    with profile(activities=acts) as prof:
        _fwdbwd(att, x, w)
        _sync(device)
    keys = ("attention", "fmha", "flash", "efficient", "cudnn", "sdpa", "softmax", "cutlass")
    names = sorted({e.key for e in prof.key_averages() if any(k in e.key.lower() for k in keys)})
    return names


def classify(kernels: list[str]) -> str:
    low = " ".join(kernels).lower()
    if "flash" in low and "fmha" not in low:
        return "flash"
    if "efficient" in low or "fmha" in low or "cutlass" in low:
        return "memory-efficient"
    if "cudnn" in low:
        return "cudnn"
    if "softmax" in low:
        return "math (unfused)"
    return "unknown"


def _position(n: int, device: str, dtype, channels: int = C, heads: int = H,
              impl: str = "flex"):
    """PiT's position attention on one mesh of ``n`` points in the unit square (a
    shared mesh, as PiT's latent mesh is): ``layer.dense(x [1, n, C], pos [n, 2], w)``."""
    import torch

    from meshops.nn.position import PositionAttention

    torch.manual_seed(0)
    att = PositionAttention(channels, channels, heads=heads, lam_init=float(n) ** 0.5,
                            impl=impl).to(device=device, dtype=dtype)
    x = torch.randn(1, n, channels, device=device, dtype=dtype, requires_grad=True)
    pos = torch.rand(n, 2, device=device)               # float32 points
    w = torch.full((n,), 1.0 / n, device=device)

    class Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.att = att

        def forward(self, x, _none, w):
            return self.att.dense(x, pos, w)

    return Call(), x, w


def time_layer(device: str, dtype, n: int, reps: int = 3, channels: int = C, heads: int = H,
               impl: str = "sdpa", layer: str = "continuum",
               peak: Optional[float] = None, exps: Optional[float] = None) -> dict[str, Any]:
    """Median forward and forward+backward time of one layer call at ``n`` points, its
    TFLOP/s, the fraction of ``peak`` and the exponential ceiling (:func:`exp_ceiling`)."""
    import torch

    make = _layer if layer == "continuum" else _position
    att, x, w = make(n, device, dtype, channels, heads, impl=impl)
    res: dict[str, Any] = {"n": n, "channels": channels, "heads": heads, "impl": impl,
                           "layer": layer, "dtype": str(dtype).replace("torch.", "")}
    d = channels // heads
    qk = d if layer == "continuum" else 16     # position: FlexAttention's padded zeros
    for mode in ("fwd", "fwdbwd"):
        def run():
            if mode == "fwd":
                with torch.no_grad():
                    return att(x, None, w)
            return _fwdbwd(att, x, w)

        run()
        _sync(device)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        ts = []
        for _ in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            run()
            _sync(device)
            ts.append(time.perf_counter() - t0)
        t = sorted(ts)[len(ts) // 2]
        flops = attention_flops(n, n, qk, heads, backward=mode == "fwdbwd", value_dim=d)
        res[f"{mode}_s"] = t
        res[f"{mode}_tflops"] = flops / t / 1e12
        if peak:
            res[f"{mode}_of_peak"] = res[f"{mode}_tflops"] / peak
            if exps:
                res[f"{mode}_ceiling"] = exp_ceiling((qk + d) / 2, peak, exps,
                                                     backward=mode == "fwdbwd")
        if device.startswith("cuda"):
            res[f"{mode}_peak_gb"] = (torch.cuda.max_memory_allocated() - base) / (1 << 30)
    return res


def _series(device: str, dtype, sizes, reps: int, **kw) -> list[dict[str, Any]]:
    """:func:`time_layer` at each size, stopping at the first that fails (memory)."""
    runs = []
    for n in sizes:
        try:
            runs.append(time_layer(device, dtype, n, reps, **kw))
        except Exception as exc:  # noqa: BLE001 - the message is the evidence
            runs.append({"n": n, "impl": kw.get("impl"), "layer": kw.get("layer", "continuum"),
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
            if device.startswith("cuda"):
                import torch
                torch.cuda.empty_cache()
            break
    return runs


def gpu_child(spec: dict[str, Any]) -> dict[str, Any]:
    """The measurements (in a fresh process): per dtype the SDPA kernel probe, the SDPA
    and FlexAttention series of continuum attention, PiT's position attention both
    ways, and the wide (head width 64) case; float16 only probes and times 262k."""
    import torch

    device = spec["device"]
    sizes = spec.get("sizes", SIZES)
    reps = spec.get("reps", 3)
    out: dict[str, Any] = {"status": "ok", "available": True, "device": device}
    peak = exps = None
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        out["name"] = p.name
        peak = out["peak_tflops_bf16"] = spec.get("peak_tflops") or peak_tflops(p.name)
        exps = out["exp_tps"] = exp_rate(p.name)
    dtypes = [torch.bfloat16, torch.float16] if device.startswith("cuda") else [torch.float32]
    out["dtypes"] = {}
    for dt in dtypes:
        key = str(dt).replace("torch.", "")
        main = dt == dtypes[0]
        sz = sizes if main else [n for n in sizes if n == 262144] or sizes[-1:]
        kw = dict(peak=peak, exps=exps)
        entry: dict[str, Any] = {}
        try:
            entry["backends_accepting"] = probe_backends(device, dt, spec.get("probe_n", 4096))
            entry["kernels"] = profile_kernels(device, dt, spec.get("profile_n", 65536))
            entry["kernel"] = classify(entry["kernels"])
            # "runs": SDPA with the log w bias (the series T8 reads); "flex": FlexAttention
            entry["runs"] = _series(device, dt, sz, reps, impl="sdpa", **kw)
            entry["flex"] = _series(device, dt, sz, reps, impl="flex", **kw)
            if main:
                entry["position"] = (
                    _series(device, dt, sz, reps, impl="sdpa", layer="position", **kw)
                    + _series(device, dt, sz, reps, impl="flex", layer="position", **kw))
                wide = spec.get("wide_n")
                if wide:
                    entry["wide"] = [r for impl in ("sdpa", "flex") for r in _series(
                        device, dt, [wide], reps, impl=impl, channels=256, heads=4, **kw)]
        except Exception as exc:  # noqa: BLE001
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
        out["dtypes"][key] = entry
    return out


def run_line(r: dict[str, Any]) -> str:
    """One run as a line: time, TFLOP/s, % of peak and the exponential ceiling."""
    if "fwdbwd_s" not in r:
        return (f"{r.get('layer', 'continuum'):<10} {r.get('impl', ''):<5} N={r.get('n')}: "
                f"{r.get('error')}")
    frac = (f" = {100 * r['fwdbwd_of_peak']:.1f}% of peak" if "fwdbwd_of_peak" in r else "")
    ceil = (f" (exp ceiling {100 * r['fwdbwd_ceiling']:.0f}%)" if "fwdbwd_ceiling" in r else "")
    mem = f"  {r['fwdbwd_peak_gb']:.2f} GB" if "fwdbwd_peak_gb" in r else ""
    return (f"{r.get('layer', 'continuum'):<10} {r.get('impl', ''):<5} N={r['n']:<8} "
            f"C={r['channels']} H={r['heads']}  fwd {r['fwd_s'] * 1e3:9.1f} ms "
            f"{r['fwd_tflops']:6.1f} TF/s   fwd+bwd {r['fwdbwd_s'] * 1e3:9.1f} ms "
            f"{r['fwdbwd_tflops']:6.1f} TF/s{frac}{ceil}{mem}")


def all_runs(e: dict[str, Any]) -> list[dict[str, Any]]:
    """Every timed run of one dtype's entry, in report order."""
    wide = e.get("wide") or []
    wide = [wide] if isinstance(wide, dict) else wide      # older files: one dict
    return e.get("runs", []) + e.get("flex", []) + e.get("position", []) + wide


def run_gpu(iso, device: str, quick: bool, log, peak: Optional[float] = None) -> dict[str, Any]:
    """The GPU section of the report (``{"available": False, ...}`` without a GPU)."""
    import torch

    if not device.startswith("cuda"):
        return {"available": False, "note": "no GPU: run with --device cuda on a CUDA machine"}
    if not torch.cuda.is_available():
        return {"available": False, "note": "no GPU: --device cuda given but "
                                            "torch.cuda.is_available() is False"}
    sizes = [65536, 262144] if quick else SIZES
    spec = {"device": device, "sizes": sizes, "peak_tflops": peak, "reps": 2 if quick else 3,
            "wide_n": None if quick else 262144}
    res = iso.run("benchmarks.gpu:gpu_child", spec, timeout=1800)
    for dt, e in (res.get("dtypes") or {}).items():
        log(f"  gpu {res.get('name')} {dt}: SDPA kernel {e.get('kernel')} "
            f"(accepting: {e.get('backends_accepting')})")
        if e.get("error"):
            log(f"    error: {e['error']}")
        for r in all_runs(e):
            log("    " + run_line(r))
    return res
