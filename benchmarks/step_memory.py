"""``python -m benchmarks.step_memory``: the memory estimate ``meshops train`` makes before
training (:mod:`meshops.training.footprint`) against a real training step.

The model is the default slice transformer in 3-D with its inputs' conditioning (width
64, 4 layers, 32 slices, FiLM on the input means), 3 input and 4 output channels; the
samples are ``N`` random points in the unit cube. For each ``N`` and each of
``--paths``: the estimate from the two probes of 16k and 65k points, and the peak
resident memory of one real forward and backward pass on all ``N`` points, measured as
the probes are (:func:`meshops.training.footprint._child_peaks`: a child process,
glibc's mmap threshold fixed, after a warm-up pass at that size); no estimate below
the larger probe's size (``meshops train`` makes none there either). The paths:

* ``plain``: nothing recomputed;
* ``parts``: ``--checkpoint-blocks``, with which the slice transformer runs on parts
  of the points, each recomputed in the backward pass
  (:meth:`meshops.models.SliceTransformer.in_parts`);
* ``blocks``: each block recomputed in one piece (``--checkpoint-blocks`` before the
  parts: the model's part size set beyond ``N``), for comparison.

The optimiser's state is left out of both. Memory is not changed by other processes
on the machine (the load is written down all the same). Writes the output with the
command line to ``--out`` (completely or not at all).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.paths import command

#: ``--paths``: whether the blocks are checkpointed, and on parts of the points.
PATHS = {"plain": (False, True), "parts": (True, True), "blocks": (True, False)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", type=int, nargs="+", default=[200_000, 400_000])
    p.add_argument("--paths", nargs="+", choices=sorted(PATHS), default=["plain", "parts"])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import torch

    from meshops.fitting.defaults import FIELDS_SLICE
    from meshops.fitting.training_run import build_model

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
    log(f"{'points':>9s} {'path':>6s} {'estimate GB':>12s} {'measured GB':>12s} "
        f"{'ratio':>6s} {'kB/point':>9s}")
    for n in args.points:
        for path in args.paths:
            log(_row(model, n, path))
    log(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out is not None:
        from meshops.utils.atomic import atomic_write

        atomic_write(args.out, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    return 0


def _row(model, n: int, path: str) -> str:
    """One line of the table: the estimate and a measured step on ``n`` points."""
    import torch

    from meshops.mesh.data import MeshData
    from meshops.training import footprint
    from meshops.training.dataset import make_loader, prepare_batch

    g = torch.Generator().manual_seed(n)
    sample = MeshData(x=torch.randn(n, 3, generator=g), pos=torch.rand(n, 3, generator=g),
                      weight=torch.rand(n, generator=g) / n, y=torch.randn(n, 4, generator=g))
    batch = prepare_batch(next(iter(make_loader([sample], 1))))
    ck, parts = PATHS[path]
    # an instance attribute: pickled with the model into the measuring child
    model.PART_POINTS = type(model).PART_POINTS if parts else n
    est = footprint.step_memory(model, sample, checkpoint=ck)
    # a real step on all the points, measured as the probes are: in a child
    measured, = footprint._child_peaks(model, [batch], checkpoint=ck)
    est_gb = ratio = "-"   # fewer points than the larger probe: no estimate
    if est is not None:
        predicted = est.bytes(n) - est.optimizer
        est_gb, ratio = f"{predicted / 1e9:.3f}", f"{predicted / measured:.3f}"
    return (f"{n:9,d} {path:>6s} {est_gb:>12s} {measured / 1e9:12.3f} {ratio:>6s} "
            f"{measured / n / 1e3:9.2f}")


if __name__ == "__main__":
    sys.exit(main())
