"""CLI of the side-by-side benchmark (see :mod:`benchmarks.reference`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.paths import portable
from benchmarks.reference import CASES, PAPER_TRAIN, meshops_kwargs, patch_script, step_body
from benchmarks.reference.files import (
    elasticity_arrays_from_standin,
    naca_arrays_from_standin,
    write_elasticity_files,
    write_naca_files,
)
from benchmarks.reference.profiling import format_summary

TARGET = 1.5
# The airfoil stand-in in the benchmark's 221 x 51 layout, at angle 0 (geometry only).
AIRFOIL = dict(n_side=71, n_wake=40, n1=51, aoa_range=(0.0, 0.0), mach_inf=0.5)
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
#: How the reference runs: their torch.compile as it is, the same with torch._dynamo's
#: automatic dynamic shapes off, or eagerly (their compile line dropped).
MODES = {"compiled": ("ref-compiled", True, False),
         "compiled-static": ("ref-static", True, True),
         "eager": ("ref-eager", False, False)}


#: The entries of a case's summary that are not sides.
SUMMARY_KEYS = ("failed", "ratio", "paper_epoch_s", "cuda")


class SideFailed(RuntimeError):
    """One side's process failed; the others still run (the message says why)."""


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_data(case: str, root: Path, n: int, seed: int) -> Path:
    """Generate the stand-in (cached) and write it in the case's Geo-FNO layout."""
    from data_adapters import make_airfoil_standin, make_elasticity_standin
    if case == "airfoil":
        kw = {k: v for k, v in AIRFOIL.items()}
        samples = make_airfoil_standin(n, seed=seed, inputs=(), progress=False, **kw)
        a = naca_arrays_from_standin(samples, n_wake=kw["n_wake"], mach_inf=kw["mach_inf"])
        return write_naca_files(root, a["X"], a["Y"], a["Q"], a["shape_coords"])
    # a few spare samples: the FEM meshes with fewer than 972 nodes are skipped
    samples = make_elasticity_standin(int(n * 1.25) + 10, seed=seed, progress=False)
    samples = [s for s in samples if s.num_nodes >= 972][:n]
    if len(samples) < n:
        raise SystemExit(f"error: only {len(samples)} elasticity stand-in samples have "
                         f">= 972 nodes, need {n}")
    a = elasticity_arrays_from_standin(samples, seed=seed)
    return write_elasticity_files(root, a["xy"], a["sigma"], a["rr"])


def _precision(ref_dir: Path) -> str:
    """The float32 matmul precision the reference sets (in pit.py), for both sides."""
    m = re.search(r"set_float32_matmul_precision\(['\"](\w+)['\"]\)",
                  (ref_dir / "pit.py").read_text())
    return m.group(1) if m else "highest"


def prepare_reference(case: str, ref_dir: Path, scratch: Path, data: Path, args,
                      mode: str = "compiled") -> list[str]:
    """Write the patched script (for ``mode``), the step, the driver and its profiling
    helper into ``scratch``; the command."""
    c = CASES[case]
    text = (ref_dir / c.script).read_text()
    scratch.mkdir(parents=True, exist_ok=True)
    script = scratch / f"patched_{mode}_{c.script}"
    script.write_text(patch_script(c, text, str(data), args.num_train, args.num_test,
                                   compile=MODES[mode][1], batch_size=args.batch_size))
    (scratch / "step.py").write_text(step_body(c, text))
    driver = scratch / "ref_driver.py"
    driver.write_text((HERE / "ref_driver.py").read_text())
    (scratch / "profiling.py").write_text((HERE / "profiling.py").read_text())
    return [args.reference_python, str(driver), str(ref_dir), str(script),
            str(scratch / "step.py"), str(args.threads), str(args.warmup), str(args.steps),
            args.device]


def _run(cmd: list[str], out: Path, cwd: Path, env: dict, timeout: float) -> dict:
    load = _load()
    try:
        proc = subprocess.run(cmd + [str(out)], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SideFailed(f"{' '.join(cmd[:2])} ran past --timeout {timeout:g} s") from None
    if proc.returncode:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise SideFailed(f"{' '.join(cmd[:2])} failed (exit {proc.returncode}):\n{tail}")
    r = json.loads(out.read_text())
    r["load_before"], r["load_after"] = load, _load()
    return r


def _reference_commit(ref_dir: Path) -> str:
    """The reference checkout's commit; not that of a repository it merely sits in (an
    exported snapshot inside another checkout would otherwise report that one's HEAD)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(ref_dir), *a], capture_output=True,
                              text=True).stdout.strip()
    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != ref_dir.resolve():
        return "unknown: not the root of a git checkout"
    return git("rev-parse", "HEAD") or "unknown"


def _device_name(device: str) -> str:
    if device == "cpu":
        return f"{os.cpu_count()} CPUs"
    import torch
    return f"{torch.cuda.get_device_name(torch.device(device))}, {os.cpu_count()} CPUs"


def _env(threads: int, pythonpath: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if pythonpath is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = pythonpath
    return env


def sides(args) -> list[str]:
    """The processes of one round: each reference mode asked for, then meshops."""
    return [MODES[m][0] for m in args.reference_modes] + ["meshops"]


def run_case(case: str, args, work: Path, precision: str, log) -> dict:
    c = CASES[case]
    data = work / "data" / case
    t = time.perf_counter()
    write_data(case, data, args.num_train + args.num_test, args.seed)
    log(f"[{case}] wrote {args.num_train + args.num_test} stand-in samples to {data} "
        f"({time.perf_counter() - t:.0f} s)")
    scratch = work / f"reference_{case}"
    batch = args.batch_size or c.expected["batch_size"]
    cmds, envs = {}, {}
    for mode in args.reference_modes:
        side, _, static = MODES[mode]
        cmds[side] = prepare_reference(case, args.reference_dir, scratch, data, args, mode)
        envs[side] = _env(args.threads, None)  # their code only: nothing of meshops on the path
        if static:
            envs[side]["MESHOPS_REF_STATIC_SHAPES"] = "1"
    cmds["meshops"] = [sys.executable, "-m", "benchmarks.reference.meshops_child", case,
                       str(data), str(args.threads), str(args.warmup), str(args.steps),
                       str(batch), str(args.num_train), str(args.num_test), precision,
                       args.device]
    envs["meshops"] = _env(args.threads, os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    # meshops' C++ kernels are built into the torch extensions folder: a private one,
    # so that a build of another checkout's kernels (or its stale lock) is never used
    envs["meshops"]["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")
    order = sides(args)
    runs = {side: [] for side in order}
    failed: dict[str, str] = {}
    for r in range(args.rounds):
        k = r % len(order)
        for side in order[k:] + order[:k]:         # each side leads a round in turn
            if side in failed:
                continue
            env = dict(envs[side])
            if args.profile is not None and r == 0:
                env["MESHOPS_PROFILE_TRACE"] = str(args.profile / f"trace_{case}_{side}.json")
                env["MESHOPS_PROFILE_STEPS"] = str(args.profile_steps)
            cwd = REPO if side == "meshops" else scratch
            out = (work if side == "meshops" else scratch) / f"result_{side}_{r}.json"
            try:
                res = _run(cmds[side], out, cwd, env, args.timeout)
            except SideFailed as exc:
                failed[side] = str(exc)
                log(f"[{case}] round {r + 1}/{args.rounds} {side:<12} FAILED: {exc}")
                continue
            runs[side].append(res)
            dyn = res.get("dynamo_timed")
            log(f"[{case}] round {r + 1}/{args.rounds} {side:<12} steps "
                + " ".join(f"{x:.3f}" for x in res["step_s"])
                + f" s (warm-up {' '.join(f'{x:.1f}' for x in res['warmup_s'])} s"
                + (f"; frames compiled in warm-up {res['dynamo_warmup']['frames']}, in "
                   f"timed steps {dyn['frames']}; graph breaks "
                   f"{res['dynamo_warmup']['graph_breaks'] + dyn['graph_breaks']}"
                   if dyn else "")
                + (f"; peak {res['max_memory_gib']:.2f} GiB" if res.get("max_memory_gib")
                   else "")
                + f"; load {res['load_before']} -> {res['load_after']})")
            if res.get("profile"):
                for line in format_summary(f"[{case}] profile {side}", res["profile"]):
                    log(line)
    return {"runs": runs, "failed": failed, "batch": batch,
            "cuda": args.device.startswith("cuda")}


def summarize(case: str, result: dict) -> dict:
    """Per side the median step etc. (or its failure); ``ratio``: per reference mode,
    its median over meshops'; ``epoch_s``: s/step x the steps of a 1,000-sample epoch."""
    out: dict = {"failed": dict(result["failed"])}
    steps_per_epoch = math.ceil(PAPER_TRAIN / result["batch"])
    for side, rs in result["runs"].items():
        if not rs:
            out["failed"].setdefault(side, "no run")
            continue
        steps = [x for r in rs for x in r["step_s"]]
        med = statistics.median(steps)
        out[side] = {"median": med, "min": min(steps),
                     "rounds": [statistics.median(r["step_s"]) for r in rs],
                     "n": len(steps), "parameters": rs[0]["parameters"],
                     "threads": {r["threads"] for r in rs}, "dtype": {r["dtype"] for r in rs},
                     "precision": {r["matmul_precision"] for r in rs},
                     "compiled": rs[0]["compiled"], "batch": rs[0]["batch_size"],
                     "epoch_s": med * steps_per_epoch}
    out["ratio"] = {side: out[side]["median"] / out["meshops"]["median"]
                    for side in result["runs"] if side != "meshops" and side in out
                    and "meshops" in out}
    out["paper_epoch_s"] = CASES[case].paper_epoch_s
    out["cuda"] = result["cuda"]
    return out


def table(results: dict) -> list[str]:
    lines = [f"{'case':<11} {'code':<12} {'params':>9} {'batch':>5} {'compiled':>8} "
             f"{'s/step (median)':>15} {'min':>7} {'steps':>5} {'s/epoch(1k)':>11}  "
             "per-round medians", "-" * 108]
    for case, s in results.items():
        for side in [k for k in s if k not in SUMMARY_KEYS]:
            d = s[side]
            lines.append(f"{case:<11} {side:<12} {d['parameters']:>9,} {d['batch']:>5} "
                         f"{str(d['compiled']):>8} {d['median']:>15.3f} {d['min']:>7.3f} "
                         f"{d['n']:>5} {d['epoch_s']:>11.1f}  "
                         + " ".join(f"{x:.3f}" for x in d["rounds"]))
        for side, why in s["failed"].items():
            lines.append(f"{case:<11} {side:<12} failed: {why.splitlines()[0][:70]}")
        for side, ratio in s["ratio"].items():
            verdict = "PASS" if ratio >= TARGET else "MISS"
            lines.append(f"{case:<11} speed-up ({side} / meshops s/step): {ratio:.2f}x  "
                         f"[target >= {TARGET}x: {verdict}]")
        paper = s.get("paper_epoch_s")
        refs = [k for k in s if k.startswith("ref-")]
        if paper and not s.get("cuda"):
            lines.append(f"{case:<11} the PiT paper's {paper:g} s per 1,000-sample epoch is an "
                         "RTX 3090 figure: not compared on the CPU")
        for side in refs if paper and s.get("cuda") else ():
            f = s[side]["epoch_s"] / paper
            lines.append(f"{case:<11} {side} per 1,000-sample epoch {s[side]['epoch_s']:.1f} s "
                         f"vs the PiT paper's {paper:g} s on an RTX 3090: {f:.2f}x"
                         + ("  <- far slower than published: suspect the harness"
                            if f > 3 else ""))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reference",
                                description=sys.modules["benchmarks.reference"].__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference-dir", type=Path, required=True,
                   help="checkout of github:junfeng-chen/position_induced_transformer")
    p.add_argument("--reference-python", default=sys.executable,
                   help="interpreter for the reference code (default: this one)")
    p.add_argument("--cases", default="airfoil,elasticity",
                   help="comma-separated: airfoil, elasticity")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per process (default 5; --quick 2)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps per process first, incl. torch.compile (default 2; "
                        "--quick 1)")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating reference/meshops rounds (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true",
                   help="defaults of 1 round, 1 warm-up and 2 timed steps")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads on both sides (default: the CPUs available)")
    p.add_argument("--device", default="cpu",
                   help="cpu or cuda[:i], both sides (default cpu); on CUDA each step ends "
                        "with a synchronisation and includes the batch's host-to-device copy")
    p.add_argument("--num-train", type=int, default=200)
    p.add_argument("--num-test", type=int, default=40)
    p.add_argument("--seed", type=int, default=0, help="stand-in seed")
    p.add_argument("--reference-modes", default=None,
                   help="comma-separated reference modes, each its own process per round: "
                        "compiled (their script as is), compiled-static (automatic dynamic "
                        "shapes off), eager (their torch.compile line dropped); default "
                        "compiled")
    p.add_argument("--reference-static-shapes", action="store_true",
                   help="old spelling of --reference-modes compiled-static (their "
                        "torch.quantile failed with symbolic sizes on torch 2.11 CUDA)")
    p.add_argument("--no-compile", action="store_true",
                   help="old spelling of --reference-modes eager")
    p.add_argument("--batch-size", type=int, default=None,
                   help="batch size of both sides (default: the reference script's, 20 "
                        "airfoil / 10 elasticity)")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR",
                   help="after the timed steps of each process's first round, run "
                        "--profile-steps more under torch.profiler: a Chrome trace per side "
                        "in DIR and a summary in the log (syncs, copies, device busy, top "
                        "kernels and host operators, recompilations)")
    p.add_argument("--profile-steps", type=int, default=3,
                   help="profiled steps per process with --profile (default 3)")
    p.add_argument("--work", type=Path, default=None,
                   help="scratch folder (default: a new temporary folder)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per process")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the output, with the command line, to this file")
    args = p.parse_args(argv)
    for name, full, quick in (("rounds", 3, 1), ("warmup", 2, 1), ("steps", 5, 2)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; choose from {', '.join(CASES)}")
        if not (args.reference_dir / CASES[c].script).is_file():
            p.error(f"{args.reference_dir / CASES[c].script}: no such file (is "
                    "--reference-dir a checkout of junfeng-chen/position_induced_transformer?)")
    if min(args.steps, args.rounds) < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--steps, --rounds and --threads must be >= 1, --warmup >= 0")
    if args.batch_size is not None and args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    if args.profile_steps < 1:
        p.error("--profile-steps must be >= 1")
    if args.reference_modes is not None and (args.no_compile or args.reference_static_shapes):
        p.error("--reference-modes replaces --no-compile and --reference-static-shapes: "
                "give one or the other")
    if args.reference_modes is None:
        args.reference_modes = ("eager" if args.no_compile else "compiled-static"
                                if args.reference_static_shapes else "compiled")
    args.reference_modes = [m.strip() for m in args.reference_modes.split(",") if m.strip()]
    bad = [m for m in args.reference_modes if m not in MODES]
    if bad or not args.reference_modes or len(set(args.reference_modes)) < len(
            args.reference_modes):
        p.error(f"--reference-modes: a comma-separated list of distinct modes from "
                f"{', '.join(MODES)}; got {bad or args.reference_modes}")
    if args.device != "cpu":
        import torch
        if not args.device.startswith("cuda") or not torch.cuda.is_available():
            p.error(f"--device {args.device}: only cpu or cuda[:i] with a CUDA device visible")
    args.reference_dir = args.reference_dir.resolve()
    work = args.work or Path(tempfile.mkdtemp(prefix="meshops-reference-"))
    work = work.resolve()
    if args.profile is not None:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    precision = _precision(args.reference_dir)
    lines = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    commit = _reference_commit(args.reference_dir)
    log(f"reference: {args.reference_dir} (commit {commit}); scratch: {work}")
    log(f"device {args.device}; threads {args.threads} both sides, float32, matmul precision "
        f"{precision!r} (as the reference's pit.py sets); {args.rounds} round(s) x "
        f"({args.warmup} warm-up + {args.steps} timed steps) per process; reference modes "
        f"{', '.join(args.reference_modes)}; batch "
        f"{args.batch_size or 'as in the reference scripts'}"
        + (f"; profiling {args.profile_steps} steps into {args.profile}" if args.profile else "")
        + f"; load {_load()}")
    for c in cases:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in meshops_kwargs(CASES[c]).items())
        log(f"[{c}] meshops PiT({kwargs})")
    results = {c: summarize(c, run_case(c, args, work, precision, log)) for c in cases}
    for c, s in results.items():
        done = [k for k in s if k not in SUMMARY_KEYS]
        for key in ("threads", "dtype", "precision"):
            vals = set().union(*(s[k][key] for k in done)) if done else set()
            if len(vals) > 1:
                log(f"WARNING [{c}]: the sides differ in {key}: {sorted(map(str, vals))}")
    log("")
    for line in table(results):
        log(line)
    log(f"load at the end: {_load()}")
    failed = any(s["failed"] for s in results.values())
    if args.out is not None:
        from meshops.utils.atomic import atomic_write
        head = [f"# python -m benchmarks.reference {shlex.join(argv or sys.argv[1:])}",
                f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {_device_name(args.device)}, "
                f"uptime load {_load()}"]
        # the stored file names the checkout, the scratch and the profile folders by these
        roots = {"$REFERENCE": args.reference_dir, "$WORK": work, "$PROFILE": args.profile}
        text = portable("\n".join(head + lines) + "\n",
                        {k: v for k, v in roots.items() if v is not None})
        atomic_write(args.out, lambda tmp: Path(tmp).write_text(text))
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
