"""``python -m benchmarks.chunked_predict``: peak memory of a prediction on meshes of up
to 5 million points, in chunks (:func:`meshops.inference.chunked.predict_chunked`) and in one piece
(``model.predict``), each case in its own process.

The mesh is a uniform ``s x s`` grid of the unit square (``s = round(sqrt(N))``), nodal
weights ``1 / N``, input ``x = sin(2 pi x) cos(2 pi y)``, float32. The model is a PiT
with the ``"large"`` preset's latent mesh and balls (2,048 FPS latent points, quantiles
0.005 in / 0.01 out) at width 32, 2 heads, 2 blocks, seed 0, untrained (memory and
time do not depend on the weights). Per case: the resident memory before the
prediction (Python, torch, the model, the input arrays), the peak resident memory of the
process (``ru_maxrss``) and the wall time; ``--budget-gib`` is the memory the chunked
cases must stay under. With ``--compare`` the chunked and one-piece predictions of the
same mesh are compared (largest difference relative to the largest value).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.paths import command


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def case(points: int, chunk: int, seed: int = 0, save: str | None = None) -> dict:
    import torch

    from meshops.inference.chunked import predict_chunked
    from meshops.mesh.data import MeshData
    from meshops.models import PiT

    torch.manual_seed(seed)
    s = round(points ** 0.5)
    g = torch.linspace(0, 1, s)
    pos = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    n = pos.shape[0]
    x = (torch.sin(2 * torch.pi * pos[:, :1]) * torch.cos(2 * torch.pi * pos[:, 1:]))
    data = MeshData(pos=pos, weight=torch.full((n,), 1.0 / n), x=x)
    model = PiT(1, 1, width=32, heads=2, blocks=2, latent="fps", num_latent=2048,
                quantile_in=0.005, quantile_out=0.01).eval()
    before = _rss()
    t0 = time.perf_counter()
    out = (predict_chunked(model, data, chunk, progress=False) if chunk
           else model.predict(data))
    wall = time.perf_counter() - t0
    if save:
        torch.save(out, save)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"points": n, "chunk": chunk, "before": before, "peak": peak, "wall": wall,
            "threads": torch.get_num_threads()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, nargs="+", default=[200_000, 1_000_000, 5_000_000])
    ap.add_argument("--chunk", type=int, default=65536)
    ap.add_argument("--one-piece", type=int, nargs="*", default=[200_000, 1_000_000],
                    help="sizes also predicted in one piece")
    ap.add_argument("--budget-gib", type=float, default=2.0)
    ap.add_argument("--compare", action="store_true",
                    help="compare chunked and one-piece outputs where both ran")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        n, chunk, save = json.loads(args.case)
        print(json.dumps(case(n, chunk, save=save)))
        return
    print(f"# {command('benchmarks.chunked_predict', argv)}")
    print(f"# load before: {os.popen('uptime').read().strip()}")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    rows = []
    for n in args.points:
        for chunk in ([args.chunk] + ([0] if n in args.one_piece else [])):
            save = str(tmp / f"chunked-{n}-{chunk}.pt") if args.compare else None
            res = subprocess.run([sys.executable, "-m", "benchmarks.chunked_predict", "--case",
                                  json.dumps([n, chunk, save])], capture_output=True,
                                 text=True, env=env)
            if res.returncode:
                print(f"{n:>9} points  chunk {chunk or 'none':>6}  failed: "
                      f"{res.stderr.strip().splitlines()[-1]}", flush=True)
                continue
            r = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append(r)
            ok = "" if not chunk else ("  within budget" if r["peak"] <= args.budget_gib * 2**30
                                       else "  OVER BUDGET")
            print(f"{r['points']:>9} points  chunk {chunk or 'none':>6}  before "
                  f"{r['before'] / 2**30:5.2f} GiB  peak {r['peak'] / 2**30:5.2f} GiB  "
                  f"(+{(r['peak'] - r['before']) / 2**30:5.2f})  {r['wall']:7.1f} s{ok}",
                  flush=True)
        if args.compare and n in args.one_piece:
            import torch

            a = torch.load(tmp / f"chunked-{n}-{args.chunk}.pt")
            b = torch.load(tmp / f"chunked-{n}-0.pt")
            print(f"{n:>9} points  chunked vs one piece: max |diff| / max |value| = "
                  f"{float((a - b).abs().max() / b.abs().max()):.1e} (float32)")
    print(f"# budget {args.budget_gib:g} GiB for the chunked cases; torch threads "
          f"{rows[0]['threads'] if rows else '?'}")
    print(f"# load after: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
