"""Training steps with glibc's default allocator and with ``meshops.keep_freed_memory()``.

    python -m benchmarks.keep_freed_memory [--n 262144] [--steps 30]

Runs ``--steps`` forward+backward steps of ``GalerkinAttention(64, heads=4)`` on ``--n``
random points, once per allocator setting, each in a fresh interpreter (the setting is
process-wide and cannot be undone), and prints the time per step, the resident memory
every 5 steps and the minor page faults.  It is the trade-off the README states:
fewer page faults and faster steps against a larger resident size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, resource, sys, time, torch
    from meshops.utils.allocator import keep_freed_memory
    from meshops.nn.galerkin import GalerkinAttention
    mode, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if mode == "keep" and not keep_freed_memory():
        raise SystemExit("keep_freed_memory needs glibc")
    def rss_mb():
        with open("/proc/self/status") as fh:
            return next(int(l.split()[1]) // 1024 for l in fh if l.startswith("VmRSS"))
    torch.manual_seed(0)
    att = GalerkinAttention(64, 64, heads=4, pos_dim=2)
    x = torch.randn(n, 64, requires_grad=True)
    pos, w = torch.rand(n, 2), torch.full((n,), 1.0 / n)
    rss, t0 = [], time.perf_counter()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(steps):
        att(x, pos, w).sum().backward()
        x.grad = None
        att.zero_grad(set_to_none=True)
        if i % 5 == 4:
            rss.append(rss_mb())
    print(json.dumps({"mode": mode, "step_s": (time.perf_counter() - t0) / steps, "rss_mb": rss,
                      "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0}))
""")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.keep_freed_memory",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=262144, help="points (default 262144)")
    p.add_argument("--steps", type=int, default=30, help="fwd+bwd steps (default 30)")
    args = p.parse_args(argv)
    print(f"GalerkinAttention(64, heads=4), N={args.n}, {args.steps} fwd+bwd steps")
    print(f"{'allocator':<22} {'s/step':>7} {'page faults':>12}  resident MB every 5 steps")
    for mode, label in (("default", "glibc defaults"), ("keep", "keep_freed_memory()")):
        out = subprocess.run([sys.executable, "-c", CHILD, mode, str(args.n), str(args.steps)],
                             capture_output=True, text=True)
        if out.returncode:
            print(f"{label:<22} failed: {out.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{label:<22} {r['step_s']:7.2f} {r['faults']:12,d}  {r['rss_mb']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
