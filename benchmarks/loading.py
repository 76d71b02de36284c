"""``python -m benchmarks.loading``: time the Geo-FNO readers on files of the benchmarks' size.

Writes, into a temporary folder, 1,200 samples in the NACA layout
(``NACA_Cylinder_{X,Y,Q}.npy``, 221 x 51 C-grids from
:func:`data_adapters.standins.cgrid.c_grid` round NACA 4-digit airfoils: 40 shapes,
each sample a slightly scaled copy of one, so all 1,200 grids differ) and 2,000 in the
Elasticity layout (``Random_UnitCell_{XY,sigma,rr}_10.npy``: 972 points of the unit
cell outside a star-shaped void of 42 radii, denser near the void), then times
:func:`data_adapters.load_naca` and :func:`data_adapters.load_elasticity` on all of
them (issue 13: each under 10 s). Wall time and the process's CPU time are printed:
on a shared machine the CPU time is what an idle one would take as wall time (the
readers are single-threaded numpy).

With ``--compare N`` (default 60) the NACA reader's per-cell path (quadrature of
:func:`meshops.mesh.io.mesh_from_arrays`, the only path before issue 13) and its vectorised
path are timed on the same N samples, alternating in blocks of 10.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.paths import command
from data_adapters import load_elasticity, load_naca
from data_adapters.elasticity import RR_FILE, SIGMA_FILE, XY_FILE
from data_adapters.naca import Q_FILE, X_FILE, Y_FILE, NacaDataset
from data_adapters.standins.cgrid import c_grid
from data_adapters.standins.naca4 import naca4

TARGET_S = 10.0


def write_naca(root: Path, n: int, shapes: int = 40) -> None:
    """``n`` samples of 221 x 51 C-grids (141 airfoil nodes, 40 wake nodes per side)."""
    grids = [c_grid(naca4(0.01 * (k % 4), 0.4, 0.09 + 0.003 * k, 71), 40, 51)
             for k in range(shapes)]
    s = np.arange(n)
    scale = (1 + 1e-4 * s)[:, None, None]
    X = np.stack([grids[k % shapes][0] for k in s]) * scale
    Y = np.stack([grids[k % shapes][1] for k in s]) * scale
    r = np.hypot(X - 0.5, Y)
    Q = np.stack([1 + 0.1 * np.exp(-r), 0.5 + 0.1 * X, 0.05 * Y, 1 / 1.4 + 0.02 * X * Y,
                  0.6 + 0.3 * np.exp(-r ** 2)], axis=1)
    for name, a in ((X_FILE, X), (Y_FILE, Y), (Q_FILE, Q)):
        np.save(root / name, a)


def write_elasticity(root: Path, n: int, points: int = 972, seed: int = 0) -> None:
    """``n`` point clouds of the unit cell minus a void ``r(theta) = r0 + a cos(3 theta + p)``
    (96 nodes on the void, 100 on the sides, the rest uniform outside the void, a third
    of them in a band near it), points-first as the benchmark files."""
    rng = np.random.default_rng(seed)
    r0, amp, phase = rng.uniform(0.2, 0.3, n), rng.uniform(0.0, 0.05, n), rng.uniform(0, 6, n)
    radius = lambda th, s: r0[s] + amp[s] * np.cos(3 * th + phase[s])  # noqa: E731
    theta = np.linspace(0, 2 * np.pi, 42)
    rr = np.stack([radius(theta, s) for s in range(n)], axis=1)          # (42, n), closed
    u = np.arange(25) / 25
    sides = np.concatenate([np.stack([u, 0 * u], 1), np.stack([1 + 0 * u, u], 1),
                            np.stack([1 - u, 1 + 0 * u], 1), np.stack([0 * u, 1 - u], 1)])
    XY = np.empty((points, 2, n))
    th_void = np.linspace(0, 2 * np.pi, 96, endpoint=False)
    n_band = (points - 196) // 3
    for s in range(n):
        void = 0.5 + radius(th_void, s)[:, None] * np.stack([np.cos(th_void), np.sin(th_void)], 1)
        th = rng.uniform(0, 2 * np.pi, n_band)
        band = 0.5 + (radius(th, s) + rng.uniform(0.003, 0.05, n_band))[:, None] \
            * np.stack([np.cos(th), np.sin(th)], 1)
        q = rng.uniform(0.01, 0.99, (4 * points, 2))
        d = q - 0.5
        q = q[np.hypot(d[:, 0], d[:, 1]) > radius(np.arctan2(d[:, 1], d[:, 0]), s) + 0.05]
        rest = q[:points - 196 - n_band]
        XY[:, :, s] = np.concatenate([void, sides, band, rest])
    sigma = XY[:, 0] + 2 * XY[:, 1] ** 2
    for name, a in ((XY_FILE, XY), (SIGMA_FILE, sigma), (RR_FILE, rr)):
        np.save(root / name, a)


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "(uptime not available)"


def compare_naca(root: Path, n: int) -> None:
    ds = NacaDataset(root, "all")
    per_cell = [0.0, 0.0]
    fast = [0.0, 0.0]
    for a in range(0, n, 10):
        block = range(a, min(n, a + 10))

        def old():
            for s in block:
                X = np.array(ds.X[s], dtype=np.float64)
                Y = np.array(ds.Y[s], dtype=np.float64)
                ds._sample_per_cell(s, np.stack([X.ravel(), Y.ravel()], 1),
                                    np.array(ds.Q[s], dtype=np.float64), f"sample {s}")

        for acc, fn in ((per_cell, old), (fast, lambda: [ds.sample(s) for s in block])):
            _, wall, cpu = _timed(fn)
            acc[0] += wall
            acc[1] += cpu
    print(f"NACA per sample, same {n} samples alternating in blocks of 10: per-cell path "
          f"{per_cell[0] / n * 1e3:.1f} ms wall ({per_cell[1] / n * 1e3:.1f} ms CPU), "
          f"vectorised {fast[0] / n * 1e3:.1f} ms wall ({fast[1] / n * 1e3:.1f} ms CPU): "
          f"{per_cell[1] / fast[1]:.1f}x less CPU")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loading", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--naca", type=int, default=1200, help="NACA samples (default 1200)")
    p.add_argument("--elasticity", type=int, default=2000,
                   help="Elasticity samples (default 2000)")
    p.add_argument("--compare", type=int, default=60,
                   help="NACA samples for the per-cell vs vectorised comparison (0: skip)")
    args = p.parse_args(argv)
    print(f"# {command('benchmarks.loading', argv)}")
    print(f"# load before: {_uptime()}")
    with tempfile.TemporaryDirectory() as tmp:
        naca, el = Path(tmp) / "naca", Path(tmp) / "elasticity"
        naca.mkdir()
        el.mkdir()
        _, wall, _ = _timed(lambda: write_naca(naca, args.naca))
        print(f"wrote {args.naca} NACA samples in {wall:.1f} s")
        _, wall, _ = _timed(lambda: write_elasticity(el, args.elasticity))
        print(f"wrote {args.elasticity} Elasticity samples in {wall:.1f} s")
        if args.compare:
            compare_naca(naca, min(args.compare, args.naca))
        rows = []
        n_test = min(200, args.elasticity // 2)
        for name, n, fn in (("load_naca", args.naca, lambda: load_naca(naca, "all")),
                            ("load_elasticity", args.elasticity,
                             lambda: load_elasticity(el, "all", n_train=args.elasticity - n_test,
                                                     n_test=n_test))):
            out, wall, cpu = _timed(fn)
            assert len(out) == n
            rows.append((name, n, wall, cpu))
            del out
        print(f"{'reader':16s} {'samples':>7s} {'wall s':>8s} {'CPU s':>8s} "
              f"{'ms/sample (CPU)':>16s}  target < {TARGET_S:.0f} s")
        for name, n, wall, cpu in rows:
            ok = "met" if cpu < TARGET_S else "MISSED"
            ok += "" if wall < TARGET_S else " in CPU time (wall time over it on this load)"
            print(f"{name:16s} {n:7d} {wall:8.2f} {cpu:8.2f} {cpu / n * 1e3:16.2f}  {ok}")
    print(f"# load after: {_uptime()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
