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


def peak_tflops(name: str) -> Optional[float]:
    low = name.lower()
    for frags, tf in PEAK_TFLOPS:
        if all(f in low for f in frags):
            return tf
    return None


def attention_flops(n_dst: int, n_src: int, head_dim: int, heads: int, batch: int = 1,
                    backward: bool = True) -> float:
    fwd = 4.0 * n_dst * n_src * head_dim * heads * batch
    return fwd * 3.5 if backward else fwd


def _layer(n: int, device: str, dtype, channels: int = C, heads: int = H):
    import torch

    from meshops.nn.continuum import ContinuumAttention

    torch.manual_seed(0)
    att = ContinuumAttention(channels, channels, heads=heads).to(device=device, dtype=dtype)
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
    import torch
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


def time_layer(device: str, dtype, n: int, reps: int = 3, channels: int = C, heads: int = H
               ) -> dict[str, Any]:
    import torch

    att, x, w = _layer(n, device, dtype, channels, heads)
    res: dict[str, Any] = {"n": n, "channels": channels, "heads": heads,
                           "dtype": str(dtype).replace("torch.", "")}
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
        flops = attention_flops(n, n, channels // heads, heads, backward=mode == "fwdbwd")
        res[f"{mode}_s"] = t
        res[f"{mode}_tflops"] = flops / t / 1e12
        if device.startswith("cuda"):
            res[f"{mode}_peak_gb"] = (torch.cuda.max_memory_allocated() - base) / (1 << 30)
    return res


def gpu_child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    device = spec["device"]
    sizes = spec.get("sizes", [65536, 262144, 1_000_000])
    out: dict[str, Any] = {"status": "ok", "available": True, "device": device}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        out["name"] = p.name
        out["peak_tflops_bf16"] = spec.get("peak_tflops") or peak_tflops(p.name)
    dtypes = [torch.bfloat16, torch.float16] if device.startswith("cuda") else [torch.float32]
    out["dtypes"] = {}
    for dt in dtypes:
        key = str(dt).replace("torch.", "")
        entry: dict[str, Any] = {}
        try:
            entry["backends_accepting"] = probe_backends(device, dt, spec.get("probe_n", 4096))
            entry["kernels"] = profile_kernels(device, dt, spec.get("profile_n", 65536))
            entry["kernel"] = classify(entry["kernels"])
            entry["runs"] = []
            for n in sizes:
                try:
                    entry["runs"].append(time_layer(device, dt, n, spec.get("reps", 3)))
                except Exception as exc:  # noqa: BLE001
                    entry["runs"].append({"n": n, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    break
            wide = spec.get("wide_n")
            if wide:
                try:
                    entry["wide"] = time_layer(device, dt, wide, spec.get("reps", 3),
                                               channels=256, heads=4)
                except Exception as exc:  # noqa: BLE001
                    entry["wide"] = {"n": wide, "error": f"{type(exc).__name__}: {exc}"[:300]}
        except Exception as exc:  # noqa: BLE001
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
        out["dtypes"][key] = entry
    return out


def run_gpu(iso, device: str, quick: bool, log, peak: Optional[float] = None) -> dict[str, Any]:
    """The GPU section of the report (``{"available": False, ...}`` without a GPU)."""
    import torch

    if not device.startswith("cuda"):
        return {"available": False, "note": "no GPU: run with --device cuda on a CUDA machine"}
    if not torch.cuda.is_available():
        return {"available": False, "note": "no GPU: --device cuda given but "
                                            "torch.cuda.is_available() is False"}
    sizes = [65536, 262144] if quick else [65536, 262144, 1_000_000]
    spec = {"device": device, "sizes": sizes, "peak_tflops": peak, "reps": 2 if quick else 3,
            "wide_n": None if quick else 1_000_000}
    res = iso.run("benchmarks.gpu:gpu_child", spec, timeout=1800)
    for dt, e in (res.get("dtypes") or {}).items():
        log(f"  gpu {res.get('name')} {dt}: kernel {e.get('kernel')} "
            f"(accepting: {e.get('backends_accepting')})")
        for r in e.get("runs", []):
            if "fwdbwd_s" in r:
                log(f"    N={r['n']:<8} fwd {r['fwd_s'] * 1e3:9.1f} ms {r['fwd_tflops']:6.1f} TF/s"
                    f"   fwd+bwd {r['fwdbwd_s'] * 1e3:9.1f} ms {r['fwdbwd_tflops']:6.1f} TF/s")
            else:
                log(f"    N={r['n']}: {r.get('error')}")
    return res
