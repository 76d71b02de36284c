"""``python -m benchmarks.edge_sum``: forward and backward of :func:`meshops.nn._edge_sum.edge_sum`
at the size of PiT's encoder, the library's kernels against two baselines, alternating.

Case ``pit-encoder`` (issue 13): PiT with ``width=128, heads=1, latent="grid", stride=4,
quantile_in=0.02, ball="count"`` on the 221 x 51 NACA C-grid, batch of 4 samples. Its
encoder is local position attention from the 11,271 input points to the 784-point
stride-4 sub-grid (56 x 14) with ``k = floor(0.02 * 11270) + 1 = 226`` neighbours;
``heads * in_channels = width``, so the values are projected first: ``H = 1`` head of
``c = 128`` channels. E = 4 x 784 x 226 = 708,736 edges. Case ``naca-preset``: the
``PiT.PRESETS["naca"]`` encoder (width 256, 2 heads of 128 channels, stride-2 sub-grid
of 2,886 points, quantile 0.005 -> 57 neighbours), batch of 4.

The graph is the kNN graph of a structured 221 x 51 grid in the unit square (point
order as in the NACA files, C order), so the memory access pattern is that of the
real encoder. Implementations:

* ``lib``: the library (CSR product forward; transposed CSR product and SDDMM backward);
* ``gather``: the previous library backward (meshops up to commit 34d7ac3): the same
  forward, backward by gathering ``[chunk, H, c]`` per-edge messages;
* ``plain``: ``index_add(alpha * v[src], dst)`` with autograd (an ``[E, H, c]`` tensor).

Each repetition runs every implementation once (forward, then backward of
``(out * w).sum()``), so load from other processes hits all of them alike; the table
gives the median over repetitions and the backward/forward ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import torch

from benchmarks.paths import command
from meshops.models.latent import grid_latent
from meshops.nn._edge_sum import edge_sum
from meshops.nn.local import quantile_k
from meshops.search import knn

#: edges per chunk of the ``gather`` baseline's backward (the old library constant)
CHUNK = 1 << 18

CASES = {
    # name: (grid stride of the latent mesh, encoder quantile, heads, channels per head)
    "pit-encoder": (4, 0.02, 1, 128),
    "naca-preset": (2, 0.005, 2, 128),
}
GRID = (221, 51)


class _GatherBackward(torch.autograd.Function):
    """The library's previous backward: per-edge messages gathered in chunks."""

    @staticmethod
    def forward(ctx, alpha, v, dst, src, n_dst):
        with torch.no_grad():
            out = edge_sum(alpha, v, dst, src, n_dst)
        ctx.save_for_backward(alpha, v, dst, src)
        return out

    @staticmethod
    def backward(ctx, grad):
        alpha, v, dst, src = ctx.saved_tensors
        g_alpha, g_v = torch.empty_like(alpha), torch.zeros_like(v)
        for s in range(0, dst.numel(), CHUNK):
            d, j = dst[s:s + CHUNK], src[s:s + CHUNK]
            g = grad[d]
            g_alpha[s:s + CHUNK] = (g * v[j]).sum(-1)
            g_v.index_add_(0, j, alpha[s:s + CHUNK, :, None] * g)
        return g_alpha, g_v, None, None, None


def _plain(alpha, v, dst, src, n_dst):
    return v.new_zeros(n_dst, v.shape[1], v.shape[2]).index_add(
        0, dst, alpha.unsqueeze(-1) * v[src])


IMPLS = {"lib": edge_sum, "gather": _GatherBackward.apply, "plain": _plain}


def make_case(name: str, batch: int, seed: int = 0):
    """Graph and tensors of one case: ``alpha [E, H]`` (row-stochastic per destination,
    as after the softmax), ``v [B * N, H, c]``, ``w [B * Nv, H, c]`` (output weights)."""
    stride, quantile, heads, c = CASES[name]
    nx, ny = GRID
    xs, ys = torch.meshgrid(torch.linspace(0, 1, nx), torch.linspace(0, 1, ny), indexing="ij")
    pos = torch.stack([xs.reshape(-1), ys.reshape(-1)], 1)
    n = pos.shape[0]
    b_src = torch.arange(batch).repeat_interleave(n)
    lat = grid_latent(GRID, stride, b_src, batch * n)
    pos_b = pos.repeat(batch, 1)
    k = quantile_k(quantile, n)
    e = knn(pos_b, pos_b[lat], k, b_src, b_src[lat])
    dst, src = e[0], e[1]
    g = torch.Generator().manual_seed(seed)
    alpha = torch.rand(dst.numel(), heads, generator=g)
    alpha = alpha / torch.zeros(lat.numel(), heads).index_add(0, dst, alpha)[dst]
    v = torch.randn(batch * n, heads, c, generator=g)
    w = torch.randn(lat.numel(), heads, c, generator=g)
    return dict(alpha=alpha, v=v, w=w, dst=dst, src=src, n_dst=lat.numel(), k=k,
                n_src=n, n_lat=lat.numel() // batch)


def run_case(case: dict, reps: int, impls) -> dict:
    times = {i: {"fwd": [], "bwd": []} for i in impls}
    for r in range(reps + 1):                          # repetition 0 warms up
        for name in impls:
            alpha = case["alpha"].clone().requires_grad_(True)
            v = case["v"].clone().requires_grad_(True)
            t0 = time.perf_counter()
            out = IMPLS[name](alpha, v, case["dst"], case["src"], case["n_dst"])
            t1 = time.perf_counter()
            (out * case["w"]).sum().backward()
            t2 = time.perf_counter()
            if r:
                times[name]["fwd"].append(t1 - t0)
                times[name]["bwd"].append(t2 - t1)
    return times


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "(uptime not available)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.edge_sum", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated cases")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated implementations")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    impls = args.impls.split(",")
    print(f"# {command('benchmarks.edge_sum', argv)}")
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, float32")
    print(f"# load before: {_uptime()}")
    for name in args.cases.split(","):
        case = make_case(name, args.batch)
        H, c = case["v"].shape[1:]
        print(f"\n{name}: batch {args.batch}, {case['n_src']} -> {case['n_lat']} points per "
              f"sample, k = {case['k']}, E = {case['dst'].numel():,}, H = {H}, c = {c}; "
              f"median of {args.reps} alternating repetitions (min in brackets)")
        times = run_case(case, args.reps, impls)
        print(f"{'impl':8s} {'forward s':>16s} {'backward s':>16s} {'fwd+bwd s':>10s} "
              f"{'bwd/fwd':>8s}")
        med = {}
        for i in impls:
            f, b = statistics.median(times[i]["fwd"]), statistics.median(times[i]["bwd"])
            tot = statistics.median([x + y for x, y in zip(times[i]["fwd"], times[i]["bwd"])])
            med[i] = (f, b, tot)
            print(f"{i:8s} {f:9.4f} ({min(times[i]['fwd']):.4f}) "
                  f"{b:9.4f} ({min(times[i]['bwd']):.4f}) {tot:10.4f} {b / f:8.2f}")
        if "lib" in med:
            for i in impls:
                if i != "lib":
                    print(f"lib vs {i}: backward {med[i][1] / med['lib'][1]:.1f}x faster, "
                          f"fwd+bwd {med[i][2] / med['lib'][2]:.1f}x faster")
    print(f"\n# load after: {_uptime()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
