"""The accuracy table: on the console while the benchmark runs, and as Markdown for the
docs from a stored result (``python -m benchmarks.accuracy --table FILE.json``)."""

from __future__ import annotations

from benchmarks.accuracy import remesh
from benchmarks.accuracy.run import LABELS, MODELS
from meshops.runs.comparison import standing

#: The neural-network and classical columns meshops is compared with.
OTHERS = ("mean", "nearest", "pod_rbf", "transolver", "gino")
#: The trained models, whose results can say "did not learn".
TRAINED = ("meshops", "transolver", "gino")
#: A trained model did not learn when its mean error is within this fraction of the
#: trivial predictions' (or above): the zero field (relative error 1 by definition) and
#: the interpolated training mean. Such a number says nothing of the model.
TRIVIAL_RTOL = 0.05


def did_not_learn(model: str, row: dict) -> bool:
    """Whether the trained ``model``'s mean error on a row (``{model: result}``) is no
    better than predicting zero or the training mean (to :data:`TRIVIAL_RTOL`)."""
    r = row.get(model) or {}
    if model not in TRAINED or r.get("mean") is None:
        return False
    mean = (row.get("mean") or {}).get("mean")
    trivial = 1.0 if mean is None else min(1.0, mean)
    return r["mean"] >= (1 - TRIVIAL_RTOL) * trivial


def _base_budget(doc: dict, unit: str = "min") -> str:
    return f"{doc['epochs']} epochs" if doc.get("epochs") else f"{doc['minutes']:g} {unit}"


def budget_words(doc: dict, unit: str = "min") -> str:
    """What each trained model was given: ``N epochs`` (a fixed amount of work) or ``M
    min`` (``unit``) of the clock, and any model's own epochs (``--model-epochs``)."""
    own = doc.get("model_epochs") or {}
    return _base_budget(doc, unit) + "".join(f", {LABELS.get(m, m)} {_n(n, 'epoch')}"
                                             for m, n in sorted(own.items()))


def model_budget(doc: dict, model: str) -> str:
    """What ``model`` was given in the run ``doc``: its own epochs or the run's budget."""
    own = (doc.get("model_epochs") or {}).get(model)
    return _n(own, "epoch") if own else _base_budget(doc)


def merge(docs: list[dict]) -> dict:
    """One result of several stored runs (the same budget and threads, run side by side
    or one after another): each data set's models from every run, a later run's
    result for a model replacing an earlier one's. The commands, commits and loads of
    every run are kept (``runs``).

    Raises:
        ValueError: runs with different budgets or thread counts (not comparable).
    """
    first = docs[0]
    own: dict = {}
    for d in docs:
        if (_base_budget(d), d["threads"]) != (_base_budget(first), first["threads"]):
            raise ValueError(f"cannot merge a {budget_words(d)} {d['threads']}-thread run "
                             f"with a {budget_words(first)} {first['threads']}-thread one")
        for m, n in (d.get("model_epochs") or {}).items():
            if own.setdefault(m, n) != n:
                raise ValueError(f"cannot merge runs that gave {LABELS.get(m, m)} {own[m]} "
                                 f"and {n} epochs")
    out = {k: v for k, v in first.items() if k not in ("datasets", "runs", "model_epochs")}
    if own:
        out["model_epochs"] = own
    # a stored merge brings its own runs
    out["runs"] = [r for d in docs for r in (d.get("runs") or [
        {k: d.get(k) for k in ("command", "meshops_commit", "started", "finished", "load")}])]
    out["datasets"] = {}
    for d in docs:
        for name, ds in d["datasets"].items():
            have = out["datasets"].setdefault(name, {"models": {}})
            # a later run's description of the set wins (e.g. its fields)
            have.update({k: v for k, v in ds.items() if k != "models"})
            have["models"].update(ds["models"])
    out["models"] = [m for m in MODELS if any(m in ds["models"]
                                              for ds in out["datasets"].values())]
    return out


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _models(doc: dict) -> list[str]:
    seen = {m for d in doc["datasets"].values() for m in d["models"]}
    return [m for m in MODELS if m in seen]


def _cell(r: dict | None, best: bool, markdown: bool, spread: bool = True,
          learned: bool = True) -> str:
    if r is None:
        return "not run"
    if r.get("mean") is None:
        note = r.get("note", "no result")
        if note.startswith("pooled only"):
            return f"pooled {r['pooled']:.4g}" if "pooled" in r else "pooled only"
        return "n/a" if note.startswith("n/a") else "failed"
    if not learned:
        return f"did not learn ({r['mean']:.3g})"
    text = f"{r['mean']:.4g}"
    if markdown and best:
        text = f"**{text}**"
    if _several_seeds(r):  # the mean of several seeds
        text += f" ({r['spread'][0]:.3g}-{r['spread'][1]:.3g}, {len(r['seeds'])} seeds)"
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

    def field_result(r: dict, f: str) -> dict:
        if f in (r.get("fields") or {}):
            return r["fields"][f]
        if r.get("mean") is not None:  # a result stored before the metric was per field
            return {"note": "pooled only: scored over all channels together"}
        return {"note": r.get("note", "")}

    out = [(f"{name}: {f}", {m: field_result(r, f) for m, r in d["models"].items()})
           for f in fields]
    # a pooled error is another quantity than the mean of the fields' errors
    mean_row = {m: (r if r.get("fields") or r.get("mean") is None else
                    {"note": "pooled only: scored over all channels together",
                     "pooled": r["mean"]})
                for m, r in d["models"].items()}
    return out + [(f"{name}: mean of fields", mean_row)]


def verdict(d: dict) -> str:
    """Where meshops stands on one row (``{"models": {model: result}}``): behind, level
    with (within :data:`meshops.runs.comparison.LEVEL_RTOL`) or ahead of the others'
    mean errors, in the words ``meshops train`` and ``meshops evaluate`` use."""
    row = d["models"]
    ours = row.get("meshops")
    if not ours or ours.get("mean") is None:
        return "meshops: no result"
    if did_not_learn("meshops", row):
        return f"meshops did not learn ({ours['mean']:.4g}: no better than a trivial prediction)"
    failed = [m for m in OTHERS if did_not_learn(m, row)]
    others = {LABELS[m]: row[m]["mean"] for m in OTHERS
              if row.get(m, {}).get("mean") is not None and m not in failed}
    text = standing("meshops", ours["mean"], others)
    within = [LABELS[m] for m in OTHERS if _overlap(ours, row.get(m) or {})]
    if within:
        text += f"; level with {', '.join(within)} within the seeds' spread"
    if failed:
        text += ("; " + ", ".join(f"{LABELS[m]} ({row[m]['mean']:.3g})" for m in failed)
                 + " did not learn (no better than the zero field or the training mean), "
                   "so say nothing of meshops")
    return text


def _overlap(a: dict, b: dict) -> bool:
    """Whether two results of several seeds have overlapping ranges of their seeds' means
    (what a new seed could swap)."""
    if "spread" not in a or "spread" not in b:
        return False
    return a["spread"][0] <= b["spread"][1] and b["spread"][0] <= a["spread"][1]


def _best(d: dict) -> str | None:
    ok = {m: r["mean"] for m, r in d["models"].items()
          if r.get("mean") is not None and not did_not_learn(m, d["models"])}
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
                wall = d["models"][m].get("wall_s")
                wall = f"{wall:>7.0f}" if wall is not None else f"{'-':>7}"  # - : reused
                if r.get("mean") is None:
                    lines.append(f"  {LABELS[m]:<24} {r.get('note', 'no result')}")
                else:
                    note = d["models"][m].get("note")
                    if did_not_learn(m, models):
                        note = "did not learn" + (f"; {note}" if note else "")
                    lines.append(f"  {LABELS[m]:<24} {r['mean']:>10.4g} {r['median']:>10.4g} "
                                 f"{r['worst']:>10.4g} {wall}" + _seeds_words(r)
                                 + (f"   {note}" if note else ""))
            lines.append(f"  -> {verdict({'models': models})}")
        lines += [] if doc.get("epochs") else [f"  {line}" for line in time_to_accuracy(d)]
        lines += [f"  {line}" for line in mesh_independence_lines(d, _models(doc))]
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
    return out


def _remeshed(r: dict) -> dict:
    """A model's re-meshed scores; a result stored before the suite had one re-meshed
    split, meshops' ``fine`` (the test shapes uniformly finer)."""
    if "remeshed" in r:
        return r["remeshed"]
    fine = r.get("fine") or {}
    if fine.get("mean") is not None and r.get("mean"):
        fine = {**fine, "ratio": fine["mean"] / r["mean"]}
    return {"test_fine": fine} if fine else {}


def mesh_independence(d: dict) -> list[tuple[str, str, dict | None, dict]]:
    """The zero-shot rows of one data set: ``(split, field, the finite-element
    difference of the truths (or None), {model: {"mean", "ratio"}})``, a row per
    re-meshed split and target field (``"mean"``: the mean of the fields)."""
    per_model = {m: _remeshed(r) for m, r in d["models"].items()}
    splits = list(dict.fromkeys(s for v in per_model.values() for s in v))
    out = []
    for split in splits:
        truth = (d.get("truth_difference") or {}).get(split)
        for f in [*(d.get("fields") or []), "mean"] if len(d.get("fields") or []) > 1 \
                else ["mean"]:
            def pick(r):
                if f == "mean":
                    return r
                got = dict((r.get("fields") or {}).get(f) or {})
                if got and "moved" in r:
                    got["moved"] = (r["moved"].get("fields") or {}).get(f) or {}
                return got

            models = {m: pick(v[split]) for m, v in per_model.items()
                      if split in v and pick(v[split]).get("mean") is not None}
            out.append((split, f, pick(truth) if truth else None, models))
    return out


def _several_seeds(r: dict) -> bool:
    """Whether ``r`` is the mean of several seeds (a model run with one seed only, as the
    classical ones are, has no spread to show)."""
    return "spread" in r and len(r.get("seeds") or ()) > 1


def _seeds_words(r: dict) -> str:
    """The range of the seeds' means of a result of several seeds, else nothing."""
    if not _several_seeds(r):
        return ""
    return f"   seeds {r['spread'][0]:.4g}-{r['spread'][1]:.4g} ({len(r['seeds'])})"


def _zero_shot_cell(r: dict | None) -> str:
    if not r:
        return "not run"
    moved = (r.get("moved") or {}).get("mean")
    spread = f" [{r['spread'][0]:.3g}-{r['spread'][1]:.3g}]" if _several_seeds(r) else ""
    return f"{r['mean']:.4g}" + spread + (f" ({r['ratio']:.2f}x)" if r.get("ratio") else "") \
        + (f"; moved {moved:.4g}" if moved is not None else "")


def mesh_independence_lines(d: dict, models: list[str]) -> list[str]:
    """The zero-shot rows of one data set as console lines."""
    out = []
    for split, f, truth, row in mesh_independence(d):
        fe = f"FE difference of truths {truth['mean']:.3g}" if truth else "no truth difference"
        cells = ", ".join(f"{LABELS[m]} {_zero_shot_cell(row[m])}" for m in models if m in row)
        out.append(f"zero-shot, {remesh.label(split)}, {f}: {cells}; {fe}")
    return out


def _mesh_independence_markdown(doc: dict, models: list[str]) -> list[str]:
    rows_ = [(name, *row) for name, d in doc["datasets"].items()
             for row in mesh_independence(d)]
    if not rows_:
        return []
    head = ["data", "re-meshed", "field", "FE difference of the truths"] + [LABELS[m]
                                                                           for m in models]
    out = ["", "Mesh independence: every model predicts the test shapes meshed again, never "
           "seen in training (error, and in brackets its ratio to the model's own error on "
           "the test meshes). The finite-element difference of the truths (the test mesh's "
           "solution interpolated onto the new mesh against the new mesh's solution) is "
           "what the meshing alone changes; \"moved\" scores the model's own predictions "
           "on the test meshes carried onto the new mesh the same way: what it would score "
           "there if it computed the same function on every mesh.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, split, f, truth, row in rows_:
        out.append("| " + " | ".join([name, remesh.label(split), f,
                                      f"{truth['mean']:.3g}" if truth else "-"]
                                     + [_zero_shot_cell(row.get(m)) for m in models]) + " |")
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
           f"Budget {budget_words(doc)} per trained model, {_n(doc['threads'], 'thread')} "
           f"each; "
           f"{doc['machine']['cpu']}, load average {loads} (start to end of each run)"
           + (f"; {doc['note']}." if doc.get("note") else "."), "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, d in doc["datasets"].items():
        nodes = d["nodes"] if isinstance(d["nodes"], int) else f"{d['nodes'][0]}-{d['nodes'][1]}"
        about = (f" ({d['train']} train / {d['test']} test, {nodes} nodes, "
                 f"{_n(len(d['inputs']), 'input')} -> "
                 f"{', '.join(d.get('fields') or d['targets'])})")
        for i, (label, row) in enumerate(rows(name, d)):
            best = _best({"models": row})
            out.append("| " + " | ".join([label + (about if i == 0 else "")]
                                         + [_cell(row.get(m), m == best, True,
                                                  learned=not did_not_learn(m, row))
                                            for m in models]) + " |")
    out += ["", "Where meshops stands:", ""]
    out += [f"- {label}: {verdict({'models': row})}" for name, d in doc["datasets"].items()
            for label, row in rows(name, d)]
    # a fixed amount of work on a loaded machine: its times are not figures
    extra = [] if doc.get("epochs") else [f"- {name}: {line}"
                                          for name, d in doc["datasets"].items()
                                          for line in time_to_accuracy(d)]
    if extra:
        out += ["", "Time to accuracy:", "", *extra]
    out += _mesh_independence_markdown(doc, models)
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
            cells = [_cell(row.get(m), m == best, True, spread=False,
                           learned=not did_not_learn(m, row)) for m in models]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
            verdicts.append(f"- {label}: {verdict({'models': row})}")
    out += ["", *verdicts, "",
            f"Mean relative L2 error on the test samples, {budget_words(doc, 'minutes')} per "
            f"trained model ({_n(doc['threads'], 'thread')}), from `{source}` "
            f"(`python -m benchmarks.accuracy --table {source}` gives the full table; "
            f"docs/accuracy.md says how each number was made)."]
    return "\n".join(out) + "\n"



def plot_histories(doc: dict, path) -> int:
    """Each trained model's validation error against its training time, a panel per data
    set (log scale), written to ``path`` (PNG); the number of panels drawn (data sets
    without a history are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, d) for name, d in doc["datasets"].items()
              if any((d["models"].get(m) or {}).get("history") for m in TRAINED)]
    if not panels:
        return 0
    cols = min(len(panels), 3)
    n_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.2 * cols, 3.3 * n_rows), squeeze=False)
    for ax, (name, d) in zip(axes.flat, panels):
        for m in TRAINED:
            hist = [h for h in (d["models"].get(m) or {}).get("history") or []
                    if h.get("val") is not None]
            if hist:
                ax.plot([h["s"] / 60 for h in hist], [h["val"] for h in hist], marker=".",
                        label=LABELS[m], color=f"C{TRAINED.index(m)}")  # one colour each
        ax.axvline(doc["minutes"] / 2, color="0.7", lw=0.8, ls="--")
        ax.set(title=name, xlabel="training time (min)", yscale="log",
               ylabel="validation rel. L2 (mean of fields)")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"validation error against training time ({doc['minutes']:g} min budget; "
                 f"the dashed line is half of it)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(panels)
