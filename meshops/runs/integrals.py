"""The integrals an evaluation reports (``integrals=["TAG:FIELD"]``): of a target over a
tagged boundary (forces, fluxes), predicted against true, with the boundary's quadrature
(:class:`meshops.mesh.boundary.Boundary`: exact for linear fields on straight facets).

``TAG:FIELD`` integrates the field (each component of a vector field),
``TAG:FIELD*n`` a scalar field times the outward unit normal (``integral p n ds``: the
pressure force on a wall), ``TAG:FIELD.n`` a vector field's normal component
(``integral u . n ds``: the flux through an inlet). The tag is split off at the last
``:``, so ``gmsh:physical=2:p`` is the field ``p`` on the facets tagged 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshops.errors import UsageError

_MODES = (("*n", "normal"), (".n", "flux"))
# A true integral this small against the integral of the field's magnitude is zero.
_ROUND_OFF = 1e-9


@dataclass
class Integral:
    """One ``--integral``: ``tag``, target ``field``, ``mode`` (see
    :meth:`meshops.mesh.boundary.Boundary.integrate`) and the text as given."""

    tag: str
    field: str
    mode: str
    label: str


def parse_integral(text: str, targets, shapes: dict) -> Integral:
    """An ``--integral`` value; the field must be one of the run's ``targets``."""
    tag, sep, field = text.rpartition(":")
    if not sep or not tag or not field:
        raise UsageError(f"--integral {text!r}: expected TAG:FIELD (e.g. wall:p, wall:p*n, "
                       f"inlet:u.n)")
    mode = "value"
    for suffix, m in _MODES:
        if field.endswith(suffix):
            field, mode = field[:-len(suffix)], m
    if field not in targets:
        raise UsageError(f"--integral {text!r}: {field!r} is not a target of the model "
                       f"({', '.join(targets)}); predicted and true integrals need a target")
    shape = shapes.get(field, [])
    if mode == "normal" and shape:
        raise UsageError(f"--integral {text!r}: *n multiplies a scalar field by the normal; "
                       f"{field!r} has {shape} components (use .n for its normal component)")
    if mode == "flux" and not shape:
        raise UsageError(f"--integral {text!r}: .n takes the normal component of a vector "
                       f"field; {field!r} is a scalar (use *n for the force of a scalar)")
    return Integral(tag, field, mode, text)


def boundary_integrals(mesh, integrals: list, pred: dict, truth: dict, location: str) -> list:
    """``[(true, predicted, scale)]`` of each integral on one mesh (float lists, and the
    integral of the true field's magnitude, below which a true integral is cancellation
    noise); ``pred`` and ``truth`` map target names to values at ``location``."""
    from meshops.mesh.boundary import boundary

    out, cache = [], {}
    for it in integrals:
        if it.tag not in cache:
            cache[it.tag] = boundary(mesh, it.tag)
        b = cache[it.tag]
        vals = [b.integrate(v[it.field], location, it.mode).reshape(-1).tolist()
                for v in (truth, pred)]
        t = truth[it.field]
        size = t.reshape(t.shape[0], -1).norm(dim=1)
        out.append((*vals, float(b.integrate(size, location))))
    return out


def _norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


def integral_report(integrals: list, rows: list, names: list) -> list:
    """Per integral: every sample's true and predicted values with the absolute and
    relative errors (vector norms; the relative one ``None`` where the true integral is
    0 up to round-off: at most 1e-9 of the integral of the field's magnitude, e.g. the
    net force of a symmetric load), and their mean, median and worst."""
    import statistics

    report = []
    for j, it in enumerate(integrals):
        samples = []
        for name, row in zip(names, rows):
            true, pred, scale = row[j]
            err = _norm([p - t for p, t in zip(pred, true)])
            size = _norm(true)
            samples.append({"file": name, "true": true, "pred": pred, "abs_error": err,
                            "rel_error": err / size if size > _ROUND_OFF * scale else None})
        rel = [(s["rel_error"], s["file"]) for s in samples if s["rel_error"] is not None]
        report.append({
            "integral": it.label, "tag": it.tag, "field": it.field, "mode": it.mode,
            "mean_abs_true": statistics.fmean(_norm(s["true"]) for s in samples),
            "mean_abs_error": statistics.fmean(s["abs_error"] for s in samples),
            "mean_rel_error": statistics.fmean(r for r, _ in rel) if rel else None,
            "median_rel_error": statistics.median(r for r, _ in rel) if rel else None,
            "max_rel_error": max(rel)[0] if rel else None,
            "worst_sample": max(rel)[1] if rel else None,
            "samples": samples,
        })
    return report


def integral_lines(report: list) -> list[str]:
    """The table of :func:`integral_report` (none when no integral was asked)."""
    if not report:
        return []
    fmt = lambda v: f"{v:>10.4e}" if v is not None else f"{'undefined':>10}"  # noqa: E731
    out = [f"{'integral':<20} {'|true| (mean)':>13} {'abs. error':>10} {'rel. mean':>10} "
           f"{'median':>10} {'worst':>10}  worst sample"]
    for r in report:
        out.append(f"{r['integral']:<20} {r['mean_abs_true']:>13.4e} "
                   f"{r['mean_abs_error']:>10.4e} {fmt(r['mean_rel_error'])} "
                   f"{fmt(r['median_rel_error'])} {fmt(r['max_rel_error'])}  "
                   f"{r['worst_sample'] or '-'}")
    return out
