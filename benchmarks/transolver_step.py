"""``python -m benchmarks.transolver_step``: the training step of meshops' default geometry
model against PhysicsNeMo's Transolver of the same size, alternated in one process.

Issue 36's throughput target: samples per second of forward, backward and AdamW step,
one thread, the two models alternated so that a change of load hits both. The models:

* ``meshops``: what ``meshops train`` builds for input fields and several target fields
  (:data:`meshops.fitting.defaults.FIELDS_SLICE`: the slice transformer, width 64,
  4 layers, 4 heads, 32 slices, batch 1), called as the Trainer calls it (a collated PyG
  batch through :func:`~meshops.models.inputs.read_inputs`);
* ``transolver``: ``physicsnemo.models.transolver.Transolver`` with the benchmark's
  configuration (:data:`benchmarks.accuracy.peer_train.CONFIGS`: ``n_hidden`` 64, 4 layers,
  4 heads, 32 slices, ``mlp_ratio`` 1), called on ``[1, N, .]`` tensors as in its examples.

Both have 98,579 parameters for one input and three outputs in 2-D. The samples are the
obstacle stand-in's meshes (1,500-2,500 nodes; :mod:`data_adapters.standins.obstacle`),
input ``sdf``, targets ``u, v, p``, and the loss of both is the benchmark's metric, the
mean over the fields ``u+v`` and ``p`` of the quadrature-weighted relative L2 error.

Optimisers, two rows per model: ``loop``, torch's AdamW as constructed by default (the
per-tensor loop on a CPU; what the accuracy benchmark's Transolver trains with), and
``fused``, torch's fused AdamW (what meshops' Trainer builds,
:func:`meshops.training.optim.make_optimizer`). The same optimiser on both sides compares
the models alone.

Each round times one pass over the samples (a step per sample) for every model and
optimiser in turn, the order rotated between rounds; the figure is the median over the
rounds after a warm-up pass. Runs where both ``meshops`` and ``physicsnemo`` import (the
peers' environment of ``docs/accuracy.md`` with ``pip install -e .`` added). Writes the
output with the command line, versions and the load averages before and after to
``--out`` (completely or not at all).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from benchmarks.paths import command


def relative_l2(pred, y, w, fields) -> "object":
    """The mean over ``fields`` (``[(start, stop), ...]`` channel ranges) of the weighted
    relative L2 errors of one sample: ``pred``, ``y`` ``[N, C]``, ``w`` ``[N]``."""
    errs = []
    for a, b in fields:
        num = (w[:, None] * (pred[:, a:b] - y[:, a:b]) ** 2).sum()
        den = (w[:, None] * y[:, a:b] ** 2).sum()
        errs.append((num / den).sqrt())
    return sum(errs) / len(errs)


def _models(torch):
    from physicsnemo.models.transolver import Transolver

    from benchmarks.accuracy.peer_train import CONFIGS
    from meshops.fitting.defaults import FIELDS_SLICE
    from meshops.fitting.training_run import build_model

    torch.manual_seed(0)
    ours = build_model("slice_transformer", dict(FIELDS_SLICE), 1, 3, 2)
    peer = Transolver(functional_dim=1, out_dim=3, embedding_dim=2,
                      **CONFIGS["transolver"]["model"])
    return ours, peer


def _steps(torch, ours, peer, samples):
    """``{name: step(sample)}``: one forward, backward and AdamW step of each model and
    optimiser on one sample."""
    from meshops.training.dataset import make_loader, prepare_batch
    from meshops.training.optim import make_optimizer

    fields = [(0, 2), (2, 3)]
    batches = [prepare_batch(b) for b in make_loader(samples, 1)]
    dense = [(s.x[None], s.pos[None], s.y, s.weight) for s in samples]
    opts = {"meshops/loop": torch.optim.AdamW(ours.parameters(), 1e-3),
            "meshops/fused": make_optimizer(ours, "adamw", 1e-3, None),
            "transolver/loop": torch.optim.AdamW(peer.parameters(), 1e-3),
            "transolver/fused": torch.optim.AdamW(peer.parameters(), 1e-3, fused=True)}
    assert opts["meshops/fused"].defaults["fused"], "the Trainer's AdamW is not fused here"

    def step_ours(opt):
        def run(i):
            b = batches[i]
            opt.zero_grad(set_to_none=True)
            relative_l2(ours(b), b.y, b.weight, fields).backward()
            opt.step()
        return run

    def step_peer(opt):
        def run(i):
            x, pos, y, w = dense[i]
            opt.zero_grad(set_to_none=True)
            relative_l2(peer(x, embedding=pos)[0], y, w, fields).backward()
            opt.step()
        return run

    return {name: (step_ours if name.startswith("meshops") else step_peer)(opt)
            for name, opt in opts.items()}


def measure(torch, samples, rounds: int, log) -> dict:
    """Median seconds per sample of each model and optimiser over ``rounds`` passes."""
    ours, peer = _models(torch)
    steps = _steps(torch, ours, peer, samples)
    names = list(steps)
    for name in names:                      # warm-up pass
        for i in range(len(samples)):
            steps[name](i)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            for i in range(len(samples)):
                steps[name](i)
            times[name].append((time.perf_counter() - t0) / len(samples))
        log(f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1] * 1e3:.2f} ms" for n in names))
    params = {"meshops": sum(p.numel() for p in ours.parameters()),
              "transolver": sum(p.numel() for p in peer.parameters())}
    return {"median_s": {n: statistics.median(t) for n, t in times.items()},
            "spread_s": {n: (min(t), max(t)) for n, t in times.items()}, "params": params}


def report(result: dict, log) -> None:
    med = result["median_s"]
    log(f"parameters: meshops {result['params']['meshops']:,}, transolver "
        f"{result['params']['transolver']:,}")
    log(f"{'model/optimiser':24s} {'ms/sample':>10s} {'samples/s':>10s} {'range (ms)':>16s}")
    for name, s in med.items():
        lo, hi = result["spread_s"][name]
        log(f"{name:24s} {s * 1e3:10.2f} {1 / s:10.2f} {lo * 1e3:7.2f}-{hi * 1e3:<7.2f}")
    for opt in ("loop", "fused"):
        a, b = med[f"meshops/{opt}"], med[f"transolver/{opt}"]
        log(f"both with the {opt} AdamW: meshops' step is {a / b:.3f}x Transolver's "
            f"(throughput {b / a:.3f}x)")
    a, b = med["meshops/fused"], med["transolver/loop"]
    log(f"each as its training runs (meshops fused, Transolver loop): {a / b:.3f}x "
        f"(throughput {b / a:.3f}x)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transolver_step",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=40, help="obstacle meshes (default 40)")
    p.add_argument("--rounds", type=int, default=7, help="timed passes (default 7)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, default=None, help="also write the output here")
    args = p.parse_args(argv)
    if args.samples < 1 or args.rounds < 1 or args.threads < 1:
        p.error("--samples, --rounds and --threads must be >= 1")

    from benchmarks.accuracy.peer_train import _load_torch

    torch = _load_torch()
    torch.set_num_threads(args.threads)
    import physicsnemo

    from data_adapters.standins.obstacle import make_obstacle_standin

    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    load0 = os.getloadavg()
    log(f"command: {command('benchmarks.transolver_step', argv)}")
    log(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"physicsnemo {physicsnemo.__version__}, {args.threads} thread(s)")
    log(f"load average before: {' '.join(f'{x:.2f}' for x in load0)}")
    samples = make_obstacle_standin(args.samples, seed=0, dtype=torch.float32, progress=False)
    sizes = [s.pos.shape[0] for s in samples]
    log(f"{len(samples)} obstacle meshes, {min(sizes)}-{max(sizes)} nodes "
        f"(mean {statistics.mean(sizes):.0f})")
    result = measure(torch, samples, args.rounds, log)
    report(result, log)
    log(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out is not None:
        from meshops.utils.atomic import atomic_write

        atomic_write(args.out, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
