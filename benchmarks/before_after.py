"""Layer timings of two checkouts, measured alternately in one session, side by side.

    python -m benchmarks.before_after --old OLD1.json OLD2.json --new NEW1.json NEW2.json

Each JSON file is a ``python -m benchmarks --only layers --quick --out F`` run of one
checkout; runs of the two checkouts alternate (old, new, old, new) so that a change of
machine load hits both. For every (case, implementation, N) timed in all runs, prints
the median forward+backward (and forward) time of each side and the ratio new / old,
and the verdict against ``--tolerance`` (default 1.05: nothing more than 5 % slower).
Exit status 1 when some ratio exceeds it.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks.reporting import read_json


def _times(paths: list[str], key: str) -> dict[tuple, list[float]]:
    out: dict[tuple, list[float]] = {}
    for p in paths:
        for r in read_json(p)["results"]:
            if r.get("suite") == "layers" and isinstance(r.get(key), (int, float)):
                out.setdefault((r["case"], r["impl"], r["n"]), []).append(r[key])
    return out


def compare(old: list[str], new: list[str], tolerance: float = 1.05) -> tuple[list[str], bool]:
    lines = [f"{'case':<22} {'impl':<6} {'N':>7}  {'old fwd+bwd':>11} {'new fwd+bwd':>11} "
             f"{'new/old':>7}  {'old fwd':>9} {'new fwd':>9} {'new/old':>7}", "-" * 100]
    ok = True
    fb_old, fb_new = _times(old, "fwdbwd_s"), _times(new, "fwdbwd_s")
    f_old, f_new = _times(old, "fwd_s"), _times(new, "fwd_s")
    for key in sorted(set(fb_old) & set(fb_new)):
        if key[1] != "lib" or len(fb_old[key]) < len(old) or len(fb_new[key]) < len(new):
            continue  # the library's own path, timed in every run
        a, b = statistics.median(fb_old[key]), statistics.median(fb_new[key])
        fa = statistics.median(f_old.get(key, [float("nan")]))
        fb = statistics.median(f_new.get(key, [float("nan")]))
        worst = min(b / a, fb / fa if fa == fa and fb == fb else b / a)
        flag = "" if worst <= tolerance else "  SLOWER"
        ok &= worst <= tolerance
        lines.append(f"{key[0]:<22} {key[1]:<6} {key[2]:>7}  {a * 1e3:>9.2f}ms {b * 1e3:>9.2f}ms "
                     f"{b / a:>7.3f}  {fa * 1e3:>7.2f}ms {fb * 1e3:>7.2f}ms {fb / fa:>7.3f}{flag}")
    return lines, ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.before_after", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", nargs="+", required=True)
    p.add_argument("--new", nargs="+", required=True)
    p.add_argument("--tolerance", type=float, default=1.05)
    args = p.parse_args(argv)
    lines, ok = compare(args.old, args.new, args.tolerance)
    print("\n".join(lines))
    print(f"verdict (a case is slower when both its fwd+bwd and fwd medians exceed "
          f"{args.tolerance:.2f} x old): {'PASS' if ok else 'SLOWER somewhere'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
