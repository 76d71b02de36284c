"""``python -m benchmarks.validation_remesh``: the mesh-independence check on validation
shapes, so that a default is chosen without the test files (issue 36).

The suite's re-meshed splits (:mod:`benchmarks.accuracy.remesh`) are test shapes: they
may show a fault, not choose its fix. This module re-meshes the shapes ``meshops train``
holds out for validation (its default ``val_fraction`` and seed) of the obstacle and
airfoil families, each ``val_X`` split as the suite's ``test_X`` is (obstacle:
``val_fine``, ``val_ring16``, ``val_ring64``; airfoil: ``val_fine``, ``val_wall``), and
scores a trained run on both meshes of those shapes with the benchmark's metric, the
finite-element difference of the truths and the run's own predictions carried onto the
new meshes beside.

Examples::

    python -m benchmarks.validation_remesh make --data $DATA_ROOT/obstacle --split val_ring64
    python -m benchmarks.validation_remesh score --run RUN --data $DATA_ROOT/obstacle-val \\
        --split val_ring64 --out benchmarks/results/validation-remesh-obstacle.jsonl

``make`` writes ``DATA-val/val`` (copies of the validation files of ``meshops train``'s
default ``--seed 0``; ``--seed S``: ``DATA-val-seedS``, that seed's), ``DATA-val/val_X``
(the same shapes re-meshed, same file names; an obstacle shape takes about 25 s on a
busy core) and ``DATA-val/dataset.json`` (the family's inputs, targets and fields, and
the split's seed). ``score`` refuses a run that validated on another seed's split and
appends one JSON line per run, its model's configuration in it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from benchmarks.paths import command, portable


def validation_files(data: Path, seed: int = 0) -> list[Path]:
    """The training files ``meshops train --seed SEED`` validates on (its default
    ``val_fraction``), in index order."""
    from benchmarks.accuracy.folder import list_files
    from benchmarks.accuracy.meshops_cli import split_of_run

    names = list_files(data / "train")
    _, va = split_of_run(None, len(names), seed=seed)
    return [data / "train" / names[i] for i in va]


def _obstacle_shapes(indices: list[int], how: dict, key: dict) -> list:
    import torch

    from data_adapters.standins.obstacle import make_obstacle_standin

    return [make_obstacle_standin(i + 1, seed=key["seed"], first=i, dtype=torch.float64,
                                  cache_dir=False, progress=False, **how)[0]
            for i in indices]


def _airfoil_shapes(indices: list[int], how: dict, key: dict) -> list:
    from benchmarks.accuracy.datasets import airfoil_samples

    # the draw's parameters come for all its samples at once: the shapes from the first
    # index asked for to the end of the draw, then those asked for
    got = airfoil_samples(key["samples"], key["seed"], first=min(indices), cache_dir=False,
                          **how)
    by_index = {int(s.sample_id): s for s in got}
    return [by_index[i] for i in indices]


def _families() -> dict:
    """Family -> (re-meshing of some of its shapes, the test splits' settings)."""
    from benchmarks.accuracy.datasets import AIRFOIL_AGAIN, OBSTACLE_AGAIN

    return {"obstacle": (_obstacle_shapes, OBSTACLE_AGAIN),
            "airfoil": (_airfoil_shapes, AIRFOIL_AGAIN)}


def make(data: Path, split: str, seed: int = 0) -> Path:
    """Write the validation shapes of ``meshops train --seed SEED`` and their re-meshes
    (``split``, e.g. ``val_fine``) under ``DATA-val`` (``DATA-val-seedS`` for a seed
    other than 0).

    Raises:
        ValueError: If the family or the split is not one this module re-meshes.
    """
    from benchmarks.accuracy.datasets import _SPECS
    from benchmarks.accuracy.folder import description, list_files
    from meshops.mesh.io import write_mesh

    desc = description(data)
    family = desc["name"]
    families = _families()
    if family not in families:
        raise ValueError(f"{data}: the {family!r} family's validation shapes are not "
                         f"re-meshed here; the families are {', '.join(families)}")
    shapes, again = families[family]
    test_split = "test_" + split.removeprefix("val_")
    if not split.startswith("val_") or test_split not in again:
        raise ValueError(f"{family}: no split {split!r}; the splits are "
                         f"{', '.join('val_' + k.removeprefix('test_') for k in again)}")
    out = data.with_name(f"{data.name}-val" + (f"-seed{seed}" if seed else ""))
    for d in ("val", split):
        (out / d).mkdir(parents=True, exist_ok=True)
    # the training files in order: score draws a run's own split of them
    (out / "dataset.json").write_text(json.dumps(
        {**{k: desc[k] for k in ("name", "inputs", "targets", "fields")},
         "split_seed": seed, "train": list_files(data / "train")}, indent=1))
    files = validation_files(data, seed)
    for f in files:
        shutil.copy(f, out / "val" / f.name)
    todo = [f for f in files if not (out / split / f.name).exists()]
    if todo:
        # sample_0042.vtu is the draw's sample 42
        indices = [int(f.stem.split("_")[-1]) for f in todo]
        print(f"re-meshing {len(todo)} {family} validation shapes ({split})", file=sys.stderr)
        for f, s in zip(todo, shapes(indices, again[test_split], _SPECS[family][0])):
            write_mesh(out / split / f.name, s)
    return out


def score(run_dir: Path, data: Path, split: str) -> dict:
    """A run's errors per field on the validation meshes and re-meshed, the ratio, the
    truths' difference and its validation predictions carried onto the new meshes.

    Raises:
        ValueError: If the run validated on other shapes than those of ``data`` (its
            seed or ``val_fraction`` drew another split, which holds some of its
            training shapes).
    """
    import numpy as np
    import torch

    import meshops
    from benchmarks.accuracy.folder import description, list_files, read_split
    from benchmarks.accuracy.meshops_cli import split_of_run
    from benchmarks.accuracy.metric import field_columns, field_errors
    from benchmarks.accuracy.remesh import moved_predictions, truth_difference

    desc = description(data)
    train = desc.get("train")
    if train is None:
        raise ValueError(f"{data}/dataset.json does not say which training files the "
                         f"shapes were held out of: run make again")
    _, va = split_of_run((Path(run_dir) / "config.yaml").read_text(), len(train))
    if {train[i] for i in va} != set(list_files(data / "val")):
        raise ValueError(f"{run_dir} validated on other shapes than the split of seed "
                         f"{desc['split_seed']} that {data} holds, some of them its "
                         f"training shapes: make them with the run's --seed")
    torch.set_num_threads(1)
    inputs, targets = desc["inputs"], desc["targets"]
    cols = field_columns(targets, desc["fields"])
    val = read_split(data, "val", inputs, targets)
    new = read_split(data, split, inputs, targets)
    run = meshops.load_run(run_dir)

    def predict(where, samples):
        got = {}
        for s in samples:
            r = run.predict(data / where / s.name, verbose=False)
            got[s.name] = np.stack([r[f"{t}_pred"].double().numpy().reshape(-1)
                                    for t in targets], 1)
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
    m.add_argument("--data", type=Path, required=True, help="the family's folder")
    m.add_argument("--split", default="val_ring64", help="val_X, re-meshed as test_X is")
    m.add_argument("--seed", type=int, default=0, help="the --seed of the runs to score")
    s = sub.add_parser("score", help="score a run on them")
    s.add_argument("--run", type=Path, required=True)
    s.add_argument("--data", type=Path, required=True, help="the folder make wrote")
    s.add_argument("--split", default="val_ring64")
    s.add_argument("--out", type=Path, required=True, help="JSON lines file to append to")
    args = p.parse_args(argv)
    if args.what == "make":
        try:
            print(make(args.data, args.split, args.seed))
        except ValueError as e:
            print(f"validation_remesh: {e}", file=sys.stderr)
            return 2
        return 0
    roots = {"$DATA_ROOT": args.data.parent, "$WORK": args.run.parent}
    try:
        scored = score(args.run, args.data, args.split)
    except ValueError as e:
        print(f"validation_remesh: {e}", file=sys.stderr)
        return 2
    record = portable({"command": command("benchmarks.validation_remesh", argv, roots),
                       "run": str(args.run), "split": args.split, **scored}, roots)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
