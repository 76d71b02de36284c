"""The targets table (PASS / MISS / N/A) and the regression guard.

Targets are evaluated from the result rows of a run, so they can be re-evaluated
from a stored JSON file (``evaluate_targets(read_json(path))``).  ``N/A`` means the
figure was not measured in this run (``--quick``, ``--only``, a missing module or no
GPU); the reason is in the ``why`` column.

Regression guard: :func:`find_baseline` picks a stored run of the same machine
class (same core count and device kind; a full run before a quick one, then the most
recent) and :func:`compare` flags every library timing that became more than
``factor`` times slower.  When both runs also timed the dense reference at the same
size, the slowdown must also hold relative to the reference (``(lib/ref)_new /
(lib/ref)_old > factor``), so that a machine that is uniformly slower (load) does not
trip the guard, while a slower library path does.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Optional

from benchmarks.reporting import fmt_mem, fmt_time, read_json

GB = 1 << 30

PASS, MISS, NA = "PASS", "MISS", "N/A"


# ------------------------------------------------------------------------- lookups
def _row(rows, suite: str, case: str, impl: str, n: int) -> Optional[dict[str, Any]]:
    for r in rows:
        if r["suite"] == suite and r["case"] == case and r["impl"] == impl and r["n"] == n:
            return r
    return None


def _val(r: Optional[dict], key: str) -> Optional[float]:
    return None if r is None else r.get(key)


def _t(id_: str, target: str, status: str, measured: str, why: str = "") -> dict[str, Any]:
    return {"id": id_, "target": target, "status": status, "measured": measured, "why": why}


def _noisy(*rows: Optional[dict]) -> str:
    """A note when a row was timed while other processes kept cores busy."""
    from benchmarks.reporting import NOISY

    f = max((r.get("foreign_cpu") or 0.0) for r in rows if r is not None) if any(rows) else 0.0
    return f"timed while {f:.2f} cores were busy with other work" if f > NOISY else ""


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _missing(rows, suite, case, run_cfg, n: Optional[int] = None) -> str:
    if not any(r["suite"] == suite and r["case"] == case for r in rows):
        return f"{suite}/{case} not measured in this run"
    if n is not None and any(r["suite"] == suite and r["case"] == case and r["n"] == n
                             for r in rows):
        return f"N={n} not completed by every implementation"
    return "size not measured in this run" + (" (--quick)" if run_cfg.get("quick") else "")


# ------------------------------------------------------------------------- targets
def evaluate_targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows, cfg = doc["results"], doc.get("config", {})
    out = []

    # T1 continuum: 5x faster, 10x less memory than the dense formula at N=8192, fwd+bwd
    n = 8192
    lib, ref = (_row(rows, "layers", "continuum", "lib", n),
                _row(rows, "layers", "continuum", "ref", n))
    tgt = ("ContinuumAttention N=8192, 64 ch, 4 heads, fwd+bwd: >=5x faster, >=10x less memory "
           "than dense")
    tl, tr = _val(lib, "fwdbwd_s"), _val(ref, "fwdbwd_s")
    ml, mr = _val(lib, "fwdbwd_mem"), _val(ref, "fwdbwd_mem")
    if tl is None or tr is None or ml is None or mr is None:
        why = _missing(rows, "layers", "continuum", cfg, n)
        if ref is not None and ref.get("notes"):
            why += "; ref: " + "; ".join(ref["notes"])
        out.append(_t("T1", tgt, NA, "-", why))
    else:
        st = PASS if tr / tl >= 5 and mr / max(ml, 1) >= 10 else MISS
        meas = (f"time {fmt_time(tl)} vs {fmt_time(tr)} = {tr / tl:.1f}x; memory {fmt_mem(ml)} "
                f"vs {fmt_mem(mr)} = {mr / max(ml, 1):.1f}x")
        why = "" if st == PASS else _why_continuum(tr / tl, mr / max(ml, 1))
        out.append(_t("T1", tgt, st, meas, _join(why, _noisy(lib, ref))))

    # T2 continuum at 65,536: fwd+bwd within 2 GB
    r = _row(rows, "layers", "continuum", "lib", 65536)
    tgt = "ContinuumAttention N=65,536 fwd+bwd within 2 GB"
    m = _val(r, "fwdbwd_mem")
    if m is None:
        out.append(_t("T2", tgt, NA, "-", _missing(rows, "layers", "continuum", cfg)
                      + ("; " + "; ".join(r["notes"]) if r and r.get("notes") else "")))
    else:
        out.append(_t("T2", tgt, PASS if m <= 2 * GB else MISS,
                      f"peak {fmt_mem(m)} above inputs; time {fmt_time(_val(r, 'fwdbwd_s'))}"))

    # T3 Galerkin linear: t(4N)/t(N) <= 4.5 from 16k to 1M, with glibc's default
    # allocator and with meshops.utils.allocator.keep_freed_memory() (no page faults per step)
    ns = [16384, 65536, 262144, 1048576]
    for tid, case, how in (("T3", "galerkin", "system malloc"),
                           ("T3k", "galerkin_keepmem", "keep_freed_memory()")):
        tgt = f"GalerkinAttention linear: time(4N)/time(N) <= 4.5 for N = 16k .. 1M ({how})"
        ratios = []
        for mode in ("fwd", "fwdbwd"):
            for a, b in zip(ns, ns[1:]):
                ta = _val(_row(rows, "layers", case, "lib", a), f"{mode}_s")
                tb = _val(_row(rows, "layers", case, "lib", b), f"{mode}_s")
                if ta is not None and tb is not None:
                    ratios.append((mode, a, b, tb / ta))
        complete = len(ratios) == 2 * (len(ns) - 1)
        if not ratios:
            out.append(_t(tid, tgt, NA, "-", _missing(rows, "layers", case, cfg)))
            continue
        worst = max(ratios, key=lambda x: x[3])
        meas = ", ".join(f"{m} {a // 1024}k->{b // 1024}k {q:.2f}" for m, a, b, q in ratios)
        st = MISS if worst[3] > 4.5 else (PASS if complete else NA)
        out.append(_t(tid, tgt, st, meas, "" if complete else "not all sizes measured"))

    # T4 position attention with a shared mesh >= 3x faster than per-sample kernels
    tgt = ("PositionAttention, batch of 8 on one mesh, >= 3x faster than recomputing the kernel "
           "per sample")
    meas, st, noise = [], NA, ""
    for n in (2048, 1024, 4096):
        lib = _row(rows, "layers", "position_batch", "lib", n)
        ref = _row(rows, "layers", "position_batch", "ref", n)
        vals = {m: (_val(lib, f"{m}_s"), _val(ref, f"{m}_s")) for m in ("fwd", "fwdbwd")}
        if all(a is not None and b is not None for a, b in vals.values()):
            q = {m: b / a for m, (a, b) in vals.items()}
            meas = [f"N={n}: fwd {q['fwd']:.1f}x, fwd+bwd {q['fwdbwd']:.1f}x"]
            st = PASS if min(q.values()) >= 3 else MISS
            noise = _noisy(lib, ref)
            break
    out.append(_t("T4", tgt, st, "; ".join(meas) or "-",
                  _join(noise) if meas else _missing(rows, "layers", "position_batch", cfg)))

    # T5 cross / local position attention 100k -> 2k forward under 1 s
    for case, id_ in (("position_cross", "T5a"), ("local_position_cross", "T5b")):
        r = _row(rows, "layers", case, "lib", 100_000)
        tgt = f"{case}: 100k input points -> 2,048 latent points, forward < 1 s"
        t = _val(r, "fwd_s")
        if t is None:
            out.append(_t(id_, tgt, NA, "-", _missing(rows, "layers", case, cfg)))
        else:
            meta = r.get("meta") or {}
            extra = f" (k={meta['k']})" if "k" in meta else ""
            out.append(_t(id_, tgt, PASS if t < 1.0 else MISS, f"fwd {fmt_time(t)}{extra}",
                          _noisy(r)))

    # T6 patched transformer at 1M points: forward within 24 GB, time/point flat +-30%
    for case, id_ in (("patched_transformer", "T6"), ("patched_transformer_p4096", "T6b")):
        tgt = (f"{case}: 1,000,000-point forward within 24 GB; time/point flat (+-30%) "
               f"from 100k to 1M")
        pts = sorted((r["n"], r["fwd_s"], r.get("fwd_mem")) for r in rows
                     if r["suite"] == "models" and r["case"] == case and r["impl"] == "lib"
                     and r.get("fwd_s") is not None and 100_000 <= r["n"] <= 1_000_000)
        have = {n for n, *_ in pts}
        if not pts or 100_000 not in have:
            if case == "patched_transformer_p4096" and not any(r["case"] == case for r in rows):
                continue
            out.append(_t(id_, tgt, NA, "-", _missing(rows, "models", case, cfg)))
            continue
        base = pts[0][1] / pts[0][0]
        per_pt = [(n, t / n / base) for n, t, _ in pts]
        mem_1m = next((m for n, _, m in pts if n == 1_000_000), None)
        flat = all(0.7 <= q <= 1.3 for _, q in per_pt)
        fits = 1_000_000 in have and mem_1m is not None and mem_1m <= 24 * GB
        meas = ("time/point rel. to 100k: " + ", ".join(f"{n // 1000}k {q:.2f}" for n, q in per_pt)
                + (f"; 1M fwd {fmt_time(dict((n, t) for n, t, _ in pts)[1_000_000])}, "
                   f"peak {fmt_mem(mem_1m)}" if 1_000_000 in have else "; 1M not reached"))
        st = PASS if flat and fits else MISS
        why = ""
        if not flat:
            why = "time per point grows with N: with a fixed number of patches P the " \
                  "window attention costs O(N^2/P)"
        if 1_000_000 not in have:
            why = (why + "; " if why else "") + "1M forward did not run within the budgets"
        out.append(_t(id_, tgt, st, meas, why))

    # T7 search at 1M points with the default backend < 5 s
    for op, id_ in (("knn", "T7a"), ("fps", "T7b")):
        tgt = {"knn": "kNN (k=16) at 1M points, default CPU backend, < 5 s",
               "fps": "FPS 1M -> 4096 points, default CPU backend, < 5 s"}[op]
        r = next((r for r in rows if r["suite"] == "search" and r["case"] == op
                  and r["n"] == 1_000_000 and (r.get("meta") or {}).get("default")), None)
        t = _val(r, "fwd_s")
        if t is None:
            out.append(_t(id_, tgt, NA, "-", _missing(rows, "search", op, cfg)))
        else:
            out.append(_t(id_, tgt, PASS if t < 5.0 else MISS, f"{r['impl']}: {fmt_time(t)}",
                          _noisy(r)))

    # T8 GPU
    gpu = doc.get("gpu") or {}
    tgt = ("GPU: ContinuumAttention uses a fused SDPA kernel in bf16/fp16, N=1M fwd+bwd runs; "
           "TFLOP/s vs peak")
    if not gpu.get("available"):
        out.append(_t("T8", tgt, NA, "no GPU", gpu.get("note", "no GPU")))
    else:
        e = (gpu.get("dtypes") or {}).get("bfloat16") or {}
        run = next((r for r in e.get("runs", []) if r.get("n") == 1_000_000 and "fwdbwd_s" in r),
                   None)
        fused = e.get("kernel") in ("flash", "memory-efficient", "cudnn")
        peak = gpu.get("peak_tflops_bf16")
        if run is None:
            out.append(_t("T8", tgt, MISS, f"kernel {e.get('kernel')}", "N=1M fwd+bwd did not run: "
                          + str(next((r.get("error") for r in e.get("runs", []) if "error" in r),
                                     e.get("error")))))
        else:
            tf = run["fwdbwd_tflops"]
            meas = (f"{gpu.get('name')}: kernel {e.get('kernel')}; N=1M fwd+bwd "
                    f"{fmt_time(run['fwdbwd_s'])} = {tf:.1f} TFLOP/s"
                    + (f" ({100 * tf / peak:.1f}% of {peak:g})" if peak else " (peak unknown)"))
            out.append(_t("T8", tgt, PASS if fused else MISS, meas,
                          "" if fused else f"kernels: {e.get('kernels')}"))
    out += _flex_targets(gpu)
    return out


FLEX_TARGET = 0.40


def _flex_targets(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    """T9/T10: FlexAttention fwd+bwd in bf16 at >= 40 % of the card's peak at N = 262k,
    N = 1M measured; continuum attention (T9) and PiT's position attention (T10)."""
    out = []
    e = (gpu.get("dtypes") or {}).get("bfloat16") or {}
    for id_, key, what in (("T9", "flex", "continuum attention"),
                           ("T10", "position", "PiT position attention")):
        tgt = (f"GPU: {what} through FlexAttention, bf16 fwd+bwd >= "
               f"{FLEX_TARGET:.0%} of peak at N=262k; N=1M measured")
        if not gpu.get("available"):
            out.append(_t(id_, tgt, NA, "no GPU", gpu.get("note", "no GPU")))
            continue
        runs = {r.get("n"): r for r in e.get(key, []) if r.get("impl") == "flex"}
        r262, r1m = runs.get(262144, {}), runs.get(1_000_000, {})
        if "fwdbwd_of_peak" not in r262:
            out.append(_t(id_, tgt, MISS if e else NA, "-",
                          str(r262.get("error") or "N=262k not measured (peak unknown?)")))
            continue
        frac = r262["fwdbwd_of_peak"]
        meas = (f"262k: {r262['fwdbwd_tflops']:.0f} TFLOP/s = {frac:.1%} (exp ceiling "
                f"{r262.get('fwdbwd_ceiling', float('nan')):.0%}); 1M: "
                + (f"{fmt_time(r1m['fwdbwd_s'])} = {r1m['fwdbwd_of_peak']:.1%}"
                   if "fwdbwd_of_peak" in r1m else str(r1m.get("error", "not run"))))
        ok = frac >= FLEX_TARGET and "fwdbwd_s" in r1m
        out.append(_t(id_, tgt, PASS if ok else MISS, meas, ""))
    return out


def _why_continuum(speed: float, mem: float) -> str:
    parts = []
    if speed < 5:
        parts.append(f"speed-up {speed:.1f}x < 5x")
    if mem < 10:
        parts.append(f"memory ratio {mem:.1f}x < 10x")
    return "; ".join(parts)


# ------------------------------------------------------------------- regression guard
def find_baseline(results_dir: str | os.PathLike, machine: dict[str, Any],
                  exclude: Optional[str | os.PathLike] = None
                  ) -> Optional[tuple[Path, dict[str, Any]]]:
    """The stored run to compare with: same ``cores`` and ``device_kind``; full runs
    before quick ones, then the most recently finished."""
    excl = Path(exclude).resolve() if exclude else None
    found = []
    for p in glob.glob(os.path.join(str(results_dir), "*.json")):
        path = Path(p)
        if excl is not None and path.resolve() == excl:
            continue
        try:
            doc = read_json(path)
        except (ValueError, OSError):
            continue
        m = doc.get("machine", {})
        if m.get("cores") == machine.get("cores") and \
                m.get("device_kind") == machine.get("device_kind"):
            found.append((not doc.get("config", {}).get("quick", False),
                          doc.get("finished", ""), path, doc))
    if not found:
        return None
    found.sort(key=lambda x: (x[0], x[1]))
    return found[-1][2], found[-1][3]


def compare(current: dict[str, Any], baseline: dict[str, Any], factor: float = 2.0,
            suites: tuple[str, ...] = ("layers",), floor_s: float = 1e-3
            ) -> list[dict[str, Any]]:
    """Library timings of ``current`` against ``baseline``, per (suite, case, N, mode).

    Each entry has ``slowdown`` (new / old median time), ``relative`` (the slowdown of
    lib/ref when both runs timed the reference, else None) and ``regression``:
    ``slowdown > factor``, ``new - old > floor_s`` and (``relative`` is None or
    ``relative > factor``).
    """
    def index(doc):
        return {(r["suite"], r["case"], r["impl"], r["n"]): r for r in doc.get("results", [])}

    old, new = index(baseline), index(current)
    out = []
    for key, r in new.items():
        suite, case, impl, n = key
        if impl != "lib" or suite not in suites or key not in old:
            continue
        for mode in ("fwd", "fwdbwd"):
            tn, to = r.get(f"{mode}_s"), old[key].get(f"{mode}_s")
            if tn is None or to is None or to <= 0:
                continue
            rel = None
            rn = (new.get((suite, case, "ref", n)) or {}).get(f"{mode}_s")
            ro = (old.get((suite, case, "ref", n)) or {}).get(f"{mode}_s")
            if rn and ro:
                rel = (tn / rn) / (to / ro)
            slow = tn / to
            reg = slow > factor and tn - to > floor_s and (rel is None or rel > factor)
            out.append({"suite": suite, "case": case, "n": n, "mode": mode, "old_s": to,
                        "new_s": tn, "slowdown": slow, "relative": rel, "regression": reg})
    return out


def regression_report(comparisons: list[dict[str, Any]], baseline_path: Any,
                      factor: float) -> str:
    from benchmarks.reporting import format_table

    rows = [["REGRESSION" if c["regression"] else "ok", c["suite"], c["case"], c["n"], c["mode"],
             fmt_time(c["old_s"]), fmt_time(c["new_s"]), f"{c['slowdown']:.2f}x",
             "-" if c["relative"] is None else f"{c['relative']:.2f}x"]
            for c in sorted(comparisons, key=lambda c: -c["slowdown"])]
    n_reg = sum(c["regression"] for c in comparisons)
    title = (f"[check]  against {baseline_path}: {len(comparisons)} timings compared, "
             f"{n_reg} more than {factor:g}x slower")
    return format_table(["", "suite", "case", "N", "mode", "stored", "now", "slowdown",
                         "vs ref"], rows, title)
