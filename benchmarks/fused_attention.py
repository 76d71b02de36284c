"""meshops' fused CPU attention kernel against PyTorch's SDPA, interleaved in one process.

    python -m benchmarks.fused_attention [--reps 7] [--floor]

The same attention (softmax with a per-key bias ``log w``) through
:func:`meshops.kernels.attention.fused_attention` and through
:func:`torch.nn.functional.scaled_dot_product_attention`, at the sizes of the
benchmark targets: continuum self-attention at N = 8,192 and 16,384 (4 heads of 16
channels, forward and forward+backward) and position cross-attention from 100k points
to 2,048 (4 heads; position features of width 3 against values of width 16, padded
to 16 for SDPA as :class:`~meshops.nn.PositionAttention` does). The two are run
alternately, repetition by repetition, so that a change in machine load hits both;
the table gives medians and their ratio, and the largest difference between the two
outputs.

``--floor`` also measures, with a small compiled probe on one thread, the two rates
that bound any exact fused kernel on this CPU: 8-wide FMAs per second (ten
independent accumulators, so throughput rather than latency) and ATen's vectorised
``exp_u20`` per element (a loop over L1-resident data), and prints the lower bounds on
the time of the benchmark cases that follow from them and the thread count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def _case(name: str, nq: int, nk: int, e: int, c: int, shared_k: bool, grad: bool):
    g = torch.Generator().manual_seed(0)
    H = 4
    q = torch.randn(1, H, nq, e, generator=g) * 0.5
    k = torch.randn(1, 1 if shared_k else H, nk, e, generator=g) * 0.5
    v = torch.randn(1, H, nk, c, generator=g)
    bias = torch.log(torch.rand(1, nk, generator=g) + 0.5)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    return name, q, k, v, bias, grad


def _sdpa(q, k, v, bias):
    e, c = q.shape[-1], v.shape[-1]
    width = max(e, c)  # the fused CPU kernel of PyTorch needs one head dimension
    scale = 1.0 / e ** 0.5
    qp, kp = F.pad(q, (0, width - e)), F.pad(k, (0, width - e)).expand(-1, q.shape[1], -1, -1)
    out = F.scaled_dot_product_attention(qp, kp, F.pad(v, (0, width - c)),
                                         attn_mask=bias[:, None, None, :], scale=scale)
    return out[..., :c]


def _fused(q, k, v, bias):
    from meshops.kernels.attention import fused_attention

    return fused_attention(q, k, v, bias, scale=1.0 / q.shape[-1] ** 0.5)


def _run(fn, args, grad: bool) -> float:
    t0 = time.perf_counter()
    out = fn(*args)
    if grad:
        out.sum().backward()
    return time.perf_counter() - t0


_PROBE = r"""
#include <torch/extension.h>
#include <ATen/cpu/vec/vec.h>
#include <chrono>
using V = at::vec::Vectorized<float>;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// seconds per 8-wide FMA instruction, ten independent chains
double fma_seconds(int64_t reps) {
  V a[10];
  for (int i = 0; i < 10; ++i) a[i] = V(1.0f + i * 1e-3f);
  const V x(0.999999f), y(1e-7f);
  double t0 = now();
  for (int64_t r = 0; r < reps; ++r)
    for (int i = 0; i < 10; ++i) a[i] = at::vec::fmadd(a[i], x, y);
  double t = now() - t0;
  float sink = 0, buf[64];
  for (int i = 0; i < 10; ++i) {
    a[i].store(buf);
    sink += buf[0];
  }
  return sink == 12345.f ? 0.0 : t / (reps * 10.0);
}
// seconds per element of exp_u20 (load, subtract, exp, store, sum) over 1024 floats
double exp_seconds(int64_t reps) {
  std::vector<float> s(1024);
  for (int i = 0; i < 1024; ++i) s[i] = -0.05f * (i % 200);
  std::vector<float> o(1024);
  V acc(0.f);
  double t0 = now();
  for (int64_t r = 0; r < reps; ++r) {
    const V m(1e-3f * (r & 7));
    for (int j = 0; j < 1024; j += V::size()) {
      V p = (V::loadu(s.data() + j) - m).exp_u20();
      p.store(o.data() + j);
      acc = acc + p;
    }
  }
  double t = now() - t0;
  float buf[64];
  acc.store(buf);
  return buf[0] == 12345.f ? 0.0 : t / (reps * 1024.0);
}
"""


def _floor(cases) -> None:
    """Measured FMA and exp rates, and the lower bounds they give on each case."""
    from torch.utils.cpp_extension import load_inline

    from meshops.kernels.attention import CPU_FLAGS

    cap = torch.backends.cpu.get_cpu_capability()
    probe = load_inline("meshops_rate_probe", cpp_sources=_PROBE,
                        functions=["fma_seconds", "exp_seconds"],
                        extra_cflags=["-O3", *CPU_FLAGS.get(cap, [])])
    fma = min(probe.fma_seconds(20_000_000) for _ in range(3))
    exp = min(probe.exp_seconds(200_000) for _ in range(3))
    threads = torch.get_num_threads()
    print(f"\none thread: {1e-9 / fma:.2f} G 8-wide FMA/s ({16e-9 / fma:.1f} GFLOP/s), "
          f"exp_u20 {exp * 1e9:.2f} ns per element; {threads} threads")
    print(f"{'case':<30} {'FMA':>8} {'exp':>8} {'floor':>8}   (exact evaluation, all threads)")
    for name, q, k, v, _, grad in cases:
        BH, nq, e = q.shape[0] * q.shape[1], q.shape[2], q.shape[3]
        nk, c = k.shape[2], v.shape[3]
        pairs = BH * nq * nk
        # 8-wide FMAs per (query, key) pair: scores e, weighted values c forward; the
        # backward recomputes the scores and forms dP (c), dV (c), dQ (e), dK (e)
        per_pair = (e + c) + (3 * e + 2 * c if grad else 0)
        t_fma = pairs * per_pair / 8 * fma / threads
        t_exp = pairs * (2 if grad else 1) * exp / threads
        print(f"{name:<30} {t_fma:>7.3f}s {t_exp:>7.3f}s {t_fma + t_exp:>7.3f}s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fused_attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=7, help="timed repetitions of each (default 7)")
    p.add_argument("--floor", action="store_true",
                   help="also measure this CPU's FMA and exp rates and the lower bounds")
    args = p.parse_args(argv)
    from meshops.kernels import attention_extension

    if attention_extension() is None:
        print("the fused kernel is not available on this machine")
        return 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    cases = [
        _case("continuum N=8192 fwd", 8192, 8192, 16, 16, False, False),
        _case("continuum N=8192 fwd+bwd", 8192, 8192, 16, 16, False, True),
        _case("continuum N=16384 fwd+bwd", 16384, 16384, 16, 16, False, True),
        _case("position 100k->2048 fwd", 2048, 100_000, 3, 16, True, False),
        _case("position 100k->2048 fwd+bwd", 2048, 100_000, 3, 16, True, True),
    ]
    print(f"{'case':<30} {'SDPA':>9} {'fused':>9} {'SDPA/fused':>11} {'max |diff|':>11}")
    for name, q, k, v, bias, grad in cases:
        with torch.no_grad():
            diff = float((_fused(q, k, v, bias) - _sdpa(q, k, v, bias)).abs().max())
        ctx = torch.enable_grad() if grad else torch.no_grad()
        times = {"sdpa": [], "fused": []}
        with ctx:
            for fn in (_sdpa, _fused):  # warm-up
                _run(fn, (q, k, v, bias), grad)
            for _ in range(args.reps):
                for key, fn in (("sdpa", _sdpa), ("fused", _fused)):
                    times[key].append(_run(fn, (q, k, v, bias), grad))
        ts, tf = statistics.median(times["sdpa"]), statistics.median(times["fused"])
        print(f"{name:<30} {ts:>8.3f}s {tf:>8.3f}s {ts / tf:>10.2f}x {diff:>11.1e}", flush=True)
    if args.floor:
        _floor(cases)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
