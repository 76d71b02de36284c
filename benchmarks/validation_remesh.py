"""``python -m benchmarks.validation_remesh``: the mesh-independence check on validation
shapes, so that a default is chosen without the test files (issue 36).

The suite's re-meshed splits (:mod:`benchmarks.accuracy.remesh`) are test shapes: they
may show a fault, not choose its fix. This module re-meshes the shapes ``meshops train``
holds out for validation (its default ``val_fraction`` and seed) of the obstacle family,
with the band at the body refined ``--ring`` times in area as the suite's
``test_ring64`` is, and scores a trained run on both meshes of those shapes with the
benchmark's metric, the finite-element difference of the truths and the run's own
predictions carried onto the new meshes beside.

Examples::

    python -m benchmarks.validation_remesh make --data $DATA_ROOT/obstacle --ring 64
    python -m benchmarks.validation_remesh score --run RUN --data $DATA_ROOT/obstacle-val \\
        --split val_ring64 --out benchmarks/results/validation-remesh-obstacle.jsonl

``make`` writes ``DATA-val/val`` (copies of the validation files) and
``DATA-val/val_ringR`` (the same shapes re-meshed, same file names; about 25 s a shape
on a busy core). ``score`` appends one JSON line per run, its model's configuration in
it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from benchmarks.paths import command, portable

INPUTS, TARGETS, FIELDS = ["sdf"], ["u", "v", "p"], ["u+v", "p"]


def validation_files(data: Path) -> list[Path]:
    """The training files ``meshops train`` validates on by default, in index order."""
    from benchmarks.accuracy.folder import list_files
    from benchmarks.accuracy.meshops_cli import split_of_run

    names = list_files(data / "train")
    _, va = split_of_run(None, len(names))
    return [data / "train" / names[i] for i in va]


def make(data: Path, ring: int) -> Path:
    """Write the validation shapes and their re-meshes under ``DATA-val``."""
    import torch

    from data_adapters.standins.obstacle import make_obstacle_standin
    from meshops.mesh.io import write_mesh
    from meshops.utils.progress import progress

    out = data.with_name(f"{data.name}-val")
    for d in ("val", f"val_ring{ring}"):
        (out / d).mkdir(parents=True, exist_ok=True)
    for f in progress(validation_files(data), desc=f"re-meshing {data.name} validation"):
        i = int(f.stem.split("_")[-1])  # sample_0042.vtu is the draw's sample 42
        shutil.copy(f, out / "val" / f.name)
        dst = out / f"val_ring{ring}" / f.name
        if not dst.exists():
            s = make_obstacle_standin(i + 1, seed=0, first=i, ring=ring, dtype=torch.float64,
                                      cache_dir=False, progress=False)[0]
            write_mesh(dst, s)
    return out


def score(run_dir: Path, data: Path, split: str) -> dict:
    """A run's errors per field on the validation meshes and re-meshed, the ratio, the
    truths' difference and its validation predictions carried onto the new meshes."""
    import numpy as np
    import torch

    import meshops
    from benchmarks.accuracy.folder import read_split
    from benchmarks.accuracy.metric import field_columns, field_errors
    from benchmarks.accuracy.remesh import moved_predictions, truth_difference

    torch.set_num_threads(1)
    cols = field_columns(TARGETS, FIELDS)
    val = read_split(data, "val", INPUTS, TARGETS)
    new = read_split(data, split, INPUTS, TARGETS)
    run = meshops.load_run(run_dir)

    def predict(where, samples):
        got = {}
        for s in samples:
            r = run.predict(data / where / s.name, verbose=False)
            got[s.name] = np.stack([r[f"{t}_pred"].double().numpy().reshape(-1)
                                    for t in TARGETS], 1)
        return got

    def errors(preds, samples):
        e = [field_errors(preds[s.name], s.targets, s.weight, cols) for s in samples]
        return {f: float(np.mean([x[f] for x in e])) for f in [*cols, "mean"]}

    on_val = predict("val", val)
    a, b = errors(on_val, val), errors(predict(split, new), new)
    td = truth_difference(val, new, cols)
    return {"shapes": len(val), "val": a, "remeshed": b, "ratio": {f: b[f] / a[f] for f in a},
            "moved": errors(moved_predictions(val, on_val, new), new),
            "truth_difference": {f: td["fields"][f]["mean"] for f in cols},
            "model_config": dict(run.model.config)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.validation_remesh",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("make", help="re-mesh the validation shapes")
    m.add_argument("--data", type=Path, required=True, help="the obstacle family's folder")
    m.add_argument("--ring", type=int, default=64)
    s = sub.add_parser("score", help="score a run on them")
    s.add_argument("--run", type=Path, required=True)
    s.add_argument("--data", type=Path, required=True, help="the folder make wrote")
    s.add_argument("--split", default="val_ring64")
    s.add_argument("--out", type=Path, required=True, help="JSON lines file to append to")
    args = p.parse_args(argv)
    if args.what == "make":
        print(make(args.data, args.ring))
        return 0
    roots = {"$DATA_ROOT": args.data.parent, "$WORK": args.run.parent}
    record = portable({"command": command("benchmarks.validation_remesh", argv, roots),
                       "run": str(args.run), "split": args.split,
                       **score(args.run, args.data, args.split)}, roots)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
