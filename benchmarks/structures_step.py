"""``python -m benchmarks.structures_step``: a training step of PatchedTransformer and
GalerkinTransformer with their mesh-only structures built in every forward (the library
before issue 13 item 2 reached these models) and stored with the samples
(:meth:`~meshops.models.NeuralOperator.mesh_transform`, built once, timed separately),
alternating in one run.

Configuration (small, a quick check, not a benchmark of record): ``samples`` point
clouds of ``points`` random points in the unit square with ``points // 4`` query points
each, one input and one output channel, batch ``batch``, Adam 1e-3, relative L2 loss at
the query points. ``PatchedTransformer(width=64, layers=4, pattern="alternate",
method="kd", num_patches=16)`` and ``GalerkinTransformer(width=64, layers=4)``. Every
repetition times one full step (forward, backward, optimiser) on the same batch; the
median over repetitions is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch_geometric.data import Batch

from meshops.mesh.data import MeshData
from meshops.models import GalerkinTransformer, PatchedTransformer
from meshops.training.loss import RelativeLpLoss


def _samples(n: int, points: int, seed: int = 0) -> list[MeshData]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        pos = torch.rand(points, 2, generator=g)
        q = torch.rand(points // 4, 2, generator=g)
        out.append(MeshData(pos=pos, weight=torch.full((points,), 1.0 / points),
                            x=torch.randn(points, 1, generator=g), query_pos=q,
                            y=torch.randn(q.shape[0], 1, generator=g)))
    return out


def _step(model, opt, batch, loss_fn) -> float:
    t0 = time.perf_counter()
    opt.zero_grad()
    pred = model(batch)
    loss_fn(pred, batch.y, None, batch.query_pos_batch).backward()
    opt.step()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    models = {
        "patched_transformer": lambda: PatchedTransformer(
            1, 1, width=64, layers=4, heads=4, pattern="alternate", method="kd",
            num_patches=16),
        "galerkin_transformer": lambda: GalerkinTransformer(1, 1, width=64, layers=4, heads=4),
    }
    loss_fn = RelativeLpLoss(quadrature=False)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{args.batch} samples x {args.points} points, {args.reps} repetitions")
    for name, make in models.items():
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        samples = _samples(args.batch, args.points)
        t0 = time.perf_counter()
        transform = model.mesh_transform()
        stored = [transform(s.clone()) for s in samples]
        build = time.perf_counter() - t0
        batches = {"built per step": Batch.from_data_list(samples, follow_batch=["query_pos"]),
                   "stored": Batch.from_data_list(stored, follow_batch=["query_pos"])}
        _step(model, opt, batches["stored"], loss_fn)                  # warm-up
        times: dict[str, list[float]] = {k: [] for k in batches}
        for _ in range(args.reps):
            for k, b in batches.items():                              # alternating
                times[k].append(_step(model, opt, b, loss_fn))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name}: built per step {med['built per step']:.3f} s/step, stored "
              f"{med['stored']:.3f} s/step (x{med['built per step'] / med['stored']:.2f}); "
              f"structures of the {args.batch} samples built once in {build:.3f} s")


if __name__ == "__main__":
    main()
