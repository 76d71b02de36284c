"""``python -m benchmarks.kernel_first_build``: the fused CPU attention kernel's first
compile, as on a machine that has never built it (issue 29).

    python -m benchmarks.kernel_first_build [--repeats 3] [--evict] [--out FILE.txt]

Each repetition runs ``python -m meshops build-kernels`` in a fresh process with
``TORCH_EXTENSIONS_DIR`` set to a new empty folder, so the kernel cache is clean and
the whole build runs: the child's imports, the compile and link of
``meshops/kernels/attention_cpu.cpp`` by ninja and the C++ compiler, and loading the
library. It records the wall time of the command and the build time the command
prints. ``--evict`` first asks the kernel to drop the files the compile reads from
the page cache (``posix_fadvise(DONTNEED)`` on torch's headers and libraries, the
Python headers, the system C++ headers and the compiler's own programs), so they
are read from disk as on a freshly booted machine; without root that is the closest
to a cold machine a script can get, and a virtual machine's host may still cache the
disk. Take the figure on a quiet machine (the repository guide's QUIET protocol); the
output states the load before and after.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from benchmarks.harness import commit, loadavg
from benchmarks.paths import command

REPO = Path(__file__).resolve().parents[1]


def _compiler() -> str:
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout
        return out.splitlines()[0]
    except (OSError, IndexError):
        return "c++ not found"


def compile_inputs() -> list[Path]:
    """The folders and programs a kernel compile reads: torch's headers and libraries,
    Python's headers, the system C++ headers, the compiler's programs."""
    import torch

    torch_dir = Path(torch.__file__).parent
    gcc = subprocess.run(["c++", "-print-prog-name=cc1plus"], capture_output=True,
                         text=True).stdout.strip()
    paths = [torch_dir / "include", torch_dir / "lib", Path(sysconfig.get_paths()["include"]),
             Path("/usr/include"), Path(gcc).parent if gcc else None]
    return [p for p in paths if p and p.exists()]


def evict(paths: list[Path]) -> int:
    """Drop the files under ``paths`` from the page cache; returns how many were asked."""
    n = 0
    for root in paths:
        files = [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file())
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def one_build(evict_first: bool) -> dict:
    """One ``meshops build-kernels`` into an empty cache: wall and reported build seconds."""
    with tempfile.TemporaryDirectory(prefix="meshops-first-build-") as cache:
        evicted = evict(compile_inputs()) if evict_first else 0
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=cache, MESHOPS_KERNELS="1")
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "meshops", "build-kernels"], env=env,
                              capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"meshops build-kernels exited {done.returncode}: "
                         f"{done.stderr.strip()[-500:]}")
    built = re.search(r"built in (\d+) s", done.stdout)
    return {"wall_s": wall, "build_s": float(built.group(1)) if built else None,
            "evicted_files": evicted}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernel_first_build",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="builds, each into a new cache")
    p.add_argument("--evict", action="store_true",
                   help="drop the compile's input files from the page cache before each build")
    p.add_argument("--out", type=Path, default=None, help="also write the output here")
    args = p.parse_args(argv)
    import torch

    lines = [f"# {command('benchmarks.kernel_first_build', argv)}",
             f"# torch {torch.__version__}, {_compiler()}, {platform.machine()}, "
             f"{os.cpu_count()} CPUs, CPU capability {torch.backends.cpu.get_cpu_capability()}",
             f"# meshops {commit()}",
             f"# load before: {loadavg()} (1, 5, 15 min)", ""]
    print("\n".join(lines), flush=True)
    runs = []
    for k in range(args.repeats):
        runs.append(one_build(args.evict))
        r = runs[-1]
        lines.append(f"build {k + 1}: {r['wall_s']:.1f} s wall for `meshops build-kernels` "
                     f"(it reports the compile at {r['build_s']:g} s)"
                     + (f"; {r['evicted_files']} files evicted first" if args.evict else ""))
        print(lines[-1], flush=True)
    walls = [r["wall_s"] for r in runs]
    lines += ["", f"first build into an empty kernel cache: median {statistics.median(walls):.1f} s"
                  f" (min {min(walls):.1f}, max {max(walls):.1f}) over {len(walls)} builds",
              f"# load after: {loadavg()} (1, 5, 15 min)"]
    print("\n".join(lines[-3:]))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
