"""``python -m benchmarks``: speed/memory benchmarks of meshops, targets and regression guard.

Examples::

    python -m benchmarks --quick                      # a few minutes on 2 cores
    python -m benchmarks                              # full run -> benchmarks/results/
                                                      #   cpu-2core.json and .png
    python -m benchmarks --quick --check              # exit 1 if a layer became > 2x slower
    python -m benchmarks --only layers --cases continuum,galerkin
    python -m benchmarks --device cuda                # + fused-SDPA / TFLOP/s checks on a GPU
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from pathlib import Path

SUITES = ("layers", "search", "models", "training", "gpu")
RESULTS = Path(__file__).resolve().parent / "results"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats (minutes)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default cpu)")
    p.add_argument("--out", help="JSON file (default benchmarks/results/<class>[-quick].json; "
                                 "the plot goes next to it as .png)")
    p.add_argument("--only", help=f"comma-separated suites out of {','.join(SUITES)}")
    p.add_argument("--cases", help="comma-separated case names (e.g. continuum,knn,pit)")
    p.add_argument("--check", action="store_true",
                   help="compare with the stored run of this machine class; exit 1 if a layer "
                        "is more than --factor times slower")
    p.add_argument("--baseline", help="JSON file to compare with (default: found in "
                                      "benchmarks/results by cores + device kind)")
    p.add_argument("--factor", type=float, default=2.0, help="regression factor (default 2)")
    p.add_argument("--max-load", type=float, default=None,
                   help="wait until the 1-minute load average is below this before starting")
    p.add_argument("--max-wait", type=float, default=600.0,
                   help="longest wait for --max-load, seconds (default 600)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds one run may take before a series stops (default 5 quick / 60)")
    p.add_argument("--mem-budget", type=float, default=None,
                   help="GB one run may use before a series stops (default 4 quick / 8)")
    p.add_argument("--max-foreign", type=float, default=None,
                   help="re-measure a point (up to --retries times, after waiting up to "
                        "--retry-wait s for a quiet machine) when other processes kept more "
                        "than this many cores busy during it (default: off)")
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--retry-wait", type=float, default=600.0)
    p.add_argument("--reps", type=int, default=None, help="timed runs per point (default 3/7)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads in the measuring processes (default: torch's, "
                        "= cores)")
    p.add_argument("--gpu-peak-tflops", type=float, default=None,
                   help="the card's bf16 dense peak, when not in benchmarks.gpu.PEAK_TFLOPS")
    p.add_argument("--update", action="store_true",
                   help="merge into an existing --out file: the (suite, case) pairs measured now "
                        "replace the stored ones, the others are kept (each row keeps its own "
                        "load figures)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from benchmarks import SCHEMA, check, gpu, harness, layers, models, reporting, search

    suites = SUITES if not args.only else tuple(s.strip() for s in args.only.split(",") if s)
    bad = [s for s in suites if s not in SUITES]
    if bad:
        _log(f"unknown suite(s) {bad}; choose from {SUITES}")
        return 2
    only_cases = None if not args.cases else {c.strip() for c in args.cases.split(",") if c}

    device = args.device
    requested = device
    if device.startswith("cuda") and not torch.cuda.is_available():
        _log("no GPU: --device cuda given but torch.cuda.is_available() is False; "
             "measuring on cpu, the GPU section says 'no GPU'")
        device = "cpu"

    waited = None
    if args.max_load is not None:
        waited = harness.wait_for_load(args.max_load, args.max_wait, _log)
        _log(f"load before starting: {waited}")
    machine = harness.machine_info(device)
    cls = harness.machine_class(machine)
    out = Path(args.out) if args.out else RESULTS / f"{cls}{'-quick' if args.quick else ''}.json"

    # The baseline is read before anything is written (the output may replace it).
    baseline = None
    if args.check:
        if args.baseline:
            baseline = (Path(args.baseline), reporting.read_json(args.baseline))
        else:
            baseline = check.find_baseline(RESULTS, machine)

    budget = harness.Budget(
        max_run_s=args.time_budget or (5.0 if args.quick else 60.0),
        mem_budget=int((args.mem_budget or (4.0 if args.quick else 8.0)) * harness.GB),
        reps=args.reps or (3 if args.quick else 7),
        rep_budget_s=2.0 if args.quick else 15.0,
        max_foreign=args.max_foreign, retries=args.retries, retry_wait_s=args.retry_wait)

    doc = {"schema": SCHEMA, "machine": machine, "machine_class": cls,
           "config": {"quick": args.quick, "device": device, "requested_device": requested,
                      "suites": list(suites), "cases": sorted(only_cases) if only_cases else None,
                      "argv": sys.argv[1:], "budget": vars(budget),
                      "threads": args.threads or machine["torch_threads"]},
           "started": _dt.datetime.now().isoformat(timespec="seconds"),
           "load": {"start": harness.loadavg(), "wait": waited}, "results": []}
    _log(f"meshops benchmarks ({'quick' if args.quick else 'full'}) on {machine['cpu']}, "
         f"{machine['cores']} cores, GPU {machine['gpu']}, torch {machine['torch']}; "
         f"load {doc['load']['start']}; output {out}")
    t_start = time.perf_counter()
    iso = harness.Isolated(threads=args.threads, start_method="spawn"
                           if harness.device_kind(requested) == "cuda" else "forkserver")

    def want(case_name: str) -> bool:
        return only_cases is None or case_name in only_cases

    all_cases = []
    if "layers" in suites:
        all_cases += [c for c in layers.cases() if want(c.name)]
    if "search" in suites:
        all_cases += [c for c in search.cases(device) if want(c.name)]
    if "models" in suites:
        names = models.available_models()
        doc["config"]["models"] = names
        if "pit" not in names:
            doc["config"]["missing"] = ["pit (meshops.models has no 'pit' model)"]
        all_cases += [c for c in models.cases(names) if want(c.name)]
    for case in all_cases:
        if not case.impls:
            _log(f"[{case.suite}/{case.name}] no implementation available; skipped")
            continue
        _log(f"[{case.suite}/{case.name}] {case.desc}"
             + (f"  | ref: {case.ref_desc}" if "ref" in case.impls else ""))
        doc["results"] += harness.run_series(iso, case, budget, device, args.quick, _log)
    if "training" in suites:
        names = [m for m in models.available_models() if want(m)]
        _log("[training] Trainer throughput")
        doc["results"] += models.run_training(iso, device, args.quick,
                                              step_budget_s=20.0 if args.quick else 300.0,
                                              mem_budget=max(budget.mem_budget, 8 * harness.GB),
                                              log=_log, models=names,
                                              max_foreign=args.max_foreign,
                                              retries=args.retries,
                                              retry_wait_s=args.retry_wait)
    if "gpu" in suites:
        _log("[gpu]")
        doc["gpu"] = gpu.run_gpu(iso, requested if requested.startswith("cuda") else device,
                                 args.quick, _log, args.gpu_peak_tflops)
    doc["load"]["end"] = harness.loadavg()
    doc["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
    elapsed, waited_s = round(time.perf_counter() - t_start, 1), round(harness.WAITED[0], 1)
    doc["elapsed_s"] = elapsed
    doc["waited_s"] = waited_s   # part of elapsed_s spent waiting for a quiet machine
    new_load = doc["load"]
    if args.update and out.exists():
        doc = merge(reporting.read_json(out), doc)
    doc["targets"] = check.evaluate_targets(doc)

    print(reporting.full_report(doc))
    status = 0
    if args.check:
        if baseline is None:
            print(f"\n[check]  no stored run for machine class {cls} in {RESULTS}; nothing "
                  f"to compare (store one with a full run first)")
        else:
            comps = check.compare(doc, baseline[1], factor=args.factor)
            doc["check"] = {"baseline": str(baseline[0]), "factor": args.factor,
                            "comparisons": comps}
            print("\n" + check.regression_report(comps, baseline[0], args.factor))
            if not comps:
                print("[check]  no common (case, N) with the stored run")
            if any(c["regression"] for c in comps):
                status = 1
    reporting.write_json(out, doc)
    msg = f"\nwrote {out}"
    if not args.no_plot:
        png = reporting.plot(doc, out.with_suffix(".png"))
        if png:
            msg += f" and {png}"
    print(msg + f"  ({elapsed:.0f} s, of which {waited_s:.0f} s waiting for a quiet machine; "
                f"load {new_load['start']} -> {new_load['end']})")
    return status


def merge(old: dict, new: dict) -> dict:
    """``old`` with the rows of every (suite, case) measured in ``new`` replaced, and the
    GPU section replaced when ``new`` has one; ``updates`` records each merge."""
    if old["machine_class"] != new["machine_class"]:
        raise SystemExit(f"--update: {old['machine_class']} results cannot take "
                         f"{new['machine_class']} measurements")
    measured = {(r["suite"], r["case"]) for r in new["results"]}
    merged = dict(old)
    merged["results"] = [r for r in old["results"] if (r["suite"], r["case"]) not in measured]
    merged["results"] += new["results"]
    if "gpu" in new:
        merged["gpu"] = new["gpu"]
    merged["updates"] = old.get("updates", []) + [{
        "argv": new["config"]["argv"], "started": new["started"], "finished": new["finished"],
        "load": new["load"], "elapsed_s": new.get("elapsed_s"), "waited_s": new.get("waited_s"),
        "cases": sorted(f"{s}/{c}" for s, c in measured)}]
    merged["load"] = dict(old["load"], last_update=new["load"])
    merged["finished"] = new["finished"]
    return merged


if __name__ == "__main__":
    sys.exit(main())
