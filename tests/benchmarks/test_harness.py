"""Smoke tests of the benchmark harness's logic (no timing assertions)."""

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root holds benchmarks/

from benchmarks import SCHEMA, check, harness, reporting  # noqa: E402

MACHINE = {"cpu": "Test CPU", "cores": 2, "device_kind": "cpu", "device": "cpu", "gpu": "none",
           "torch": "2.x", "torch_threads": 2}


def _row(case, impl, n, fwd, fwdbwd, suite="layers", mem=None):
    return {"suite": suite, "case": case, "impl": impl, "n": n, "batch": 1, "notes": [],
            "fwd_s": fwd, "fwd_status": "ok", "fwdbwd_s": fwdbwd, "fwdbwd_status": "ok",
            "fwd_mem": mem, "fwdbwd_mem": mem, "load1": 0.5, "foreign_cpu": 0.1}


def _doc(rows, quick=False, finished="2025-01-01T00:00:00", machine=MACHINE):
    return {"schema": SCHEMA, "machine": dict(machine), "config": {"quick": quick},
            "load": {"start": [0.5, 0.5, 0.5], "end": [0.6, 0.5, 0.5]},
            "finished": finished, "results": rows}


BASE_ROWS = [_row("continuum", "lib", 4096, 0.010, 0.030),
             _row("continuum", "ref", 4096, 0.100, 0.300),
             _row("galerkin", "lib", 16384, 0.020, 0.060)]


# ----------------------------------------------------------------- regression guard
def test_check_flags_a_2x_slowdown():
    base = _doc(BASE_ROWS)
    cur = copy.deepcopy(base)
    cur["results"][2]["fwdbwd_s"] = 0.060 * 2.5           # galerkin fwd+bwd 2.5x slower
    comps = check.compare(cur, base, factor=2.0)
    bad = [c for c in comps if c["regression"]]
    assert [(c["case"], c["mode"]) for c in bad] == [("galerkin", "fwdbwd")]
    assert bad[0]["slowdown"] == pytest.approx(2.5)


def test_check_passes_unchanged_and_small_noise():
    base = _doc(BASE_ROWS)
    cur = copy.deepcopy(base)
    for r in cur["results"]:
        r["fwd_s"] *= 1.5                                   # noisy but < 2x
    comps = check.compare(cur, base, factor=2.0)
    assert comps and not any(c["regression"] for c in comps)
    assert not any(c["regression"] for c in check.compare(base, base))


def test_check_ignores_uniform_machine_slowdown_when_reference_slows_too():
    base = _doc(BASE_ROWS)
    cur = copy.deepcopy(base)
    for r in cur["results"]:
        if r["case"] == "continuum":                        # lib and ref both 3x slower: load
            r["fwd_s"] *= 3
            r["fwdbwd_s"] *= 3
    comps = [c for c in check.compare(cur, base) if c["case"] == "continuum"]
    assert comps and all(c["slowdown"] == pytest.approx(3) for c in comps)
    assert not any(c["regression"] for c in comps)
    cur["results"][0]["fwd_s"] *= 3                         # now the library alone: 9x vs 3x
    comps = [c for c in check.compare(cur, base) if c["case"] == "continuum"]
    assert [c["mode"] for c in comps if c["regression"]] == ["fwd"]


def test_check_floor_ignores_sub_millisecond_jitter():
    base = _doc([_row("window", "lib", 1024, 0.0002, 0.0004)])
    cur = _doc([_row("window", "lib", 1024, 0.0006, 0.0004)])   # 3x, but +0.4 ms
    assert not any(c["regression"] for c in check.compare(cur, base))


def test_find_baseline_matches_cores_and_device_kind(tmp_path):
    reporting.write_json(tmp_path / "a.json", _doc(BASE_ROWS, quick=True, finished="2025-02"))
    reporting.write_json(tmp_path / "b.json", _doc(BASE_ROWS, quick=False, finished="2025-01"))
    other = dict(MACHINE, cores=16)
    reporting.write_json(tmp_path / "c.json", _doc(BASE_ROWS, finished="2025-03", machine=other))
    gpu = dict(MACHINE, device_kind="cuda")
    reporting.write_json(tmp_path / "d.json", _doc(BASE_ROWS, finished="2025-03", machine=gpu))
    (tmp_path / "junk.json").write_text("{not json")
    path, doc = check.find_baseline(tmp_path, MACHINE)
    assert path.name == "b.json"                            # full run preferred over quick
    path, _ = check.find_baseline(tmp_path, MACHINE, exclude=tmp_path / "b.json")
    assert path.name == "a.json"
    assert check.find_baseline(tmp_path, dict(MACHINE, cores=4)) is None
    assert check.find_baseline(tmp_path, dict(MACHINE, cores=16))[0].name == "c.json"


# --------------------------------------------------------------- JSON and tables
def test_json_round_trip_and_schema(tmp_path):
    doc = _doc(BASE_ROWS)
    doc["results"][0]["notes"] = ["fwd: over_time"]
    doc["targets"] = check.evaluate_targets(doc)
    p = reporting.write_json(tmp_path / "sub" / "r.json", doc)
    back = reporting.read_json(p)
    assert back == json.loads(json.dumps(doc))
    (tmp_path / "x.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError):
        reporting.read_json(tmp_path / "x.json")


def test_tables_render_ratios():
    doc = _doc(BASE_ROWS + [_row("knn", "scipy", 10_000, 0.01, None, suite="search")])
    doc["results"][-1]["meta"] = {"default": True}
    doc["gpu"] = {"available": False, "note": "no GPU"}
    doc["targets"] = check.evaluate_targets(doc)
    text = reporting.full_report(doc)
    assert "10.0x" in text                                  # ref / lib at N = 4096
    assert "scipy (default)" in text and "no GPU" in text
    assert reporting.fmt_time(0.0123) == "12.3ms" and reporting.fmt_mem(3 << 30) == "3.00GB"


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows = BASE_ROWS + [_row("continuum", "lib", 8192, 0.03, 0.1, mem=1e6)]
    assert reporting.plot(_doc(rows), tmp_path / "p.png").stat().st_size > 1000


# ------------------------------------------------------------------------ targets
def _continuum(n, tl, tr, ml, mr):
    return [dict(_row("continuum", "lib", n, tl / 2, tl), fwdbwd_mem=ml),
            dict(_row("continuum", "ref", n, tr / 2, tr), fwdbwd_mem=mr)]


def _target(doc, id_):
    return next(t for t in check.evaluate_targets(doc) if t["id"] == id_)


def test_targets_pass_miss_and_na():
    doc = _doc(_continuum(8192, 0.5, 4.4, 0.1e9, 3.3e9))
    assert _target(doc, "T1")["status"] == "PASS"
    doc = _doc(_continuum(8192, 1.0, 4.4, 0.1e9, 3.3e9))   # only 4.4x faster
    t1 = _target(doc, "T1")
    assert t1["status"] == "MISS" and "4.4x < 5x" in t1["why"]
    assert _target(_doc([]), "T1")["status"] == "N/A"
    t8 = _target(dict(_doc([]), gpu={"available": False, "note": "no GPU: cpu"}), "T8")
    assert t8["status"] == "N/A" and "no GPU" in t8["measured"]


def test_galerkin_linearity_target():
    ns = [16384, 65536, 262144, 1048576]
    rows = [_row("galerkin", "lib", n, n * 1e-7, n * 3e-7) for n in ns]
    assert _target(_doc(rows), "T3")["status"] == "PASS"
    rows[-1]["fwdbwd_s"] *= 1.3                             # 5.2x for the last step
    assert _target(_doc(rows), "T3")["status"] == "MISS"
    # the keep_freed_memory() series is judged on its own rows
    assert _target(_doc(rows), "T3k")["status"] == "N/A"
    keep = [_row("galerkin_keepmem", "lib", n, n * 1e-7, n * 3e-7) for n in ns]
    doc = _doc(rows + keep)
    assert _target(doc, "T3")["status"] == "MISS" and _target(doc, "T3k")["status"] == "PASS"


def test_patched_flatness_target():
    GB = 1 << 30
    rows = [dict(_row("patched_transformer", "lib", n, n * 1e-5, None, suite="models"),
                 fwd_mem=n * 1e3) for n in (100_000, 500_000, 1_000_000)]
    assert _target(_doc(rows), "T6")["status"] == "PASS"
    rows[-1]["fwd_s"] *= 2
    assert _target(_doc(rows), "T6")["status"] == "MISS"
    rows[-1]["fwd_s"] /= 2
    rows[-1]["fwd_mem"] = 30 * GB
    assert _target(_doc(rows), "T6")["status"] == "MISS"


# ------------------------------------------------------------------------ harness
def test_predict_time():
    assert harness.predict_time([], 10) is None
    assert harness.predict_time([(10, 1.0)], 40) == pytest.approx(4.0)      # linear from one
    hist = [(10, 1.0), (20, 4.0)]                                            # quadratic
    assert harness.predict_time(hist, 40) == pytest.approx(16.0)
    assert harness.predict_time([(10, 1.0), (20, 1.0)], 40) == pytest.approx(2.0)  # p >= 1


def test_time_interleaved_and_budget():
    calls = []
    res = harness.time_interleaved({"a": lambda: calls.append("a"),
                                    "b": lambda: calls.append("b")},
                                   "cpu", reps=3, rep_budget_s=10.0, max_run_s=10.0)
    assert res["a"]["status"] == res["b"]["status"] == "ok"
    assert res["a"]["reps"] == res["b"]["reps"] == 3
    assert calls[2:] == ["a", "b"] * 3                       # warm-ups, then round-robin

    def boom():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    res = harness.time_interleaved({"x": boom}, "cpu", reps=3, rep_budget_s=1, max_run_s=1)
    assert res["x"]["status"] == "oom"


def test_isolated_child_reports_memory_and_errors():
    iso = harness.Isolated(preload=[])
    res = iso.run("benchmarks.harness:selftest_alloc", {"mb": 64}, timeout=120)
    assert res["status"] == "ok" and res["peak_bytes"] >= 48 * (1 << 20)
    assert "load1" in res and "wall_s" in res
    res = iso.run("benchmarks.harness:selftest_alloc", {"mb": 512}, timeout=120,
                  mem_limit=128 << 20)
    assert res["status"] == "oom"



def test_update_merge_replaces_only_remeasured_cases():
    from benchmarks.__main__ import merge

    old = dict(_doc(BASE_ROWS), machine_class="cpu-2core", started="t0")
    new = dict(_doc([_row("continuum", "lib", 4096, 0.005, 0.02)]), machine_class="cpu-2core",
               started="t1", config={"quick": False, "argv": ["--cases", "continuum"]})
    merged = merge(old, new)
    keys = sorted((r["case"], r["impl"]) for r in merged["results"])
    assert keys == [("continuum", "lib"), ("galerkin", "lib")]   # old continuum rows replaced
    assert merged["updates"][0]["cases"] == ["layers/continuum"]
    with pytest.raises(SystemExit):
        merge(old, dict(new, machine_class="cuda-16core"))


class _FakeIsolated:
    """Stands in for ``harness.Isolated``: time = ``n`` ms for every key, memory 1 byte."""

    def __init__(self):
        self.timed = []

    def run(self, target, spec, timeout, mem_limit=None):
        if spec["kind"] == "mem":
            return {"status": "ok", "peak_bytes": 1, "method": "fake"}
        self.timed.append(spec["n"])
        return {"status": "ok", "meta": {}, "results": {
            "/".join(k): {"status": "ok", "median_s": spec["n"] * 1e-3, "min_s": 0, "reps": 1}
            for k in spec["keys"]}}


@pytest.mark.parametrize("must,measured", [((), [100, 200]), ((800,), [100, 200, 800])])
def test_series_skips_predicted_sizes_but_keeps_sizes_a_target_needs(must, measured):
    # 400 is predicted at 0.4 s > the 0.3 s budget: skipped.  The series then ends,
    # unless a target needs 800, which is measured anyway.
    case = harness.Case("layers", "fake", "x:y", [100, 200, 400, 800], [], impls=("lib",),
                        modes=("fwd",), max_run_s=0.3, must=must)
    budget = harness.Budget(max_run_s=0.3, mem_budget=1 << 30, reps=1, rep_budget_s=1.0)
    iso = _FakeIsolated()
    rows = harness.run_series(iso, case, budget, "cpu", False, lambda msg: None)
    assert iso.timed == measured
    by_n = {r["n"]: r for r in rows}
    assert by_n[400]["fwd_status"] == "skipped" and "predicted" in by_n[400]["notes"][0]
    assert [n for n, r in sorted(by_n.items()) if r.get("fwd_s") is not None] == measured


def test_shared_machine_s_busy_process_ends_with_its_block():
    """benchmarks.shared_machine's spinning process is killed when its block ends, also
    on an error, long before its own deadline (60 s here)."""
    import os
    import time

    from benchmarks.shared_machine import one_busy_core

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="the timing failed"):
        with one_busy_core(60) as pid:
            os.kill(pid, 0)  # alive
            raise RuntimeError("the timing failed")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone (and reaped)
    assert time.monotonic() - t0 < 30
