"""Results of several seeds as one: each trained model's figures averaged over the seeds,
with their spread, so that "level" can mean "within what a new seed moves".

A run of ``python -m benchmarks.accuracy --seed S`` seeds every trained model with ``S``
(meshops' ``--seed``, which also draws its validation split, and the peers' runner, which
takes that split). :func:`combine_seeds` takes one result per seed, the same budget and
data sets, and gives one result whose every model entry (and every field's) has the mean
over the seeds of ``mean``, ``median`` and ``worst``, plus ``seeds`` (seed -> that seed's
mean) and ``spread`` (the smallest and largest of them). The re-meshed scores are averaged
the same way.
"""

from __future__ import annotations

import numpy as np

from benchmarks.accuracy.report import merge

#: The figures averaged over the seeds.
AVERAGED = ("mean", "median", "worst")


def _average(entries: dict) -> dict:
    """``{seed: summary}`` -> the averaged summary with ``seeds`` and ``spread``."""
    ok = {s: e for s, e in entries.items() if e.get("mean") is not None}
    if not ok:
        return next(iter(entries.values()))
    first = next(iter(ok.values()))
    out = {k: v for k, v in first.items() if k not in (*AVERAGED, "errors", "fields",
                                                       "remeshed", "history", "ratio",
                                                       "moved")}
    if all("moved" in e for e in ok.values()):
        out["moved"] = _average({s: e["moved"] for s, e in ok.items()})
    for k in AVERAGED:
        out[k] = float(np.mean([e[k] for e in ok.values()]))
    out["seeds"] = {str(s): e["mean"] for s, e in ok.items()}
    out["spread"] = [min(out["seeds"].values()), max(out["seeds"].values())]
    fields = sorted({f for e in ok.values() for f in e.get("fields") or {}})
    if fields:
        out["fields"] = {f: _average({s: e["fields"][f] for s, e in ok.items()
                                      if f in (e.get("fields") or {})}) for f in fields}
    splits = sorted({sp for e in ok.values() for sp in e.get("remeshed") or {}})
    if splits:
        out["remeshed"] = {sp: _average({s: e["remeshed"][sp] for s, e in ok.items()
                                         if sp in (e.get("remeshed") or {})})
                           for sp in splits}
        for sp, r in out["remeshed"].items():
            if r.get("mean") is not None and out["mean"]:
                r["ratio"] = r["mean"] / out["mean"]
            for f, rf in (r.get("fields") or {}).items():  # each field's, of its means
                base = (out.get("fields") or {}).get(f, {}).get("mean")
                if rf.get("mean") is not None and base:
                    rf["ratio"] = rf["mean"] / base
    return out


def combine_seeds(docs: list[dict]) -> dict:
    """One result of runs that differ by seed (each a stored result with its ``seed``;
    several results of one seed are merged first, a later one's model replacing an
    earlier one's).

    Raises:
        ValueError: fewer than two seeds, or runs that :func:`merge` refuses to merge.
    """
    by_seed: dict[int, list[dict]] = {}
    for d in docs:
        by_seed.setdefault(int(d.get("seed", 0)), []).append(d)
    if len(by_seed) < 2:
        raise ValueError(f"combining seeds needs results of at least two seeds, got "
                         f"{sorted(by_seed)}")
    per_seed = {s: merge(ds) for s, ds in sorted(by_seed.items())}
    out = merge(list(per_seed.values()))
    out["seeds"] = sorted(per_seed)
    for name, ds in out["datasets"].items():
        for m in ds["models"]:
            ds["models"][m] = _average({s: doc["datasets"][name]["models"][m]
                                        for s, doc in per_seed.items()
                                        if m in doc["datasets"].get(name, {}).get("models",
                                                                                  {})})
    return out
