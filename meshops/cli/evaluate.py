"""``meshops evaluate``: a trained model's errors on a folder of meshes, next to two
baselines that need no training.

The per-sample errors are :func:`meshops.training.loss.sample_errors` and their
statistics :func:`meshops.training.loss.summarize_errors`, the functions behind
:meth:`meshops.training.Trainer.evaluate`, so the numbers are those of training's
validation; here they are also reported per target field and per file.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from meshops.cli._common import RAW, optional_names, progress, wrap
from meshops.cli.folder import folder_dataset, training_samples
from meshops.inference import RunSpec, load_run, predict_mesh

# The errors of sample_errors, in the order they are printed, with their labels.
_METRIC_LABELS = (("l2", "rel. L2 (quad)"), ("l2_unweighted", "rel. L2 (plain)"),
                  ("abs_l2", "abs. L2 (quad)"))
_METRICS = tuple(m for m, _ in _METRIC_LABELS)


def _json_number(v):
    """NaN (undefined) as null: JSON has no NaN."""
    return None if isinstance(v, float) and math.isnan(v) else v


def _errors_by_field(pred, truth, weight, slices: dict) -> dict:
    """``{field: sample_errors}`` of one sample, the fields given as output channel
    ``slices``; all in float64."""
    import torch

    from meshops.training.loss import sample_errors

    pred, truth, weight = (t.to(torch.float64) for t in (pred, truth, weight))
    return {key: sample_errors(pred[:, sl], truth[:, sl], weight) for key, sl in slices.items()}


def _statistics(per_sample: list, names: list, keys) -> dict:
    """``{field: {metric: summarize_errors}}`` of per-sample ``{field: {metric: v}}``."""
    from meshops.training.loss import summarize_errors

    return {k: {m: summarize_errors([e[k][m] for e in per_sample], names) for m in _METRICS}
            for k in keys}


def _baseline_report(train, note: str, tests: list, names: list, slices: dict) -> dict:
    """Both baselines of :mod:`meshops.training.baselines` on the evaluated samples, per
    target field (``slices``) and metric, as ``{name: {"note", field: {metric: stats}}}``."""
    from meshops.training.baselines import baselines

    if train is None:
        return {"training mean": {"note": note}, "nearest training sample": {"note": note}}
    out = {}
    for b in baselines(train, tests):
        out[b.name] = entry = {"note": b.note}
        if not b.available:
            continue
        per = [_errors_by_field(p, t.y, t.weight, slices) for p, t in zip(b.predictions, tests)]
        entry.update(_statistics(per, names, slices))
    return out


def cmd_evaluate(args) -> int:
    import torch

    model, ckpt, meta = load_run(args.run, args.device)
    if meta.get("series") or args.horizon is not None or args.start:
        from meshops.cli.series import evaluate_series

        return evaluate_series(args, model, ckpt, meta)
    spec = RunSpec(model, ckpt, meta, optional_names(args.inputs), optional_names(args.targets))
    ds = folder_dataset(args.data, spec.inputs, spec.targets, torch.float64)
    names = [Path(f).name for f in ds.files]
    slices = spec.target_slices()
    if len(spec.targets) > 1:
        slices["all"] = slice(0, sum(sl.stop - sl.start for sl in slices.values()))
    keys = list(slices)
    errors, per_sample, tests = [], [], []
    for i in progress(range(len(ds)), desc="evaluating", unit="mesh"):
        s = ds[i]
        tests.append(s)
        spec.check_mesh(s, ds.files[i], roles=("inputs", "targets"))
        values = _errors_by_field(predict_mesh(model, spec, s), s.y, s.weight, slices)
        errors.append(values)
        per_sample.append({"file": names[i], **{
            key: {m: _json_number(v) for m, v in e.items()} for key, e in values.items()}})
        for key, e in values.items():
            if math.isnan(e["l2"]) or math.isnan(e["l2_unweighted"]):
                # undefined, not huge: say so once per file and target
                print(f"meshops: warning: {ds.files[i]}: target {key!r} is zero everywhere; "
                      f"its relative L2 error is undefined and left out of the relative "
                      f"statistics (absolute L2 error {e['abs_l2']:.4e})", file=sys.stderr)
    result = {
        "checkpoint": str(ckpt), "model": model.model_name, "data": str(args.data),
        "n": len(ds), "inputs": spec.inputs, "targets": spec.targets,
        "fields": _statistics(errors, names, keys),
        "samples": per_sample,
    }
    train_names = set((meta.get("split") or {}).get("train", []))
    overlap = sorted(set(names) & train_names) if Path(args.data).resolve() == \
        Path(str(meta.get("data", ""))).resolve() else []
    if overlap:
        result["note"] = (f"{len(overlap)} of the {len(names)} files were in the training "
                          f"split of this run")
    if not args.no_baselines and tests:
        train, note = training_samples(meta, spec.inputs, spec.targets)
        result["baselines"] = _baseline_report(train, note, tests, names, slices)
    if args.plot:
        from meshops.plot import plot_comparisons

        main = "all" if "all" in keys else spec.targets[0]
        stats = result["fields"][main]["l2"]
        if stats["worst_sample"] is None:  # no defined relative error: rank by absolute
            stats = result["fields"][main]["abs_l2"]
        picks = [("median", names.index(stats["median_sample"])),
                 ("worst", names.index(stats["worst_sample"]))]
        items = []
        for label, i in picks:
            s = ds[i]
            pred = spec.split(predict_mesh(model, spec, s).to(torch.float64))
            truth = spec.split(s.y.to(torch.float64))
            for name in spec.targets:
                items.append((s, truth[name].numpy(), pred[name].numpy(),
                              f"{label}: {names[i]}", name))
        plot_comparisons(items, args.plot,
                         title=f"{ckpt} on {args.data}: median and worst samples "
                               f"(of {len(ds)})")
        result["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(result))
        return 0
    _print_report(result, keys, ckpt, model.model_name, args, spec)
    return 0


def _print_report(result: dict, keys: list, ckpt, model_name: str, args, spec) -> None:
    n = result["n"]
    print(f"{ckpt} ({model_name}) on {args.data}: {n} meshes, {spec.describe()}")
    print(f"{'field':<12} {'error':<16} {'mean':>10} {'median':>10} {'worst':>10}  "
          f"worst sample")

    def rows(stats: dict, notes: bool) -> None:
        fmt = lambda v: f"{v:>10.4e}" if v is not None else f"{'undefined':>10}"  # noqa: E731
        for key in keys:
            if key not in stats:
                continue
            for metric, label in _METRIC_LABELS:
                st = stats[key][metric]
                print(f"{key:<12} {label:<16} {fmt(st['mean'])} {fmt(st['median'])} "
                      f"{fmt(st['max'])}  {st['worst_sample'] or '-'}")
            undefined = stats[key]["l2"]["undefined"] if notes else []
            if undefined:
                print(f"note: {key}: the relative L2 error is undefined for {len(undefined)} "
                      f"of {n} meshes (target zero everywhere: "
                      f"{', '.join(undefined[:5])}{', ...' if len(undefined) > 5 else ''}); "
                      f"the relative statistics are over the other {n - len(undefined)}")

    rows(result["fields"], notes=True)
    for name, entry in result.get("baselines", {}).items():
        print(f"baseline: {name}: {entry['note']}")
        rows(entry, notes=False)  # a baseline's undefined samples are the model's
    if "note" in result:
        print(f"note: {result['note']}")
    if args.plot:
        print(f"wrote {args.plot}")


EVALUATE_EPILOG = """\
examples:
  meshops evaluate runs/poisson --data test/
  meshops evaluate runs/poisson --data test/ --plot test.png --json > test.json

Each mesh needs the input and target fields the model was trained with, with
finite values. The relative L2 error of a sample is ||pred - truth|| / ||truth||
over the mesh, with the norms integrated with the mesh's quadrature weights
("quad") or summed over the points ("plain", the convention of published
benchmarks); the absolute L2 error is sqrt(sum_i w_i |pred_i - truth_i|^2). A
sample whose target is zero everywhere has no relative error: it is named in a
warning and left out of the relative statistics (its absolute error counts; in
the JSON output its relative errors are null). The JSON output also lists every
sample's errors.

time-series runs (meshops train --series): --data holds test series; each is rolled
out from its time step --start to its end (or --horizon steps) and the relative L2
error of every step is reported (mean, median, worst over the series) beside
persistence (the start state held) and the nearest training trajectory (by the
parameters, else by the start state):
  meshops evaluate runs/heat --data heat/test --plot horizon.png
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "evaluate", help="relative L2 errors of a trained model on a folder of meshes",
        description=wrap("Predict on every mesh of DIR and print the relative L2 error "
        "per target field (mean, median, worst sample), quadrature-weighted and "
        "unweighted, next to two baselines that need no training, on the same meshes "
        "and metric: the mean of the training targets (when all meshes are one fixed "
        "mesh or structured grids of one shape) and the targets of the nearest "
        "training sample (by the mean of each input field, or by the geometry when the "
        "model has no inputs)."),
        epilog=EVALUATE_EPILOG, formatter_class=RAW)
    p.add_argument("run", metavar="RUN", help="run folder (uses best.pt) or checkpoint file")
    p.add_argument("--data", required=True, metavar="DIR", help="folder of meshes with the "
                   "input and target fields")
    p.add_argument("--plot", metavar="FILE.png", help="save truth/prediction/error of the "
                   "median and the worst sample")
    p.add_argument("--json", action="store_true", help="print one JSON object (with the "
                   "per-sample errors)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--inputs", help="input fields, for checkpoints that do not record them")
    p.add_argument("--targets", help="target fields, for checkpoints that do not record them")
    p.add_argument("--no-baselines", action="store_true", dest="no_baselines",
                   help="skip the two baselines that need no training (the training mean "
                   "field and the nearest training sample), which read the run's training "
                   "files")
    p.add_argument("--horizon", type=int, metavar="N", help="time-series runs: roll out at "
                   "most N steps (default: to the end of each series)")
    p.add_argument("--start", type=int, default=0, metavar="K", help="time-series runs: "
                   "start the rollouts from time step K (default 0)")
    p.set_defaults(func=cmd_evaluate)
