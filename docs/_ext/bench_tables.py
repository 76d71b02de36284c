"""The docs' benchmark tables, generated from the stored results in ``benchmarks/results/``.

Run by the docs build (``docs/conf.py``) before the pages are read, or by hand:
``python docs/_ext/bench_tables.py OUT_DIR``. Every number in these tables is read
from a stored result file, so the docs cannot drift from what was measured; each
table names the file and the command that produced it.

Written files (Markdown, included by the pages with ``{include}``):

* ``targets.md``: the speed/memory targets of the stored full CPU run and their status;
* ``layers.md``, ``models.md``, ``search.md``, ``training.md``: that run's tables;
* ``examples.md``: the example pipelines' ``summary.json`` next to their baselines;
* ``accuracy-<name>.md``: one table per stored accuracy benchmark
  (``benchmarks.accuracy.report.markdown_table``), and all of them in ``accuracy-all.md``;
* ``stored-outputs.md``: every stored text output, verbatim, with its command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
#: The stored full CPU run the speed tables are made from.
SPEED_RUN = "cpu-2core.json"


def _row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def md_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown pipe table."""
    return "\n".join([_row(headers), "|" + "---|" * len(headers)] + [_row(r) for r in rows])


def _run_header(doc: dict, name: str) -> str:
    m = doc["machine"]
    cmds = [doc["config"]["argv"]] + [u["argv"] for u in doc.get("updates", [])]
    cmds = "\n".join("- `python -m benchmarks " + " ".join(a) + "`" for a in cmds)
    return (f"From `benchmarks/results/{name}`: {m['cpu']}, {m['cores']} cores, torch "
            f"{m['torch']}, {m['torch_threads']} threads, GPU {m['gpu']}; load average "
            f"{doc['load']['start']} at the start of the first command. It was assembled "
            f"by these commands, in order:\n\n{cmds}\n\n")


def targets_md(doc: dict, name: str) -> str:
    rows = [[t["status"], t["target"], t["measured"], t.get("why", "")]
            for t in doc.get("targets", [])]
    return (_run_header(doc, name)
            + md_table(["status", "target", "measured", "why"], rows) + "\n")


def layer_md(doc: dict, name: str, suite: str) -> str:
    """Library against the dense reference of the same formula, per case and N."""
    from benchmarks.reporting import _cell_time as t
    from benchmarks.reporting import fmt_mem, fmt_ratio

    by: dict[tuple, dict] = {}
    for r in doc["results"]:
        if r["suite"] == suite:
            by.setdefault((r["case"], r["n"]), {})[r["impl"]] = r

    def g(r, k):
        return None if r is None else r.get(k)

    rows = []
    for (case, n), d in by.items():
        lib, ref = d.get("lib"), d.get("ref")
        rows.append([f"`{case}`", f"{n:,}", t(lib, "fwd"), t(ref, "fwd"),
                     fmt_ratio(g(ref, "fwd_s"), g(lib, "fwd_s")),
                     t(lib, "fwdbwd"), t(ref, "fwdbwd"),
                     fmt_ratio(g(ref, "fwdbwd_s"), g(lib, "fwdbwd_s")),
                     fmt_mem(g(lib, "fwdbwd_mem")), fmt_mem(g(ref, "fwdbwd_mem"))])
    head = ["case", "N", "forward", "dense", "dense/lib", "fwd+bwd", "dense", "dense/lib",
            "memory fwd+bwd", "dense"]
    note = ("Median time after warm-up, each point in a fresh process; memory: peak above "
            "the inputs; `-`: not run (over the budget of the run, or no dense reference); "
            "`*`: one repetition over the time budget.")
    return _run_header(doc, name) + note + "\n\n" + md_table(head, rows) + "\n"


def search_md(doc: dict, name: str) -> str:
    from benchmarks.reporting import _cell_time, fmt_mem

    rows = [[r["case"], r["impl"] + (" (default)" if (r.get("meta") or {}).get("default")
                                     else ""), f"{r['n']:,}", _cell_time(r, "fwd"),
             fmt_mem(r.get("fwd_mem"))]
            for r in doc["results"] if r["suite"] == "search"]
    return (_run_header(doc, name) + "3-D points; knn k = 16 (self), fps to 4,096 points, "
            "partition into 256 parts.\n\n"
            + md_table(["operation", "backend", "N", "time", "peak memory"], rows) + "\n")


def training_md(doc: dict, name: str) -> str:
    from benchmarks.reporting import fmt_time

    rows = []
    for r in doc["results"]:
        if r["suite"] != "training":
            continue
        sps = r.get("samples_per_s")
        rows.append([r["case"], r["config"], f"{r['n']:,}", r["batch"], r.get("preset"),
                     f"{sps:.2f}" if sps is not None else r.get("status"),
                     fmt_time(r.get("step_s")), "; ".join(r.get("notes", []))])
    return (_run_header(doc, name) + "`Trainer` with AdamW; the second epoch is timed "
            "(the first is the warm-up).\n\n"
            + md_table(["model", "config", "N", "batch", "preset", "samples/s", "step",
                        "notes"], rows) + "\n")


def _stats(e: dict | None) -> list[str]:
    if not e:
        return ["", "", ""]
    return [f"{e['mean']:.4g}", f"{e['median']:.4g}", f"{e['worst']:.4g}"]


def examples_md(results: Path) -> str:
    rows = []
    files = sorted(results.glob("example-*-summary-*.json"))
    for f in files:
        s = json.loads(f.read_text())
        fit = (f"{s['num_train'] - s.get('num_val', 0)} fitted + {s.get('num_val', 0)} "
               f"validation")
        if s.get("epochs") is None:  # a reduced basis: chosen on validation, refitted
            trained = (f"{s['model']}: {s['minutes']:.1f} min, {fit}; "
                       f"{s.get('selected', '')}")
        else:
            trained = (f"{s['model']} ({s['parameters']:,} parameters), {s['epochs']} "
                       f"epochs in {s['minutes']:.1f} min, {fit}")
        unw = s["test"].get("l2_unweighted", {}).get("mean")
        rows.append([s["example"], trained] + _stats(s["test"]["l2"])
                    + [f"{unw:.4g}" if unw is not None else "", f"`{f.name}`"])
        for base, b in s.get("baselines", {}).items():
            if "l2" in b:
                unw = b.get("l2_unweighted", {}).get("mean")
                rows.append(["", base] + _stats(b["l2"])
                            + [f"{unw:.4g}" if unw is not None else "", ""])
            else:
                rows.append(["", base, b.get("note", "n/a"), "", "", "", ""])
    head = ["data", "model or baseline", "mean", "median", "worst", "mean unweighted",
            "stored as"]
    return ("Test relative L2 error (quadrature-weighted; the unweighted per-point error in "
            "its own column) of the examples' default runs, read from their stored "
            "`summary.json` (`benchmarks/results/`), with the baselines on the same test "
            "samples and metric.\n\n" + md_table(head, rows) + "\n")


#: Stored outputs printed verbatim whose figures are not claims, and why.
UNDER_REVIEW = {
    "reference-cuda-h100.txt": (
        "**Under review, not a claim** (issue 24): in this run the authors' code took "
        "20-40x longer per step than they report on a slower card, so the ratios below "
        "measure our harness of their code, not their code (see the GPU page)."),
}


def stored_outputs_md(results: Path) -> str:
    """Every stored text output verbatim (the files whose first line is the command)."""
    out = []
    for f in sorted(results.glob("*.txt")):
        warn = [UNDER_REVIEW[f.name], ""] if f.name in UNDER_REVIEW else []
        out += [f"## `{f.name}`", "", *warn, "```text", f.read_text().rstrip("\n"), "```",
                ""]
    return "\n".join(out)


def generate(out_dir: Path, results: Path = RESULTS) -> list[Path]:
    """Write every table into ``out_dir``; returns the written files."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.accuracy.report import markdown_table

    out_dir.mkdir(parents=True, exist_ok=True)
    doc = json.loads((results / SPEED_RUN).read_text())
    pages = {"targets.md": targets_md(doc, SPEED_RUN),
             "layers.md": layer_md(doc, SPEED_RUN, "layers"),
             "models.md": layer_md(doc, SPEED_RUN, "models"),
             "search.md": search_md(doc, SPEED_RUN),
             "training.md": training_md(doc, SPEED_RUN),
             "examples.md": examples_md(results),
             "stored-outputs.md": stored_outputs_md(results)}
    every = []
    for f in sorted(results.glob("accuracy-*.json")):
        acc = json.loads(f.read_text())
        name = f.stem.removeprefix("accuracy-")
        pages[f"accuracy-{name}.md"] = (f"From `benchmarks/results/{f.name}`.\n\n"
                                        + markdown_table(acc))
        every += [f"## `{f.name}`", "", pages[f"accuracy-{name}.md"]]
    pages["accuracy-all.md"] = "\n".join(every)
    return write_pages(out_dir, pages)


def write_pages(out_dir: Path, pages: dict[str, str]) -> list[Path]:
    """Write ``{file name: text}`` into ``out_dir``, leaving unchanged files alone (no
    rebuild of the pages that include them); returns the paths."""
    written = []
    for name, text in pages.items():
        path = out_dir / name
        if not path.exists() or path.read_text() != text:   # unchanged: no rebuild
            path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for p in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/_generated")):
        print(p)
