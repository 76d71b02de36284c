"""Layer speed of two checkouts, side by side in one run (the issue-14 guard: the
layer-contract refactor may make no layer more than 5 % slower).

    python -m benchmarks.before_after --old-tree DIR [--rounds 3] [--reps 40]
        [--cases position:2048,window:4096] [--out FILE]

``DIR`` is a checkout of the code before the change (e.g. ``git worktree add --detach
/tmp/old REV``); this checkout is the "new" side. For each case, fresh processes of
the two sides alternate (old, new, old, new, ...) ``--rounds`` times; each process
builds the layer of :mod:`benchmarks.layers` (its own tree's version of it), warms up,
and times ``--reps`` forward+backward steps and ``--reps`` forwards (median of each).
The table gives, per side, the best of its rounds' medians (the least disturbed by
other load) and the ratio new / old; a case is flagged when both its fwd+bwd and fwd
ratios exceed ``--tolerance`` (default 1.05). Exit status 1 when any is flagged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.paths import portable

HERE = Path(__file__).resolve().parent.parent
DEFAULT_CASES = ("continuum:4096,galerkin:16384,fourier:4096,position:2048,"
                 "position_batch:1024,position_cross:4096,local_attention:4096,"
                 "local_position_cross:4096,window:4096,token:4096")

_CHILD = r"""
import json, statistics, sys, time, torch
torch.set_num_threads(int(sys.argv[3]))
from benchmarks import layers as L
case, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[4])
run = getattr(L, "build_" + case)(n, "lib", "cpu").forward
def step():
    run().sum().backward()
for _ in range(3):
    step()
fb, f = [], []
for _ in range(reps):
    t = time.perf_counter(); step(); fb.append(time.perf_counter() - t)
with torch.no_grad():
    for _ in range(reps):
        t = time.perf_counter(); run(); f.append(time.perf_counter() - t)
print(json.dumps({"fwdbwd": statistics.median(fb), "fwd": statistics.median(f)}))
"""


def _time(tree: Path, case: str, n: int, threads: int, reps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(threads))
    res = subprocess.run([sys.executable, "-c", _CHILD, case, str(n), str(threads), str(reps)],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if res.returncode:
        raise SystemExit(f"error: {case} {n} in {tree} failed:\n{res.stderr[-1500:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.before_after", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old-tree", type=Path, required=True)
    p.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated case:N")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--tolerance", type=float, default=1.05)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not (args.old_tree / "benchmarks" / "layers.py").is_file():
        p.error(f"{args.old_tree}: not a meshops checkout (no benchmarks/layers.py)")
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",") if c]
    lines = [f"# python -m benchmarks.before_after {' '.join(argv or sys.argv[1:])}",
             f"# old: {args.old_tree.resolve()}  new: {HERE}; {args.threads} threads; best of "
             f"{args.rounds} alternating rounds of {args.reps}-step medians; load "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"{'case':<22} {'N':>7}  {'old fwd+bwd':>11} {'new fwd+bwd':>11} {'ratio':>6}  "
             f"{'old fwd':>9} {'new fwd':>9} {'ratio':>6}", "-" * 92]
    lines = portable(lines, {"$OLD_TREE": args.old_tree})  # the new tree is this checkout: "."
    print("\n".join(lines), flush=True)
    ok = True
    for case, n in cases:
        got = {"old": [], "new": []}
        for _ in range(args.rounds):
            for side, tree in (("old", args.old_tree), ("new", HERE)):
                got[side].append(_time(tree, case, n, args.threads, args.reps))
        best = {s: {k: min(r[k] for r in rs) for k in ("fwdbwd", "fwd")} for s, rs in got.items()}
        r_fb = best["new"]["fwdbwd"] / best["old"]["fwdbwd"]
        r_f = best["new"]["fwd"] / best["old"]["fwd"]
        slower = min(r_fb, r_f) > args.tolerance
        ok &= not slower
        line = (f"{case:<22} {n:>7}  {best['old']['fwdbwd'] * 1e3:>9.2f}ms "
                f"{best['new']['fwdbwd'] * 1e3:>9.2f}ms {r_fb:>6.3f}  "
                f"{best['old']['fwd'] * 1e3:>7.2f}ms {best['new']['fwd'] * 1e3:>7.2f}ms "
                f"{r_f:>6.3f}{'  SLOWER' if slower else ''}")
        print(line, flush=True)
        lines.append(line)
    verdict = (f"verdict: {'PASS' if ok else 'SLOWER'} (a case is slower when both its ratios "
               f"exceed {args.tolerance:.2f})")
    print(verdict)
    lines.append(verdict)
    if args.out is not None:
        from meshops.utils.atomic import atomic_write
        atomic_write(args.out, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
