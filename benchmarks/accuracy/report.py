"""The accuracy table: on the console while the benchmark runs, and as Markdown for the
docs from a stored result (``python -m benchmarks.accuracy --table FILE.json``)."""

from __future__ import annotations

from benchmarks.accuracy.run import LABELS, MODELS
from meshops.training.standing import standing

#: The neural-network and classical columns meshops is compared with.
OTHERS = ("mean", "nearest", "pod_rbf", "transolver", "gino")


def merge(docs: list[dict]) -> dict:
    """One result of several stored runs (the same budget and threads, run side by side
    or one after another): each data set's models from every run, a later run's
    result for a model replacing an earlier one's. The commands, commits and loads of
    every run are kept (``runs``).

    Raises:
        ValueError: runs with different budgets or thread counts (not comparable).
    """
    first = docs[0]
    for d in docs[1:]:
        if (d["minutes"], d["threads"]) != (first["minutes"], first["threads"]):
            raise ValueError(f"cannot merge a {d['minutes']:g}-minute {d['threads']}-thread run "
                             f"with a {first['minutes']:g}-minute {first['threads']}-thread one")
    out = {k: v for k, v in first.items() if k not in ("datasets", "runs")}
    out["runs"] = [{k: d.get(k) for k in ("command", "meshops_commit", "started", "finished",
                                          "load")} for d in docs]
    out["datasets"] = {}
    for d in docs:
        for name, ds in d["datasets"].items():
            have = out["datasets"].setdefault(name, {**ds, "models": {}})
            have["models"].update(ds["models"])
    out["models"] = [m for m in MODELS if any(m in ds["models"]
                                              for ds in out["datasets"].values())]
    return out


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _models(doc: dict) -> list[str]:
    seen = {m for d in doc["datasets"].values() for m in d["models"]}
    return [m for m in MODELS if m in seen]


def _cell(r: dict | None, best: bool, markdown: bool, spread: bool = True) -> str:
    if r is None:
        return "not run"
    if r.get("mean") is None:
        note = r.get("note", "no result")
        return "n/a" if note.startswith("n/a") else "failed"
    text = f"{r['mean']:.4g}"
    if markdown and best:
        text = f"**{text}**"
    if not spread:
        return text
    return f"{text} (median {r['median']:.3g}, worst {r['worst']:.3g})"


def rows(name: str, d: dict) -> list[tuple[str, dict]]:
    """The table rows of one data set: ``(label, {model: result})``, one per target field
    and the mean over the fields when there are several (each model's ``fields`` entry),
    else one row of the data set."""
    fields = [f for f in d.get("fields") or [] if any(
        f in (r.get("fields") or {}) for r in d["models"].values())]
    if len(fields) < 2:
        return [(name, d["models"])]
    out = [(f"{name}: {f}", {m: (r.get("fields") or {}).get(f, {"note": r.get("note", "")})
                             for m, r in d["models"].items()}) for f in fields]
    return out + [(f"{name}: mean of fields", d["models"])]


def verdict(d: dict) -> str:
    """Where meshops stands on one row (``{"models": {model: result}}``): behind, level
    with (within :data:`meshops.training.standing.LEVEL_RTOL`) or ahead of the others'
    mean errors, in the words ``meshops train`` and ``meshops evaluate`` use."""
    ours = d["models"].get("meshops")
    if not ours or ours.get("mean") is None:
        return "meshops: no result"
    others = {LABELS[m]: d["models"][m]["mean"] for m in OTHERS
              if d["models"].get(m, {}).get("mean") is not None}
    return standing("meshops", ours["mean"], others)


def _best(d: dict) -> str | None:
    ok = {m: r["mean"] for m, r in d["models"].items() if r.get("mean") is not None}
    return min(ok, key=ok.get) if ok else None


def console_table(doc: dict) -> str:
    """Plain-text table: one block per data set and target field, one line per model."""
    lines = []
    for name, d in doc["datasets"].items():
        lines.append(f"{name}: {d['train']} train / {d['test']} test, {d['nodes']} nodes, "
                     f"inputs {','.join(d['inputs'])} -> "
                     f"{','.join(d.get('fields') or d['targets'])}")
        for label, models in rows(name, d):
            lines.append(f"  {label:<24} {'mean':>10} {'median':>10} {'worst':>10} "
                         f"{'wall s':>7}")
            for m in _models(doc):
                r = models.get(m)
                if r is None:
                    continue
                wall = d["models"][m].get("wall_s", 0)
                if r.get("mean") is None:
                    lines.append(f"  {LABELS[m]:<24} {r.get('note', 'no result')}")
                else:
                    note = d["models"][m].get("note")
                    lines.append(f"  {LABELS[m]:<24} {r['mean']:>10.4g} {r['median']:>10.4g} "
                                 f"{r['worst']:>10.4g} {wall:>7.0f}"
                                 + (f"   {note}" if note else ""))
            lines.append(f"  -> {verdict({'models': models})}")
        lines += [f"  {line}" for line in time_to_accuracy(d)]
    return "\n".join(lines)


def time_to_accuracy(d: dict) -> list[str]:
    """When meshops' validation error first reached the best one of each peer, and the
    zero-shot error on the finer test meshes: lines for the reports (none when the
    histories are not there)."""
    ours = d["models"].get("meshops") or {}
    hist = [h for h in ours.get("history") or [] if h.get("val") is not None]
    out = []
    for m in ("transolver", "gino"):
        peer = d["models"].get(m) or {}
        best = (peer.get("run") or {}).get("best_val")
        if not hist or best is None:
            continue
        when = next((h["s"] for h in hist if h["val"] <= best), None)
        out.append(f"time to accuracy: {LABELS[m]}'s best validation error {best:.4g} "
                   + (f"reached by meshops after {when / 60:.1f} min of training"
                      if when is not None else
                      f"not reached by meshops (its best {min(h['val'] for h in hist):.4g})"))
    fine = ours.get("fine") or {}
    if fine.get("mean") is not None and ours.get("mean"):
        out.append(f"zero-shot on the test shapes meshed about 4x finer: {fine['mean']:.4g} "
                   f"against {ours['mean']:.4g} ({fine['mean'] / ours['mean']:.2f}x)")
    return out


def markdown_table(doc: dict) -> str:
    """The docs' table of a stored result, with how it was made and where meshops loses."""
    models = _models(doc)
    head = ["data"] + [LABELS[m] for m in models]
    runs = doc.get("runs") or [doc]
    loads = "; ".join(f"{r['load']['start']} to {r['load']['end']}" for r in runs)
    out = [f"Mean relative L2 error over the test samples (P1 lumped-mass weights; per target "
           f"field, a vector's components together, and the mean over the fields; median and "
           f"worst in brackets; lower is better, best in bold). "
           f"Budget {doc['minutes']:g} min per trained model, {_n(doc['threads'], 'thread')} "
           f"each; "
           f"{doc['machine']['cpu']}, load average {loads} (start to end of each run).", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, d in doc["datasets"].items():
        nodes = d["nodes"] if isinstance(d["nodes"], int) else f"{d['nodes'][0]}-{d['nodes'][1]}"
        about = (f" ({d['train']} train / {d['test']} test, {nodes} nodes, "
                 f"{_n(len(d['inputs']), 'input')} -> "
                 f"{', '.join(d.get('fields') or d['targets'])})")
        for i, (label, row) in enumerate(rows(name, d)):
            best = _best({"models": row})
            out.append("| " + " | ".join([label + (about if i == 0 else "")]
                                         + [_cell(row.get(m), m == best, True)
                                            for m in models]) + " |")
    out += ["", "Where meshops stands:", ""]
    out += [f"- {label}: {verdict({'models': row})}" for name, d in doc["datasets"].items()
            for label, row in rows(name, d)]
    extra = [f"- {name}: {line}" for name, d in doc["datasets"].items()
             for line in time_to_accuracy(d)]
    if extra:
        out += ["", "Time to accuracy and mesh independence:", "", *extra]
    peers = {m: r for d in doc["datasets"].values() for m, r in d["models"].items()
             if m in ("transolver", "gino") and r.get("config")}
    if peers:
        out += ["", "Peer configurations:", ""]
        for m, r in peers.items():
            c = r["config"]
            arch = ", ".join(f"{k}={v}" for k, v in c["model"].items())
            out.append(f"- {LABELS[m]} ({c['library']} `{c['class']}`, "
                       f"{r['parameters']:,} parameters): {arch}; {c['optimizer']} "
                       f"lr {c['lr']:g}, weight decay {c['weight_decay']:g}, {c['schedule']} "
                       f"schedule, batch {c['batch']}; relative L2 loss with the lumped-mass "
                       f"weights, per target field and averaged; best validation checkpoint.")
    out += ["", "Commands (a later run's result replaces an earlier one's for the same data set "
            "and model):" if len(runs) > 1 else "Command:", ""]
    out += [f"- `{r['command']}` ({r['started']} to {r['finished']}; meshops "
            f"{r.get('meshops_commit') or '?'})" for r in runs]
    return "\n".join(out) + "\n"


def readme_table(doc: dict, source: str) -> str:
    """The README's short table of a stored result (means only, best in bold) and where
    meshops loses; ``source`` names the stored file. The README holds it verbatim
    between ``<!-- accuracy table -->`` markers, and a test checks it is this."""
    models = _models(doc)
    out = ["| data | " + " | ".join(LABELS[m] for m in models) + " |",
           "|" + "---|" * (len(models) + 1)]
    verdicts = []
    for name, d in doc["datasets"].items():
        for label, row in rows(name, d):
            best = _best({"models": row})
            cells = [_cell(row.get(m), m == best, True, spread=False) for m in models]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
            verdicts.append(f"- {label}: {verdict({'models': row})}")
    out += ["", *verdicts, "",
            f"Mean relative L2 error on the test samples, {doc['minutes']:g} minutes per "
            f"trained model ({_n(doc['threads'], 'thread')}), from `{source}` "
            f"(`python -m benchmarks.accuracy --table {source}` gives the full table; "
            f"docs/accuracy.md says how each number was made)."]
    return "\n".join(out) + "\n"

