"""``python -m benchmarks.step_memory``: the memory estimate ``meshops train`` makes before
training (:mod:`meshops.training.footprint`) against a real training step.

The model is the default slice transformer in 3-D with its inputs' conditioning (width
64, 4 layers, 32 slices, FiLM on the input means), 3 input and 4 output channels; the
samples are ``N`` random points in the unit cube. For each ``N`` and with the blocks
checkpointed or not: the estimate from the two probes of 16k and 65k points, and the
peak resident memory of one real forward and backward pass on all ``N`` points,
measured as the probes are (:func:`meshops.training.footprint._child_peaks`: a child
process, glibc's mmap threshold fixed, after a warm-up pass at that size). The
optimiser's state is left out of both.
Writes the output with the command line to ``--out`` (completely or not at all).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.paths import command


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", type=int, nargs="+", default=[200_000, 400_000])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import torch

    from meshops.fitting.defaults import FIELDS_SLICE
    from meshops.fitting.training_run import build_model
    from meshops.mesh.data import MeshData
    from meshops.training import footprint
    from meshops.training.dataset import make_loader, prepare_batch

    torch.set_num_threads(1)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    log(f"command: {command('benchmarks.step_memory', argv)}")
    log(f"torch {torch.__version__}, {os.cpu_count()} CPUs; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    torch.manual_seed(0)
    model = build_model("slice_transformer", dict(FIELDS_SLICE, condition_on_inputs=True),
                        3, 4, 3)
    log(f"{'points':>9s} {'checkpointed':>12s} {'estimate GB':>12s} {'measured GB':>12s} "
        f"{'ratio':>6s} {'kB/point':>9s}")
    for n in args.points:
        g = torch.Generator().manual_seed(n)
        sample = MeshData(x=torch.randn(n, 3, generator=g), pos=torch.rand(n, 3, generator=g),
                          weight=torch.rand(n, generator=g) / n,
                          y=torch.randn(n, 4, generator=g))
        batch = prepare_batch(next(iter(make_loader([sample], 1))))
        for ck in (False, True):
            est = footprint.step_memory(model, sample, checkpoint=ck)
            predicted = est.bytes(n) - est.optimizer
            # a real step on all the points, measured as the probes are: in a child
            measured, = footprint._child_peaks(model, [batch], checkpoint=ck)
            log(f"{n:9,d} {str(ck):>12s} {predicted / 1e9:12.3f} {measured / 1e9:12.3f} "
                f"{predicted / measured:6.3f} {measured / n / 1e3:9.2f}")
    if args.out is not None:
        from meshops.utils.atomic import atomic_write

        atomic_write(args.out, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
