"""``python -m benchmarks.pit_step``: a PiT training step at issue 13's configuration,
before and after its items 1 and 2, alternating in one run.

Configuration (issue 13): NACA-layout samples (221 x 51 C-grids, written as in
:mod:`benchmarks.loading` and read with :func:`data_adapters.load_naca`), geometry
input, Mach target; ``PiT(0, 1, width=128, heads=1, blocks=4, latent="grid",
stride=4, quantile_in=0.02, quantile_out=0.02, ball="count")``, batch 20, Adam 1e-3,
unweighted mean squared error. Variants, each timed for one full step (forward,
backward, optimiser) per repetition, in turn:

* ``gather-bwd``: the local layers' edge sums with the previous backward (per-edge
  messages gathered in chunks, :class:`benchmarks.edge_sum._GatherBackward`), mesh
  structures built in every forward: the library before issue 13;
* ``csr-bwd``: the current edge-sum backward (transposed CSR product and SDDMM);
* ``csr-bwd+structures``: and the samples carry PiT's mesh structures
  (:meth:`~meshops.models.PiT.mesh_transform`)
  (built once, timed separately), so forward does no neighbour search.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch_geometric.data import Batch

import meshops.nn.local as local_mod
from benchmarks.edge_sum import _GatherBackward, _uptime
from benchmarks.loading import write_naca
from benchmarks.paths import command
from data_adapters import load_naca
from meshops.models.pit import PiT


@contextmanager
def _gather_backward():
    lib = local_mod.edge_sum
    local_mod.edge_sum = _GatherBackward.apply
    try:
        yield
    finally:
        local_mod.edge_sum = lib


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pit_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    print(f"# {command('benchmarks.pit_step', argv)}")
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"# load before: {_uptime()}")
    with tempfile.TemporaryDirectory() as tmp:
        write_naca(Path(tmp), args.batch, shapes=min(args.batch, 40))
        data = load_naca(tmp, "all")
    torch.manual_seed(0)
    model = PiT(0, 1, width=128, heads=1, blocks=4, latent="grid", grid_shape=[221, 51],
                stride=4, quantile_in=0.02, quantile_out=0.02, ball="count")
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    transform = model.mesh_transform()
    t0 = time.perf_counter()
    pre = [transform(d.clone()) for d in data]
    t_struct = (time.perf_counter() - t0) / len(data)
    plain, cached = Batch.from_data_list(data), Batch.from_data_list(pre)

    def step(batch):
        opt.zero_grad()
        loss = ((model(batch) - batch.y) ** 2).mean()
        loss.backward()
        opt.step()

    def gather(batch):
        with _gather_backward():
            step(batch)

    variants = {"gather-bwd": (gather, plain), "csr-bwd": (step, plain),
                "csr-bwd+structures": (step, cached)}
    times = {k: [] for k in variants}
    for r in range(args.reps + 1):                       # repetition 0 warms up
        for name, (fn, batch) in variants.items():
            t0 = time.perf_counter()
            fn(batch)
            if r:
                times[name].append(time.perf_counter() - t0)
    print(f"\nbatch {args.batch}, {len(data[0].pos)} points per sample; median of {args.reps} "
          f"alternating repetitions (all steps in brackets)")
    base = statistics.median(times["gather-bwd"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:20s} {med:7.2f} s/step  ({', '.join(f'{t:.2f}' for t in ts)})  "
              f"{base / med:5.2f}x of gather-bwd")
    print(f"mesh structures: {t_struct * 1e3:.0f} ms per sample, once")
    print(f"# load after: {_uptime()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
