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
on the machine (the load is written down all the same).

With ``--time``, each row also times a whole training step (forward, backward and the
AdamW step, one thread, in this process): the median of ``--repeats`` steps after a
warm-up one, in seconds and per point. Times are figures only on a quiet machine: the
load average before and after is written beside them. Writes the output with the
command line to ``--out`` (completely or not at all) and, with ``--plot``, the memory
and time per point against the number of points into a PNG.
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
    p.add_argument("--time", action="store_true", help="time a training step too")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per row (--time)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="PNG of the rows")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
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
        f"{'ratio':>6s} {'kB/point':>9s}" + (f" {'s/step':>8s} {'us/point':>9s}"
                                              if args.time else ""))
    rows = []
    for n in args.points:
        for path in args.paths:
            rows.append(_row(model, n, path, args.repeats if args.time else 0))
            log(rows[-1]["line"])
    log(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    from meshops.utils.atomic import atomic_write

    if args.out is not None:
        atomic_write(args.out, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    if args.plot is not None:
        atomic_write(args.plot, lambda tmp: _plot(rows, tmp))
    return 0


def _row(model, n: int, path: str, repeats: int) -> dict:
    """One row of the table: the estimate and a measured step on ``n`` points, and with
    ``repeats`` the median seconds of that many training steps."""
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
    line = (f"{n:9,d} {path:>6s} {est_gb:>12s} {measured / 1e9:12.3f} {ratio:>6s} "
            f"{measured / n / 1e3:9.2f}")
    seconds = _step_seconds(model, batch, ck, repeats) if repeats else None
    if seconds is not None:
        line += f" {seconds:8.2f} {seconds / n * 1e6:9.2f}"
    return {"points": n, "path": path, "bytes": measured, "seconds": seconds, "line": line}


def _step_seconds(model, batch, checkpoint: bool, repeats: int) -> float:
    """Median seconds of a training step (forward, backward, AdamW) on ``batch``, after
    a warm-up step, of a copy of ``model`` (the model itself is left as it was)."""
    import copy
    import statistics
    import time

    import torch

    from meshops.training.loss import RelativeLpLoss
    from meshops.training.trainer import targets_of

    work = copy.deepcopy(model).train()
    if hasattr(work, "set_block_checkpointing"):
        work.set_block_checkpointing(checkpoint)
    opt, loss_fn = torch.optim.AdamW(work.parameters(), 1e-3), RelativeLpLoss()
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        loss_fn(work(batch), *targets_of(batch)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _plot(rows: list, png) -> None:
    """Memory and (when timed) time per point against the number of points, a line per
    path, into the file ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = any(r["seconds"] is not None for r in rows)
    fig, axes = plt.subplots(1, 1 + timed, figsize=(5 + 4.5 * timed, 3.6), squeeze=False)
    for path in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == path]
        n = [r["points"] for r in mine]
        axes[0, 0].plot(n, [r["bytes"] / r["points"] / 1e3 for r in mine], "o-", label=path)
        if timed:
            t = [(r["points"], r["seconds"] / r["points"] * 1e6) for r in mine
                 if r["seconds"] is not None]
            axes[0, 1].plot(*zip(*t), "o-", label=path)
    labels = ["peak memory of a step (kB per point)", "time of a step (us per point)"]
    for ax, label in zip(axes[0], labels):
        ax.set_xscale("log")
        ax.set_xlabel("points in the sample")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("default slice transformer, 3-D, one thread", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
