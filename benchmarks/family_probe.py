"""Validation probes of model configurations on a geometry family (issue 27): which model
and size the default of ``meshops train`` should be, chosen on validation samples only.

Each probe trains one configuration on the training files of a benchmark data set
(:mod:`benchmarks.accuracy.datasets`), on the split ``meshops train`` uses (its default
``val_fraction`` and seed), for a budget of **CPU seconds of one thread**
(``time.process_time``): one epoch is timed, then as many epochs as fit the budget are
trained from scratch with the cosine schedule laid over them, as ``meshops train`` lays
its schedule over the epochs that fit ``--minutes``. A budget in CPU time of one thread is
what a wall-clock budget is on a quiet core, and it does not move with the load of the
machine, so probes may run side by side; the wall-clock comparison with the peers is
``python -m benchmarks.accuracy`` on a quiet machine. The test files are never read.

Example::

    python -m benchmarks.family_probe --data ~/.cache/meshops/accuracy/obstacle \\
        --model slice_transformer --model-config width=64 slices=32 --cpu-minutes 3 \\
        --out benchmarks/results/family-probes.jsonl

Each probe appends one JSON line (configuration, epochs, CPU seconds, the validation
error per field and its mean, the command) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from benchmarks.paths import command, portable


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.family_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a benchmark data set folder")
    p.add_argument("--model", required=True)
    p.add_argument("--model-config", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--scheduler", default="cosine", choices=["cosine", "onecycle"])
    p.add_argument("--amp", default=None, choices=["bf16"], help="mixed precision")
    p.add_argument("--cpu-minutes", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="JSON lines file to append to")
    return p.parse_args(argv)


def _samples(data: Path, dtype):
    from benchmarks.accuracy.folder import description
    from meshops.datasets.samples import load_folder
    from meshops.fitting.config import TrainConfig
    from meshops.training.splits import validation_split

    desc = description(data)
    fields = desc.get("fields") or desc["targets"]
    _, samples, shapes, dim = load_folder(data / "train", desc["inputs"], desc["targets"],
                                          dtype)
    cfg = TrainConfig()
    tr, va = validation_split(len(samples), cfg.val_fraction, cfg.seed)
    return [samples[i] for i in tr], [samples[i] for i in va], desc, fields, shapes, dim


def _fit(model_fn, train, val, fields, epochs, args):
    from meshops.training import Trainer
    from meshops.training.seed import seed_everything

    seed_everything(args.seed)
    t0 = time.process_time()
    model = model_fn()
    # the Trainer builds the mesh structures (PiT's graphs) once: set-up, not epochs
    trainer = Trainer(model, train, val, epochs=epochs, batch_size=args.batch_size, lr=args.lr,
                      scheduler=args.scheduler, seed=args.seed, progress=False, log=None,
                      fields=fields, amp=args.amp or False)
    t1 = time.process_time()
    trainer.fit()
    return trainer, model, t1 - t0, time.process_time() - t1


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from meshops.datasets.fields import TargetFields
    from meshops.fitting.config import TrainConfig
    from meshops.fitting.training_run import build_model
    from meshops.inference.predict import field_channels

    torch.set_num_threads(1)
    train, val, desc, specs, shapes, dim = _samples(args.data, torch.float32)
    fields = TargetFields.from_specs(specs, {k: field_channels(shapes[k])
                                             for k in desc["targets"]})
    c_in = sum(field_channels(shapes[k]) for k in desc["inputs"])
    # key=value pairs read as --model-config reads them
    config = TrainConfig.from_request({"model_config": args.model_config}).get(
        "model_config", {})

    def model_fn():
        return build_model(args.model, config, c_in, fields.num_channels, dim)

    # one epoch, timed in CPU seconds, then the epochs that fit, from scratch
    _, _, setup, one = _fit(model_fn, train, val, fields, 1, args)
    epochs = max(1, math.floor((60 * args.cpu_minutes - setup) / one))
    trainer, model, setup, spent = _fit(model_fn, train, val, fields, epochs, args)
    spent += setup
    best = min(trainer.history, key=lambda e: e["val_l2"])
    val_fields = {f: v["l2_mean"] for f, v in (best["val"].get("fields") or {}).items()}
    # a data set folder of the accuracy benchmark sits in its data root
    roots = {"$DATA_ROOT": args.data.parent}
    record = {
        "data": desc["name"], "model": args.model, "model_config": dict(model.config),
        "batch_size": args.batch_size, "lr": args.lr, "scheduler": args.scheduler,
        "amp": args.amp,
        "seed": args.seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "cpu_minutes": args.cpu_minutes, "cpu_s_per_epoch": round(one, 2), "epochs": epochs,
        "cpu_s": round(spent, 1), "best_epoch": best["epoch"], "val": best["val_l2"],
        "val_fields": val_fields, "train": len(train), "num_val": len(val),
        "curve": [round(e["val_l2"], 6) for e in trainer.history],
        "command": command("benchmarks.family_probe", argv, roots),
    }
    record = portable(record, roots)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"{desc['name']} {args.model} {config} bs {args.batch_size} lr {args.lr:g} "
          f"{args.scheduler}: "
          f"{epochs} epochs ({one:.1f} CPU s each), best val {best['val_l2']:.4e} at epoch "
          f"{best['epoch']} {val_fields}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
