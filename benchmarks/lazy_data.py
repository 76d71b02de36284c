"""``python -m benchmarks.lazy_data``: peak memory and epoch time of ``meshops train``
on folders of 1,000 and 10,000 meshes, read lazily through the on-disk cache
(``--cache``) and in memory (``--no-lazy``).

Each folder holds ``N`` small meshes (a perturbed, triangulated unit square of
``cells x cells`` cells, 121 points by default; input ``f``, target ``u``), written
once into ``--root`` and reused. For every size the benchmark runs, each as a separate
``meshops train`` process:

1. ``lazy cold``: ``--cache`` into an empty cache folder, one epoch (the cache is built
   in ``--workers`` processes first);
2. ``lazy warm``: the same command again, the cache complete;
3. ``in memory``: ``--no-lazy`` (every sample and its mesh structures in the process).

Peak memory is the largest sum over the command's process tree (the main process and
its DataLoader workers) of the proportional set size (PSS: pages shared by forked
workers counted once), sampled every 0.1 s from ``/proc``; the epoch time is the
``time_s`` of the run's ``history.json`` (training plus validation). The model is a
small PiT (width 16, 1 block, 32 latent points), batch 32, seed 0, one epoch, 10 %
validation: the per-step compute is small, so the reading is as visible as it gets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.paths import command

MODEL = ["--model", "pit", "--model-config", "width=16", "blocks=1", "num_latent=32"]


def write_folder(root: Path, n: int, cells: int) -> Path:
    """``n`` meshes ``root/m_00000.vtu ...`` (kept when already complete)."""
    from meshops.mesh.io import mesh_from_arrays, write_mesh

    root.mkdir(parents=True, exist_ok=True)
    done = root / ".complete"
    if done.is_file() and done.read_text() == f"{n} {cells}":
        return root
    g = np.linspace(0.0, 1.0, cells + 1)
    base = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    idx = np.arange((cells + 1) ** 2).reshape(cells + 1, cells + 1)
    q = np.stack([idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]], -1).reshape(-1, 4)
    tri = np.concatenate([q[:, [0, 1, 2]], q[:, [0, 2, 3]]])
    inner = ((base > 0) & (base < 1)).all(1)
    rng = np.random.default_rng(0)
    for k in range(n):
        pts = base.copy()
        pts[inner] += rng.uniform(-0.2, 0.2, (int(inner.sum()), 2)) / cells
        a, b = rng.uniform(0.5, 2.0, 2)
        f = np.sin(a * np.pi * pts[:, 0]) * np.cos(b * np.pi * pts[:, 1])
        u = f * pts[:, 1] + 0.5 * pts[:, 0] ** 2 + 0.1
        write_mesh(root / f"m_{k:05d}.vtu", mesh_from_arrays(pts, [("triangle", tri)],
                                                              {"f": f, "u": u}))
    done.write_text(f"{n} {cells}")
    return root


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc/*/stat)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(cmd: list[str]) -> tuple[int, float, str]:
    """Run ``cmd``; ``(peak PSS bytes of its process tree, wall seconds, output)``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], sum(_pss(p) for p in _tree(proc.pid)))
            stop.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out = proc.communicate()[0]
    stop.set()
    t.join()
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{out}")
    return peak[0], time.perf_counter() - t0, out


def epoch_time(run_dir: Path) -> float:
    return json.loads((run_dir / "history.json").read_text())[-1]["time_s"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--cells", type=int, default=10, help="cells per side (default 10: 121 points)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--root", default="/tmp/meshops-lazy-bench",
                    help="where the folders, caches and runs go (the folders are reused)")
    ap.add_argument("--modes", nargs="+", default=["cold", "warm", "memory"],
                    choices=["cold", "warm", "memory"],
                    help="which runs (warm alone reuses the cache of an earlier run)")
    args = ap.parse_args(argv)
    root = Path(args.root)
    print("# " + command("benchmarks.lazy_data", argv, {"$ROOT": args.root}))
    print(f"# load before: {os.popen('uptime').read().strip()}")
    rows = []
    for n in args.sizes:
        t0 = time.perf_counter()
        data = write_folder(root / f"data-{n}", n, args.cells)
        print(f"# folder of {n} meshes ready in {time.perf_counter() - t0:.0f} s "
              f"({sum(p.stat().st_size for p in data.glob('*.vtu')) / 1e6:.0f} MB)", flush=True)
        cache = root / f"cache-{n}"
        if "cold" in args.modes:
            shutil.rmtree(cache, ignore_errors=True)
        base = [sys.executable, "-m", "meshops", "train", "--data", str(data), "--inputs", "f",
                "--targets", "u", *MODEL, "--epochs", "1", "--batch-size", str(args.batch_size),
                "--val-fraction", "0.1", "--seed", "0"]
        lazy = ["--cache", str(cache), "--workers", str(args.workers)]
        modes = [(name, extra) for key, name, extra in (
            ("cold", "lazy cold", lazy), ("warm", "lazy warm", lazy),
            ("memory", "in memory", ["--no-lazy"])) if key in args.modes]
        for name, extra in modes:
            out = root / f"run-{n}-{name.replace(' ', '-')}"
            shutil.rmtree(out, ignore_errors=True)
            peak, wall, _ = run(base + extra + ["--out", str(out)])
            rows.append((n, name, peak, wall, epoch_time(out)))
            print(f"{n:>6} meshes  {name:<10} peak PSS {peak / 2**20:8.0f} MiB  "
                  f"wall {wall:7.1f} s  epoch {rows[-1][4]:7.1f} s", flush=True)
    print("\nsummary")
    by = {(n, m): (p, w, e) for n, m, p, w, e in rows}
    for m in ("lazy warm", "in memory"):
        sizes = [n for n in args.sizes if (n, m) in by]
        if len(sizes) >= 2:
            a, b = sizes[0], sizes[-1]
            print(f"{m:<10} peak PSS x{by[(b, m)][0] / by[(a, m)][0]:.2f} from {a} to {b} meshes")
    for n in args.sizes:
        if (n, "in memory") in by:
            print(f"{n:>6} meshes: warm lazy epoch / in-memory epoch = "
                  f"{by[(n, 'lazy warm')][2] / by[(n, 'in memory')][2]:.2f}")
    print(f"# load after: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
