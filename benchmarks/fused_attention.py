"""meshops' fused CPU attention kernel against PyTorch's SDPA, interleaved in one process.

    python -m benchmarks.fused_attention [--reps 7]

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fused_attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=7, help="timed repetitions of each (default 7)")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
