"""Training throughput (samples/s) of the default neural model, on a CPU or a GPU.

    python -m benchmarks.throughput --data elasticity --device cuda [--amp bf16]
        [--data-dir PATH] [--samples 200] [--epochs 3] [--out FILE]

The model and batch size are those ``meshops train --model pit`` picks for the data
(:func:`meshops.fitting.defaults.choose_defaults`,
:func:`meshops.fitting.training_run.build_model`);
training is the :class:`~meshops.training.Trainer`'s (AdamW, cosine schedule, the
weighted relative L2 loss), with ``--amp`` its mixed precision.  The data are the
offline stand-ins (``--data elasticity`` or ``airfoil``) or, with ``--data-dir``, the
Geo-FNO files of that benchmark (its training split).  The first epoch is the warm-up
(kernel builds, the allocator, the mesh structures' first use); the figure is the
median of the later epochs' samples per second, each epoch ending with the Trainer's
``loss.item()`` (a device synchronisation), so the time is the device's.

Prints one line per epoch and a summary, and with ``--out`` writes them, with the
command line and the machine, to a file (completely or not at all).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.paths import command

DATA = ("elasticity", "airfoil")


def load_samples(data: str, n: int, data_dir: Path | None, seed: int = 0) -> list:
    """``n`` training samples of ``data``: Geo-FNO files from ``data_dir``, else the
    stand-in."""
    from data_adapters import (
        load_elasticity,
        load_naca,
        make_airfoil_standin,
        make_elasticity_standin,
    )
    if data_dir is not None:
        if data == "elasticity":
            return load_elasticity(data_dir, "train", n_train=n)
        return load_naca(data_dir, "train", n_train=n)
    if data == "elasticity":
        return make_elasticity_standin(n, seed=seed, progress=False)
    return make_airfoil_standin(n, seed=seed, progress=False)


def measure(samples: list, device: str, epochs: int, amp, batch_size: int | None = None,
            log=print) -> dict:
    """Train the default model for ``epochs`` epochs; the figures of the epochs after the
    first (see the module).

    Raises:
        ValueError: fewer than 2 epochs (the first is the warm-up).
    """
    import torch

    from meshops.fitting.defaults import choose_defaults
    from meshops.fitting.training_run import build_model
    from meshops.training import Trainer

    if epochs < 2:
        raise ValueError(f"epochs must be >= 2 (the first is the warm-up), got {epochs}")
    # The neural default: a parametric study would get a reduced basis, which is
    # fitted, not trained by epochs.
    name, model_cfg, train_cfg, reason = choose_defaults(samples, model="pit")
    s = samples[0]
    model = build_model(name, model_cfg, s.x.shape[1], s.y.shape[1], s.pos.shape[1])
    batch = batch_size or train_cfg["batch_size"]
    log(f"model {name}: {reason}")
    t0 = time.perf_counter()
    trainer = Trainer(model, samples, None, epochs=epochs, batch_size=batch,
                      lr=train_cfg["lr"], device=device, amp=amp, progress=False, log=None,
                      seed=0)
    setup_s = time.perf_counter() - t0
    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    hist = trainer.fit()
    rates = [len(samples) / h["time_s"] for h in hist]
    for h, r in zip(hist, rates):
        log(f"  epoch {h['epoch']}: {h['time_s']:.2f} s, {r:.2f} samples/s, "
            f"loss {h['train_loss']:.4g}")
    steps = -(-len(samples) // batch)
    later = rates[1:]
    return {"model": name, "model_config": model_cfg, "batch_size": batch, "amp": str(amp),
            "samples": len(samples), "steps_per_epoch": steps, "epochs": epochs,
            "setup_s": setup_s, "epoch_s": [h["time_s"] for h in hist],
            "samples_per_s": statistics.median(later),
            "step_s": statistics.median(h["time_s"] for h in hist[1:]) / steps,
            "params": sum(p.numel() for p in model.parameters()),
            "peak_gib": (torch.cuda.max_memory_allocated() / 2**30
                         if str(device).startswith("cuda") else None)}


def _machine(device: str) -> str:
    import torch
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))}, torch {torch.__version__}"
    return f"{os.cpu_count()} CPUs, torch {torch.__version__}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=DATA, default="elasticity")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="folder with the benchmark's Geo-FNO .npy files (default: stand-in)")
    p.add_argument("--samples", type=int, default=200, help="training samples (default 200)")
    p.add_argument("--epochs", type=int, default=3,
                   help="epochs, the first a warm-up (default 3)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="default: the one meshops train picks for the data")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default cpu)")
    p.add_argument("--amp", default="off", choices=("off", "bf16", "fp16"),
                   help="the Trainer's mixed precision (default off)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the output, with the command line, to this file")
    args = p.parse_args(argv)
    if args.samples < 1 or args.epochs < 2 or (args.batch_size is not None
                                               and args.batch_size < 1):
        p.error("--samples and --batch-size must be >= 1, --epochs >= 2")
    if args.data_dir is not None and not args.data_dir.is_dir():
        p.error(f"--data-dir {args.data_dir}: no such folder")
    if args.device != "cpu":
        import torch
        if not args.device.startswith("cuda") or not torch.cuda.is_available():
            p.error(f"--device {args.device}: only cpu or cuda[:i] with a CUDA device visible")
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    log(f"{args.data} ({'Geo-FNO files ' + str(args.data_dir) if args.data_dir else 'stand-in'}), "
        f"{args.samples} samples, {args.epochs} epochs, device {args.device}, amp {args.amp}; "
        f"load {load}")
    samples = load_samples(args.data, args.samples, args.data_dir)
    amp = False if args.amp == "off" else args.amp
    r = measure(samples, args.device, args.epochs, amp, args.batch_size, log)
    log(f"{r['model']} ({r['params']:,} parameters), batch {r['batch_size']}: "
        f"{r['samples_per_s']:.2f} samples/s, {r['step_s']:.4f} s/step (median of epochs "
        f"2-{args.epochs})" + (f", peak {r['peak_gib']:.2f} GiB" if r["peak_gib"] else ""))
    if args.out is not None:
        from meshops.utils.atomic import atomic_write
        head = [f"# {command('benchmarks.throughput', argv)}",
                f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {_machine(args.device)}, "
                f"load before {load}, after "
                + " ".join(f"{x:.2f}" for x in os.getloadavg())]
        text = "\n".join(head + lines) + "\n"
        atomic_write(args.out, lambda tmp: Path(tmp).write_text(text))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
