"""``python -m benchmarks.large_data``: ``meshops train --lazy`` on a folder larger than
this machine's memory, and a warm-cache lazy epoch against an in-memory one.

Subcommands (results to stdout; the command line and the load average first):

* ``write --root R --gb 27``: ``R/data/m_00000.vtu ...``, meshes of ``--cells``
  squared quads split in triangles (30,276 points with the default 173), their interior
  nodes moved at random, input ``f`` and target ``u`` (float64, uncompressed binary
  VTU as solvers write it, about 4.8 MB a mesh), until the folder holds ``--gb``
  gigabytes. Refused when it would leave less than ``--keep-free`` GB on the disk.
  Written once (``R/data/.complete``).
* ``big --root R``: ``meshops train --lazy`` on all of ``R/data`` (one epoch, a small
  PiT; cache ``R/cache``): the peak memory of the command's processes (the largest sum
  of their proportional set sizes, sampled every 0.1 s) and its times.
* ``compare --root R --subset N --rounds 3``: the first ``N`` meshes (links in
  ``R/subset-N``), a warm cache, then ``--rounds`` times a lazy epoch and an in-memory
  epoch, alternating (each a ``meshops train --epochs 1`` process; the epoch time is
  its ``history.json``'s ``time_s``, training plus validation).
* ``profile --root R --subset N``: where a lazy epoch's time goes, without the model:
  reading an entry (the file with its CRC, then unpacking), collating a
  batch, a DataLoader with 0, 1 and 2 workers, against the model's step on a batch.

The folders are large: delete ``R`` when done.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.lazy_data import epoch_time, run
from benchmarks.paths import command, portable

MODEL = ["--model", "pit", "--model-config", "width=16", "blocks=1", "num_latent=64"]
TRAIN = ["--inputs", "f", "--targets", "u", *MODEL, "--epochs", "1", "--batch-size", "4",
         "--val-fraction", "0.02", "--seed", "0", "--logger", "none"]


def _grid(cells: int):
    g = np.linspace(0.0, 1.0, cells + 1)
    base = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    idx = np.arange((cells + 1) ** 2).reshape(cells + 1, cells + 1)
    q = np.stack([idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]], -1).reshape(-1, 4)
    return base, np.concatenate([q[:, [0, 1, 2]], q[:, [0, 2, 3]]])


def write(root: Path, gb: float, cells: int, keep_free: float) -> Path:
    """The folder of meshes (see the module docstring); kept when complete."""
    import meshio

    data = root / "data"
    done = data / ".complete"
    if done.is_file():
        return data
    data.mkdir(parents=True, exist_ok=True)
    base, tri = _grid(cells)
    inner = ((base > 0) & (base < 1)).all(1)
    rng = np.random.default_rng(0)
    total, k = sum(p.stat().st_size for p in data.glob("*.vtu")), len(list(data.glob("*.vtu")))
    probe = None
    while total < gb * 1e9:
        if probe is not None and shutil.disk_usage(data).free - probe < keep_free * 1e9:
            raise SystemExit(f"stopped at {total / 1e9:.1f} GB: another mesh would leave less "
                             f"than {keep_free:g} GB free")
        pts = base.copy()
        pts[inner] += rng.uniform(-0.2, 0.2, (int(inner.sum()), 2)) / cells
        a, b = rng.uniform(0.5, 2.0, 2)
        f = np.sin(a * np.pi * pts[:, 0]) * np.cos(b * np.pi * pts[:, 1])
        u = f * pts[:, 1] + 0.5 * pts[:, 0] ** 2 + 0.1
        path = data / f"m_{k:05d}.vtu"
        tmp = path.with_suffix(".tmp.vtu")
        meshio.write(tmp, meshio.Mesh(np.c_[pts, np.zeros(len(pts))], [("triangle", tri)],
                                      point_data={"f": f, "u": u}),
                     binary=True, compression=None)
        os.replace(tmp, path)
        probe = path.stat().st_size
        total += probe
        k += 1
        if k % 500 == 0:
            print(f"# {k} meshes, {total / 1e9:.1f} GB", flush=True)
    done.write_text(f"{k} meshes, {total} bytes\n")
    return data


def subset(root: Path, n: int) -> Path:
    """``R/subset-N``: links to the first ``n`` meshes."""
    out = root / f"subset-{n}"
    files = sorted((root / "data").glob("m_*.vtu"))[:n]
    if out.is_dir() and len(list(out.glob("*.vtu"))) == n:
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for f in files:
        (out / f.name).symlink_to(f)
    return out


def _meshops(data: Path, out: Path, *extra) -> list[str]:
    shutil.rmtree(out, ignore_errors=True)
    return [sys.executable, "-m", "meshops", "train", "--data", str(data), *TRAIN, *extra,
            "--out", str(out)]


def _load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def big(root: Path, workers: int) -> None:
    data = root / "data"
    n = len(list(data.glob("m_*.vtu")))
    size = sum(p.stat().st_size for p in data.glob("m_*.vtu"))
    print(f"# {n} meshes, {size / 1e9:.1f} GB ({size / 2 ** 30:.1f} GiB); memory "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2 ** 30:.1f} GiB")
    for name in ("cold", "warm"):
        out = root / f"run-big-{name}"
        peak, wall, text = run(_meshops(data, out, "--lazy", "--cache", str(root / "cache"),
                                        "--workers", str(workers)))
        print(f"lazy {name}: peak PSS {peak / 2 ** 30:.2f} GiB, wall {wall:.0f} s, epoch "
              f"{epoch_time(out):.0f} s", flush=True)
        print(portable("\n".join("#   " + ln for ln in text.splitlines()
                                 if "Warning" not in ln and ln.strip())[-2000:],
                       {"$ROOT": root}))


def compare(root: Path, n: int, rounds: int, workers: int) -> None:
    data = subset(root, n)
    cache = root / f"cache-subset-{n}"
    run(_meshops(data, root / "run-subset-build", "--lazy", "--cache", str(cache),
                 "--workers", str(workers)))  # builds the cache (not timed)
    times: dict[str, list[float]] = {"lazy warm": [], "in memory": []}
    for r in range(rounds):
        for name, extra in (("lazy warm", ["--lazy", "--cache", str(cache), "--workers",
                                           str(workers)]), ("in memory", ["--no-lazy"])):
            out = root / f"run-subset-{name.replace(' ', '-')}"
            peak, wall, _ = run(_meshops(data, out, *extra))
            times[name].append(epoch_time(out))
            print(f"round {r + 1} {name:<10} epoch {times[name][-1]:7.1f} s  peak PSS "
                  f"{peak / 2 ** 30:.2f} GiB  wall {wall:.0f} s  (load {_load()})", flush=True)
    lazy, mem = statistics.median(times["lazy warm"]), statistics.median(times["in memory"])
    print(f"median epoch: lazy warm {lazy:.1f} s, in memory {mem:.1f} s: ratio "
          f"{lazy / mem:.3f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["write", "big", "compare", "profile"])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--gb", type=float, default=27.0)
    ap.add_argument("--cells", type=int, default=173)
    ap.add_argument("--keep-free", type=float, default=25.0)
    ap.add_argument("--subset", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    roots = {"$ROOT": args.root}  # what is printed (and stored) names the data by it
    print("# " + command("benchmarks.large_data", argv, roots))
    print(f"# load before: {_load()} on {os.cpu_count()} cores", flush=True)
    t0 = time.perf_counter()
    if args.what == "write":
        data = write(args.root, args.gb, args.cells, args.keep_free)
        print(portable(f"# {data}: {(data / '.complete').read_text().strip()} "
                       f"({time.perf_counter() - t0:.0f} s)", roots))
    elif args.what == "big":
        big(args.root, args.workers)
    elif args.what == "compare":
        compare(args.root, args.subset, args.rounds, args.workers)
    else:
        from benchmarks.large_data_profile import profile

        profile(subset(args.root, args.subset), args.root / f"cache-subset-{args.subset}",
                args.workers, roots)
    print(f"# load after: {_load()}")


if __name__ == "__main__":
    main()
