"""Tables on stdout, the JSON file and the log-log scaling plot."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from benchmarks import SCHEMA
from benchmarks.paths import portable

MB = 1 << 20


# ----------------------------------------------------------------------------- JSON
def write_json(path: str | os.PathLike, doc: dict[str, Any],
               roots: Optional[Mapping[str, Any]] = None) -> Path:
    """Write ``doc`` atomically (temporary file + rename), every path in it written by
    :func:`benchmarks.paths.portable` (``roots``: the writer's named folders)."""
    path, doc = Path(path), portable(doc, roots)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=False, default=_jsonable)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    with open(path) as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a meshops benchmark file (schema {doc.get('schema')!r})"
                         if isinstance(doc, dict) else f"{path}: not a JSON object")
    return doc


# ---------------------------------------------------------------------------- tables
def format_table(headers: list[str], rows: Iterable[list[Any]], title: str = "") -> str:
    rows = [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    out = [title] if title else []
    out.append("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    out.append(line)
    for r in rows:
        out.append("  ".join(c.rjust(w) if _numeric(c) else c.ljust(w)
                             for c, w in zip(r, widths)))
    return "\n".join(out)


def _numeric(s: str) -> bool:
    try:
        float(s.rstrip("x%").replace(",", ""))
        return True
    except ValueError:
        return False


def fmt_time(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}us"
    if s < 1:
        return f"{s * 1e3:.1f}ms"
    return f"{s:.2f}s"


def fmt_mem(b: Optional[float]) -> str:
    if b is None:
        return "-"
    if b >= 1 << 30:
        return f"{b / (1 << 30):.2f}GB"
    return f"{b / MB:.1f}MB"


def fmt_ratio(a: Optional[float], b: Optional[float]) -> str:
    if a is None or b is None or b <= 0:
        return "-"
    return f"{a / b:.1f}x"


#: rows measured while other processes kept more cores busy than this are marked "!"
NOISY = 0.5


def fmt_foreign(f: Optional[float]) -> str:
    if f is None:
        return "-"
    return f"{f:.2f}" + ("!" if f > NOISY else "")


def _cell_time(r: Optional[dict], mode: str) -> str:
    if r is None:
        return "-"
    v = r.get(f"{mode}_s")
    st = r.get(f"{mode}_status")
    if v is None:
        return st or "-"
    return fmt_time(v) + ("*" if st == "over_time" else "")


def layer_table(rows: list[dict[str, Any]], suite: str) -> str:
    """One line per (case, N): library and reference side by side, with their ratios."""
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["suite"] == suite:
            by.setdefault((r["case"], r["n"]), {})[r["impl"]] = r
    out = []
    for (case, n), d in by.items():
        lib, ref = d.get("lib"), d.get("ref")
        g = lambda r, k: None if r is None else r.get(k)  # noqa: E731
        out.append([case, n, _cell_time(lib, "fwd"), _cell_time(ref, "fwd"),
                     fmt_ratio(g(ref, "fwd_s"), g(lib, "fwd_s")),
                     _cell_time(lib, "fwdbwd"), _cell_time(ref, "fwdbwd"),
                     fmt_ratio(g(ref, "fwdbwd_s"), g(lib, "fwdbwd_s")),
                     fmt_mem(g(lib, "fwd_mem")), fmt_mem(g(lib, "fwdbwd_mem")),
                     fmt_mem(g(ref, "fwdbwd_mem")),
                     fmt_ratio(g(ref, "fwdbwd_mem"), g(lib, "fwdbwd_mem")),
                     g(lib, "load1"), fmt_foreign(g(lib, "foreign_cpu"))])
    headers = ["case", "N", "fwd", "fwd ref", "ref/lib", "fwd+bwd", "f+b ref", "ref/lib",
               "mem fwd", "mem f+b", "mem f+b ref", "ref/lib", "load1", "foreign"]
    return format_table(headers, out, f"[{suite}]  time = median after warm-up (* = one "
                                      f"run over the time budget); mem = peak above baseline; "
                                      f"foreign = cores busy with other work (! > {NOISY})")


def search_table(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        if r["suite"] != "search":
            continue
        dflt = " (default)" if (r.get("meta") or {}).get("default") else ""
        out.append([r["case"], r["impl"] + dflt, r["n"], _cell_time(r, "fwd"),
                    fmt_mem(r.get("fwd_mem")), r.get("fwd_reps"), r.get("load1"),
                    fmt_foreign(r.get("foreign_cpu")), "; ".join(r.get("notes", []))[:60]])
    return format_table(["op", "backend", "N", "time", "peak mem", "reps", "load1", "foreign",
                         "notes"], out, "[search]  3-D points; knn k=16 (self), fps 4096, "
                                        "partition 256 parts")


def training_table(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        if r["suite"] != "training":
            continue
        sps = r.get("samples_per_s")
        out.append([r["case"], r["config"], r["n"], r["batch"], r.get("preset"),
                    f"{sps:.2f}" if sps is not None else r.get("status"),
                    fmt_time(r.get("step_s")), r.get("load1"), fmt_foreign(r.get("foreign_cpu")),
                    "; ".join(r.get("notes", []))[:70]])
    return format_table(["model", "config", "N", "batch", "preset", "samples/s", "step",
                         "load1", "foreign", "notes"], out,
                        "[training]  Trainer, AdamW, 2nd epoch (1st = warm-up)")


def gpu_text(gpu: dict[str, Any]) -> str:
    from benchmarks.gpu import all_runs, run_line
    if not gpu or not gpu.get("available"):
        return "[gpu]  " + (gpu or {}).get("note", "no GPU")
    lines = [f"[gpu]  {gpu.get('name')}  peak {gpu.get('peak_tflops_bf16')} TFLOP/s (bf16 dense)"]
    for dt, e in gpu.get("dtypes", {}).items():
        lines.append(f"  {dt}: SDPA kernel = {e.get('kernel')}; accepting backends: "
                     f"{e.get('backends_accepting')}")
        lines += ["    " + run_line(r) for r in all_runs(e)]
    return "\n".join(lines)


def targets_table(targets: list[dict[str, Any]]) -> str:
    rows = [[t["status"], t["id"], t["target"], t["measured"], t.get("why", "")]
            for t in targets]
    return format_table(["", "id", "target", "measured", "why / evidence"], rows, "[targets]")


def full_report(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    parts = [f"meshops benchmarks  {'quick' if doc['config']['quick'] else 'full'} run  "
             f"{m['cpu']} ({m['cores']} cores, torch {m['torch']}, {m['torch_threads']} threads)"
             f"  GPU: {m['gpu']}",
             f"load average: start {doc['load']['start']}  end {doc['load'].get('end')}"]
    rows = doc["results"]
    for suite in ("layers", "models"):
        if any(r["suite"] == suite for r in rows):
            parts.append(layer_table(rows, suite))
    if any(r["suite"] == "search" for r in rows):
        parts.append(search_table(rows))
    if any(r["suite"] == "training" for r in rows):
        parts.append(training_table(rows))
    if "gpu" in doc:
        parts.append(gpu_text(doc["gpu"]))
    if doc.get("targets"):
        parts.append(targets_table(doc["targets"]))
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------- plot
def plot(doc: dict[str, Any], path: str | os.PathLike) -> Optional[Path]:
    """Log-log time and memory (forward+backward; forward where there is no backward)
    against N: layers, models and search.  Solid: library, dashed: dense reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["results"]
    panels = [("layers", "fwdbwd"), ("models", "fwd"), ("search", "fwd")]
    panels = [p for p in panels if any(r["suite"] == p[0] for r in rows)]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 4.6 * len(panels)), squeeze=False)
    for (suite, mode), (ax_t, ax_m) in zip(panels, axes):
        series: dict[tuple[str, str], list[tuple[int, Optional[float], Optional[float]]]] = {}
        for r in rows:
            if r["suite"] != suite:
                continue
            series.setdefault((r["case"], r["impl"]), []).append(
                (r["n"], r.get(f"{mode}_s"), r.get(f"{mode}_mem")))
        ckey = (lambda c, i: f"{c}/{i}") if suite == "search" else (lambda c, i: c)
        names = sorted({ckey(c, i) for c, i in series})
        cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
        colour = {c: cmap(i % cmap.N) for i, c in enumerate(names)}
        for (case, impl), pts in sorted(series.items()):
            pts.sort()
            style = "-" if impl == "lib" or suite == "search" else "--"
            label = case if impl == "lib" else f"{case} ({impl})"
            if suite == "search":
                label = f"{case}/{impl}"
            for ax, idx, scale in ((ax_t, 1, 1.0), (ax_m, 2, 1.0 / MB)):
                xy = [(n, v * scale) for n, *vals in pts for v in [vals[idx - 1]] if v]
                if xy:
                    ax.plot(*zip(*xy), style, marker="o", ms=3, color=colour[ckey(case, impl)],
                            label=label)
        what = ("forward+backward" if mode == "fwdbwd" else "forward" if suite == "models"
                else "call")
        ax_t.set_title(f"{suite}: {what} time")
        ax_m.set_title(f"{suite}: {what} peak memory above baseline")
        ax_t.set_ylabel("seconds")
        ax_m.set_ylabel("MB")
        for ax in (ax_t, ax_m):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("N (points)")
            ax.grid(True, which="both", alpha=0.3)
        ax_t.legend(fontsize=7, ncol=2)
    m = doc["machine"]
    fig.suptitle(f"meshops {'quick' if doc['config']['quick'] else 'full'} benchmarks: {m['cpu']}, "
                 f"{m['cores']} cores, GPU {m['gpu']}, torch {m['torch']}; load "
                 f"{doc['load']['start']} -> {doc['load'].get('end')}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b <= 0 or (isinstance(a, float) and math.isnan(a)):
        return None
    return a / b
