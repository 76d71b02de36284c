"""The trust reports of a run's predictions and evaluations: distance to the training set
(:mod:`meshops.inference.trust`) and the mesh-independence check
(:mod:`meshops.inference.refine`), with their text and JSON forms."""

from __future__ import annotations

import logging
import math
from typing import Sequence

from meshops.inference.predict import field_channels
from meshops.runs.report import json_number

#: The point fields ``meshops predict`` writes with the distance to the training set.
DISTANCE_FIELDS = {"distance": "train_distance", "params_distance": "train_distance_params",
                   "geometry_distance": "train_distance_geometry"}
log = logging.getLogger(__name__)


def param_names(meta: dict) -> list[str] | None:
    """Names of the parameter components: the run's parameter names when its samples
    carry ``params``, else one ``mean of <field>`` per input channel."""
    if meta.get("params"):
        return list(meta["params"])
    shapes = meta.get("field_shapes") or {}
    out = []
    for k in meta.get("inputs") or []:
        c = field_channels(shapes.get(k, []))
        out += [f"mean of {k}"] if c == 1 else [f"mean of {k}[{j}]" for j in range(c)]
    return out


def training_set_metadata(samples: Sequence, meta: dict) -> dict:
    """What ``meshops train`` stores under ``"training_set"`` in the run's checkpoints."""
    from meshops.inference.trust import TrainingSet

    return TrainingSet.from_samples(samples, param_names(meta)).to_dict()


def training_set_of(meta: dict, inputs, targets):
    """The run's :class:`~meshops.inference.trust.TrainingSet`: from the checkpoint, or from its
    training files when the checkpoint predates it; ``(None, why not)`` otherwise."""
    from meshops.inference.trust import TrainingSet
    from meshops.runs.run_folder import training_samples

    if meta.get("training_set"):
        return TrainingSet.from_dict(meta["training_set"]), ""
    train, note = training_samples(meta, inputs, targets)
    if train is None:
        return None, note
    return TrainingSet.from_samples(train, param_names(meta)), ""


def warn_extrapolation(path, dist: dict) -> None:
    """A warning when the mesh of ``path`` is far from the training set (``dist``)."""
    if dist["extrapolates"]:
        log.warning(f"{path}: the model extrapolates here: " + "; ".join(dist["reasons"]))


def _bins(distances: list[float], errors: list[float], n_bins: int = 4) -> list[dict]:
    """Mean error in distance quantile bins (and a last bin of infinite distances)."""
    import numpy as np

    d, e = np.asarray(distances, dtype=float), np.asarray(errors, dtype=float)
    ok = ~np.isnan(e)
    d, e = d[ok], e[ok]
    finite = np.isfinite(d)
    out = []
    if finite.any():
        edges = np.unique(np.quantile(d[finite], np.linspace(0, 1, min(n_bins, finite.sum())
                                                             + 1)))
        for i in range(max(len(edges) - 1, 1)):
            lo, hi = edges[i], edges[min(i + 1, len(edges) - 1)]
            last = i >= len(edges) - 2
            sel = finite & (d >= lo) & ((d <= hi) if last else (d < hi))
            if sel.any():
                out.append({"from": float(lo), "to": float(hi), "n": int(sel.sum()),
                            "mean_error": float(e[sel].mean()), "max_error": float(e[sel].max())})
    if (~finite).any():
        out.append({"from": None, "to": None, "n": int((~finite).sum()),
                    "mean_error": float(e[~finite].mean()), "max_error": float(e[~finite].max())})
    return out


def distance_report(distances: list[dict], errors: list[float]) -> dict:
    """Error against distance to the training set over an evaluated folder."""
    import numpy as np
    from scipy.stats import spearmanr

    d = [x["distance"] for x in distances]
    ok = [i for i, (a, b) in enumerate(zip(d, errors)) if math.isfinite(a) and not math.isnan(b)]
    rho = (float(spearmanr([d[i] for i in ok], [errors[i] for i in ok]).statistic)
           if len(ok) > 2 and len({d[i] for i in ok}) > 1 else None)
    return {"bins": _bins(d, errors), "spearman": json_number(rho),
            "extrapolating": int(sum(x["extrapolates"] for x in distances)),
            "reference": json_number(distances[0]["reference"]) if distances else None,
            "max_distance": json_number(float(np.max(d))) if d else None}


def distance_lines(rep: dict, n: int) -> list[str]:
    """The text of :func:`distance_report` over ``n`` meshes."""
    out = [f"error against distance to the training set (in training spreads; extrapolation "
           f"beyond {rep['reference']:.3g}): {rep['extrapolating']} of {n} meshes extrapolate"
           + (f", Spearman rank correlation {rep['spearman']:.2f}"
              if rep["spearman"] is not None else "")]
    for b in rep["bins"]:
        span = "different geometry/constant mismatch" if b["from"] is None else \
            f"{b['from']:.3g} - {b['to']:.3g}"
        out.append(f"  distance {span:<24} {b['n']:>4} meshes  mean rel. L2 "
                   f"{b['mean_error']:.4e}  worst {b['max_error']:.4e}")
    return out


def refine_report(per_sample: list[dict]) -> dict:
    """Statistics of :func:`meshops.inference.refine.mesh_independence` over the samples."""
    from meshops.training.loss import summarize_errors

    out = {}
    for copy in ("refined", "coarsened"):
        changes = [s[copy].get("change", math.nan) for s in per_sample]
        st = summarize_errors(changes)
        notes = sorted({s[copy]["note"] for s in per_sample if "note" in s[copy]})
        out[copy] = {"mean": st["mean"], "median": st["median"], "max": st["max"],
                     "n": st["n"], **({"notes": notes} if notes else {})}
    return out


def refine_lines(rep: dict, per_sample: list[dict]) -> list[str]:
    """The text of :func:`refine_report` (``per_sample``: its samples' checks)."""
    out = ["mesh independence: relative L2 change of the prediction at the shared points "
           "(and the mean error against the targets)"]
    for copy, label in (("refined", "uniformly refined"), ("coarsened", "coarsened (FPS)")):
        st = rep[copy]
        errs = [s[copy]["error"] for s in per_sample
                if s[copy].get("error") is not None and not math.isnan(s[copy]["error"])]
        base = [s["error"] for s in per_sample if s.get("error") is not None]
        if st["mean"] is None:
            out.append(f"  {label:<18} n/a: {'; '.join(st.get('notes', []))}")
            continue
        err = (f"  (error {sum(errs) / len(errs):.4e} vs {sum(base) / len(base):.4e} on the "
               f"original meshes)" if errs and base else "")
        out.append(f"  {label:<18} change mean {st['mean']:.4e}  median {st['median']:.4e}  "
                   f"max {st['max']:.4e}{err}")
    return out
