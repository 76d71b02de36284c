"""Evaluating a run (``meshops evaluate``, :meth:`meshops.runs.Run.evaluate`): a
trained model's errors on a folder of meshes, next to three baselines that need no
training.

The per-sample errors are :func:`meshops.training.loss.sample_errors` and their
statistics :func:`meshops.training.loss.summarize_errors`, the functions behind
:meth:`meshops.training.Trainer.evaluate`, so the numbers are those of training's
validation: per target field (:mod:`meshops.datasets.fields`) and, with several,
their mean; here they are also reported per file.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from meshops.datasets.fields import optional_field_names
from meshops.datasets.folder import MeshFolderDataset
from meshops.datasets.layout import SampleLayout
from meshops.errors import UsageError
from meshops.inference import predict as inference  # tests replace predict_mesh there
from meshops.inference.predict import RunSpec, mesh_sample
from meshops.mesh.io import read_mesh
from meshops.runs import trust_reports
from meshops.runs.integrals import (
    boundary_integrals,
    integral_lines,
    integral_report,
    parse_integral,
)
from meshops.runs.report import Report, json_number
from meshops.runs.run_folder import training_samples
from meshops.utils.progress import progress

# The errors of sample_errors, in the order they are printed, with their labels.
_METRIC_LABELS = (("l2", "rel. L2 (quad)"), ("l2_unweighted", "rel. L2 (plain)"),
                  ("abs_l2", "abs. L2 (quad)"))
_METRICS = tuple(m for m, _ in _METRIC_LABELS)
log = logging.getLogger(__name__)


#: The key of the mean over the target fields (the error training minimises) when
#: there is more than one field.
MEAN = "fields mean"


def _keys(fields) -> list[str]:
    """The rows of the report: each target field, then their mean when there are
    several."""
    return list(fields.names) + ([MEAN] if len(fields) > 1 else [])


def _errors_by_field(pred, truth, weight, fields) -> dict:
    """``{field: sample_errors}`` of one sample for each target field (``fields``, a
    :class:`~meshops.datasets.fields.TargetFields`) and, with several, their weighted
    mean (:data:`MEAN`, the error training minimises); all in float64."""
    import torch

    from meshops.training.loss import sample_errors

    pred, truth, weight = (t.to(torch.float64) for t in (pred, truth, weight))
    out = {key: sample_errors(pred[:, sl], truth[:, sl], weight)
           for key, sl in fields.slices().items()}
    if len(fields) > 1:
        out[MEAN] = sample_errors(pred, truth, weight, fields)
    return out


def _statistics(per_sample: list, names: list, keys) -> dict:
    """``{field: {metric: summarize_errors}}`` of per-sample ``{field: {metric: v}}``."""
    from meshops.training.loss import summarize_errors

    return {k: {m: summarize_errors([e[k][m] for e in per_sample], names) for m in _METRICS}
            for k in keys}


def _baseline_report(train, note: str, tests: list, names: list, fields) -> dict:
    """The baselines of :mod:`meshops.training.baselines` on the evaluated samples, per
    target field (``fields``) and metric, as ``{name: {"note", field: {metric: stats}}}``."""
    from meshops.training.baselines import BASELINE_NAMES, baselines

    if train is None:
        return {name: {"note": note} for name in BASELINE_NAMES}
    out = {}
    for b in baselines(train, tests):
        out[b.name] = entry = {"note": b.note}
        if not b.available:
            continue
        per = [_errors_by_field(p, t.y, t.weight, fields) for p, t in zip(b.predictions, tests)]
        entry.update(_statistics(per, names, _keys(fields)))
    return out


def _training_overlap(meta: dict, data, files) -> str:
    """A note when evaluated files are training files of the run: by content when the
    run recorded a fingerprint of its data, else by name in the training folder."""
    from meshops.runs.run_folder import listing, same_content

    train = list((meta.get("split") or {}).get("train", []))
    recorded = meta.get("data_files")
    if isinstance(recorded, dict):
        same = same_content(files, {n: recorded[n] for n in train if n in recorded})
        if not same:
            return ""
        pairs = [a if a == b else f"{a} = {b}" for a, b in same.items()]
        return (f"{len(same)} of the {len(files)} files have the content of training files "
                f"of this run ({listing(pairs)})")
    names = {Path(f).name for f in files}
    overlap = sorted(names & set(train)) if Path(data).resolve() == \
        Path(str(meta.get("data", ""))).resolve() else []
    return (f"{len(overlap)} of the {len(files)} files were in the training split of this "
            f"run" if overlap else "")


#: Why ``--refine`` is refused for cell targets (see :mod:`meshops.inference.refine`).
REFINE_CELLS = ("--refine: the targets of this run are cell data; the check compares the "
                "predictions at the points a mesh and its refinement share, and refined cells "
                "share no centroid with the original ones: evaluate without --refine")


def _run_layout(opts, meta: dict, spec, model, ckpt) -> SampleLayout:
    """The run's layout, as in training (points or cells, parameters, boundary tags);
    ``--refine`` is refused for cell targets (:data:`REFINE_CELLS`)."""
    layout = SampleLayout.from_run(meta, spec.inputs, spec.targets, model, ckpt)
    if opts.refine and layout.location == "cells":
        raise UsageError(REFINE_CELLS)
    return layout


@dataclass
class EvaluateOptions:
    """What ``meshops evaluate`` and :meth:`meshops.runs.Run.evaluate` are asked.

    Args:
        data: Folder of meshes (or of time series) with the input and target fields.
        plot: Picture of the median and the worst sample (``.png``, ``.pdf``, ...).
        refine: The mesh-independence check (:mod:`meshops.inference.refine`).
        integrals: ``TAG:FIELD`` integrals over tagged boundaries, predicted and true.
        baselines: Also the baselines that need no training (they read the training
            files).
        inputs, targets: Field names, for checkpoints that do not record them.
        horizon, start: Time-series runs: at most ``horizon`` steps from step ``start``.
    """

    data: str
    plot: str | None = None
    refine: bool = False
    integrals: Sequence[str] = ()
    baselines: bool = True
    inputs: Sequence[str] | str | None = None
    targets: Sequence[str] | str | None = None
    horizon: int | None = None
    start: int = 0


def evaluate_run(model, ckpt, meta: dict, opts: EvaluateOptions) -> Report:
    """A run's errors on ``opts.data``: per target field and sample, with the baselines,
    the distances to the training set, boundary integrals and the mesh-independence
    check asked for; a time-series run's errors against the horizon
    (:func:`meshops.runs.series.evaluate_series`)."""
    if opts.plot:  # before the evaluation, not after it
        from meshops.inference.plot import check_picture_path

        check_picture_path(opts.plot)
    if meta.get("series") or opts.horizon is not None or opts.start:
        from meshops.runs.series import evaluate_series

        return evaluate_series(model, ckpt, meta, opts)
    ev = _Evaluation(model, ckpt, meta, opts)
    for i in progress(range(len(ev.ds)), desc="evaluating", unit="mesh"):
        ev.add(i)
    result = ev.result()
    if opts.plot:
        ev.plot(result)
    description = ev.spec.describe()
    return Report(result, lambda r: _report_lines(r, description))


class _Evaluation:
    """One evaluation under way: the run and the data set, and what each sample gave
    (errors, distances, integrals, the mesh-independence check)."""

    def __init__(self, model, ckpt, meta: dict, opts: EvaluateOptions) -> None:
        import torch

        self.model, self.ckpt, self.meta, self.opts = model, ckpt, meta, opts
        spec = self.spec = RunSpec(model, ckpt, meta, optional_field_names(opts.inputs),
                                   optional_field_names(opts.targets))
        self.layout = _run_layout(opts, meta, spec, model, ckpt)
        asked = [opts.integrals] if isinstance(opts.integrals, str) else opts.integrals
        self.integrals = [parse_integral(t, spec.targets, spec.shapes) for t in asked or []]
        self.ds = MeshFolderDataset(opts.data, inputs=self.layout.inputs, targets=spec.targets,
                                    dtype=torch.float64, layout=self.layout)
        self.names = [Path(f).name for f in self.ds.files]
        self.keys = _keys(spec.fields)
        self.train_set, self.why = trust_reports.training_set_of(meta, spec.inputs,
                                                                 spec.targets)
        self.errors, self.per_sample, self.tests, self.integral_rows = [], [], [], []
        self.distances, self.independence = [], []

    def add(self, i: int) -> None:
        """Predict on sample ``i`` and record its errors (warnings on stderr for a model
        that fails, and for a target that is zero everywhere)."""
        import torch

        spec, s, path = self.spec, self.ds[i], self.ds.files[i]
        self.tests.append(s)
        spec.check_mesh(s, path, roles=("inputs", "targets"))
        pred = inference.predict_mesh(self.model, spec, s)
        if self.integrals:
            self.integral_rows.append(boundary_integrals(
                read_mesh(path), self.integrals, spec.split(pred.to(torch.float64)),
                spec.split(s.y.to(torch.float64)), self.layout.location))
        values = _errors_by_field(pred, s.y, s.weight, spec.fields)
        self.errors.append(values)
        bad = (~torch.isfinite(pred)).nonzero()
        if bad.numel():  # the inputs are finite (checked above): the model is at fault
            log.warning(f"{path}: the model predicts a non-finite value "
                        f"({pred[bad[0, 0], bad[0, 1]].item()}) at point {int(bad[0, 0])} "
                        f"although the inputs are finite; counted as a failure (error inf)")
        row = {"file": self.names[i], **{
            key: {m: json_number(v) for m, v in e.items()} for key, e in values.items()}}
        self.per_sample.append(row)
        if self.train_set is not None:
            self.distances.append(self.train_set.distance(
                mesh_sample(self.model, spec, s).cpu()))
            row["distance"] = json_number(self.distances[-1])
        if self.opts.refine:
            from meshops.inference.refine import mesh_independence

            self.independence.append(mesh_independence(self.model, spec, s))
            row["refine"] = json_number(self.independence[-1])
        for key, e in values.items():
            if not bad.numel() and (math.isnan(e["l2"]) or math.isnan(e["l2_unweighted"])):
                # undefined, not huge: say so once per file and target
                log.warning(f"{path}: target {key!r} is zero everywhere; its relative L2 "
                            f"error is undefined and left out of the relative statistics "
                            f"(absolute L2 error {e['abs_l2']:.4e})")

    def result(self) -> dict:
        """The report's entries: statistics per field, failures, per-sample rows, and
        the distances, mesh independence, integrals and baselines asked for."""
        spec, names, errors = self.spec, self.names, self.errors
        result = {
            "checkpoint": str(self.ckpt), "model": self.model.model_name,
            "data": str(self.opts.data), "n": len(self.ds), "inputs": spec.inputs,
            "targets": spec.targets, "fields": _statistics(errors, names, self.keys),
            "failed": [n for n, e in zip(names, errors)
                       if any(math.isinf(v["l2"]) for v in e.values())],
            "samples": self.per_sample,
        }
        note = _training_overlap(self.meta, self.opts.data, self.ds.files)
        if note:
            result["note"] = note
        main_key = self.keys[-1]  # the mean over the fields, or the only field
        result["distance"] = trust_reports.distance_report(
            self.distances, [e[main_key]["l2"] for e in errors]) if self.distances else \
            {"note": f"n/a: {self.why}"}
        if self.independence:
            result["refine"] = trust_reports.refine_report(self.independence)
        if self.integrals:
            result["integrals"] = integral_report(self.integrals, self.integral_rows, names)
        if self.opts.baselines and self.tests:
            train, note = training_samples(self.meta, spec.inputs, spec.targets, self.layout)
            result["baselines"] = _baseline_report(train, note, self.tests, names,
                                                   spec.fields)
        return result

    def plot(self, result: dict) -> None:
        """Truth, prediction and error of the median and the worst sample."""
        import torch

        from meshops.inference.plot import plot_comparisons

        spec, names, key = self.spec, self.names, self.keys[-1]
        stats = result["fields"][key]["l2"]
        if stats["worst_sample"] is None:  # no defined relative error: rank by absolute
            stats = result["fields"][key]["abs_l2"]
        items = []
        for label in ("median", "worst"):
            i = names.index(stats[f"{label}_sample"])
            s = self.ds[i]
            pred = spec.split(inference.predict_mesh(self.model, spec, s).to(torch.float64))
            truth = spec.split(s.y.to(torch.float64))
            items += [(s, truth[name].numpy(), pred[name].numpy(), f"{label}: {names[i]}",
                       name) for name in spec.targets]
        plot_comparisons(items, self.opts.plot,
                         title=f"{self.ckpt} on {self.opts.data}: median and worst samples "
                               f"(of {len(self.ds)})")
        result["plot"] = str(self.opts.plot)


def _report_lines(result: dict, description: str) -> list[str]:
    """The table of ``meshops evaluate`` (``description``: the run's fields, as
    :meth:`RunSpec.describe` says them)."""
    n, model_name = result["n"], result["model"]
    keys = list(result["fields"])
    out = [f"{result['checkpoint']} ({model_name}) on {result['data']}: {n} meshes, "
           f"{description}",
           f"{'field':<12} {'error':<16} {'mean':>10} {'median':>10} {'worst':>10}  "
           f"worst sample"]
    out += _rows(result["fields"], keys, n, notes=True)
    failed = result["failed"]
    if failed:
        out.append(f"note: the model FAILED on {len(failed)} of {n} meshes: its prediction "
                   f"is not finite although the inputs are ({', '.join(failed[:5])}"
                   f"{', ...' if len(failed) > 5 else ''}); their errors are inf, and so are "
                   f"the means and the worst")
    out += integral_lines(result.get("integrals", []))
    for name, entry in result.get("baselines", {}).items():
        out.append(f"baseline: {name}: {entry['note']}")
        out += _rows(entry, keys, n, notes=False)  # a baseline's undefined samples are the model's
    if result.get("baselines"):
        out += _standing(result, keys[-1], model_name)  # the fields' mean, or the field
    if "bins" in result["distance"]:
        out += trust_reports.distance_lines(result["distance"], n)
    if "refine" in result:
        out += trust_reports.refine_lines(result["refine"],
                                          [s["refine"] for s in result["samples"]])
    if "note" in result:
        out.append(f"note: {result['note']}")
    if "plot" in result:
        out.append(f"wrote {result['plot']}")
    return out


def _rows(stats: dict, keys: list, n: int, notes: bool) -> list[str]:
    """The table's rows of each field of ``stats`` (and, with ``notes``, the samples
    whose relative error is undefined)."""
    fmt = lambda v: f"{v:>10.4e}" if v is not None else f"{'undefined':>10}"  # noqa: E731
    out = []
    for key in keys:
        if key not in stats:
            continue
        for metric, label in _METRIC_LABELS:
            st = stats[key][metric]
            out.append(f"{key:<12} {label:<16} {fmt(st['mean'])} {fmt(st['median'])} "
                       f"{fmt(st['max'])}  {st['worst_sample'] or '-'}")
        undefined = stats[key]["l2"]["undefined"] if notes else []
        if undefined:
            out.append(f"note: {key}: the relative L2 error is undefined for "
                       f"{len(undefined)} of {n} meshes (target zero everywhere: "
                       f"{', '.join(undefined[:5])}{', ...' if len(undefined) > 5 else ''}); "
                       f"the relative statistics are over the other {n - len(undefined)}")
    return out


def _standing(result: dict, key: str, model_name: str) -> list[str]:
    """The model's mean rel. L2 (quad) of ``key`` against the baselines' (one tolerance
    for "level": :mod:`meshops.runs.comparison`)."""
    from meshops.runs.comparison import standing

    mean = result["fields"][key]["l2"]["mean"]
    if mean is None or not math.isfinite(mean):
        return []
    others = {n: e[key]["l2"]["mean"] for n, e in result["baselines"].items() if key in e}
    return [f"standing on {key}, mean rel. L2 (quad): {standing(model_name, mean, others)}"]
