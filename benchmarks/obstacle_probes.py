"""``python -m benchmarks.obstacle_probes``: validation probes of the slice transformer on
the obstacle stand-in, for a fixed number of epochs (so that the load of the machine
changes their time and not their result).

The split: the stand-in's first 200 meshes train, the next 50 validate; meshes 250-299
are never read. The model is the default ``meshops train`` builds for input fields and
several target fields (:data:`meshops.fitting.defaults.FIELDS_SLICE`, batch 1, one-cycle
rate peaking at 1e-3, the per-field relative L2 loss); the figure is the best epoch's mean
validation error per field and over the fields.

``--what``:

* ``global-inputs``: a family whose answer is linear in a global input: each mesh gets a
  load factor ``c ~ U(0.5, 2)`` as a second input channel, constant over the mesh, and
  its targets times ``c``. ``--variant film`` conditions every block on the input means
  (what the defaults now do when some inputs are constant over each mesh), ``plain``
  takes ``c`` as a pointwise feature only.
  ``film-only`` conditions on it without reading it at every point
  (``global_inputs``: a value unique to each training mesh, read pointwise, lets the
  model tell the meshes apart). ``per-unit`` is ``film-only`` learning the targets per
  unit load: the channel :func:`meshops.fitting.defaults.output_scale_channel` finds
  (what ``meshops train`` does when the targets are proportional to a global input).
* ``irrelevant-global``: the same load factor as a second input, the targets not
  scaled: what a global input the answer does not depend on costs (the plain family
  without it is ``adaptive-temperature --variant plain``).
* ``adaptive-temperature``: the plain obstacle family, ``--variant ada`` with a slice
  temperature per point (:class:`meshops.nn.slice.SliceAttention`), ``plain`` without.

Appends one JSON line to ``--out`` (completely or not at all).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.paths import command

VARIANTS = {"global-inputs": ("film", "film-only", "per-unit", "plain"),
            "irrelevant-global": ("film", "film-only", "plain"),
            "adaptive-temperature": ("ada", "plain")}


def samples(what: str, torch) -> tuple[list, list, int]:
    """``(train, val, input channels)`` of the probe."""
    from data_adapters.standins.obstacle import make_obstacle_standin

    data = make_obstacle_standin(300, seed=0, dtype=torch.float32, progress=False)
    if what in ("global-inputs", "irrelevant-global"):
        g = torch.Generator().manual_seed(123)
        loaded = []
        for s in data:
            c = float(0.5 + 1.5 * torch.rand(1, generator=g))
            t = s.clone()
            t.x = torch.cat([s.x, torch.full_like(s.x, c)], 1)
            t.y = s.y * c if what == "global-inputs" else s.y
            loaded.append(t)
        data = loaded
    return data[:200], data[200:250], int(data[0].x.shape[1])


def probe(what: str, variant: str, seed: int, epochs: int) -> dict:
    import torch

    from meshops.datasets.fields import TargetFields
    from meshops.fitting.defaults import FIELDS_SLICE, FIELDS_TRAIN, output_scale_channel
    from meshops.models.slice_transformer import SliceTransformer
    from meshops.training import Trainer
    from meshops.training.loss import RelativeLpLoss
    from meshops.training.seed import seed_everything

    torch.set_num_threads(1)
    train, val, channels = samples(what, torch)
    fields = TargetFields.from_specs(["u+v", "p"], {"u": 1, "v": 1, "p": 1})
    seed_everything(seed)
    model = SliceTransformer(channels, 3, pos_dim=2, **FIELDS_SLICE,
                             condition_on_inputs=variant in ("film", "film-only", "per-unit"),
                             global_inputs=(1,) if variant in ("film-only", "per-unit") else (),
                             adaptive_temperature=variant == "ada")
    scale = output_scale_channel(train) if variant == "per-unit" else None
    if variant == "per-unit" and scale != 1:
        raise RuntimeError(f"the load (input channel 1) was not found proportional: {scale}")
    t0 = time.perf_counter()
    history = Trainer(model, train, val, epochs=epochs, batch_size=FIELDS_TRAIN["batch_size"],
                      lr=FIELDS_TRAIN["lr"], scheduler=FIELDS_TRAIN["scheduler"],
                      progress=False, log=None, loss=RelativeLpLoss(fields=fields),
                      fields=fields, seed=seed,
                      normalize=True if scale is None else scale).fit()
    best = min(history, key=lambda e: e["val_l2"])
    return {"what": what, "variant": variant, "seed": seed, "epochs": epochs,
            "best_epoch": best["epoch"], "val_l2": best["val_l2"],
            "fields": {k: v["l2_mean"] for k, v in best["val"]["fields"].items()},
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.obstacle_probes",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", choices=sorted(VARIANTS), required=True)
    p.add_argument("--variant", required=True, help="global-inputs, irrelevant-global: "
                   "film, film-only or plain; adaptive-temperature: ada or plain")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--out", type=Path, required=True, help="JSON lines file to append to")
    args = p.parse_args(argv)
    if args.variant not in VARIANTS[args.what]:
        p.error(f"--variant for {args.what}: one of {', '.join(VARIANTS[args.what])}")
    if args.epochs < 1:
        p.error("--epochs must be >= 1")
    line = probe(args.what, args.variant, args.seed, args.epochs)
    line["command"] = command("benchmarks.obstacle_probes", argv)
    print(json.dumps(line))
    from meshops.utils.atomic import atomic_write

    old = args.out.read_text() if args.out.exists() else ""
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(old + json.dumps(line) + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
