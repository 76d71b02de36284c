"""Rollout error against horizon on two transient data sets, beside persistence and the
nearest training trajectory.

``--dataset heat`` (default) writes ``unsteady_heat.npz`` (``shared/data``, see its
README) as time-series folders with :mod:`data_adapters.unsteady_heat` (80 training /
20 test trajectories on one mesh: a permutation with seed 0); ``--dataset hole`` writes
the transient stand-in :mod:`data_adapters.standins.transient_hole` (48 training / 12
test trajectories, one mesh each). Then ``meshops train --series`` with its defaults
(the options after ``--`` are passed on: on one mesh it chooses between a trajectory
basis and the next-step model on the validation series, see
:mod:`meshops.fitting.series_choice`) and ``meshops evaluate`` on the test trajectories:
the relative L2 error of every step of the rollouts from step 0, mean, median and
worst over the test series, beside the two baselines::

    python -m benchmarks.time_series --out benchmarks/results/time-series-heat.txt \\
        [--dataset heat|hole] [--npz unsteady_heat.npz] [-- --epochs 30 --rollout-train 4]

The log (commands, the load average, the training process's wall and CPU time, the
validation figures that made the choice, the evaluation and a summary against the
baselines) goes to ``--out``; the evaluation's JSON and plot beside it (``<out>.json``,
``<out>.png``).

``--ablation STEPS`` instead fits the one-step rate of the first 4 training series with
each conditioning of :class:`~meshops.models.NextStep` (time features, output modes) for
``STEPS`` Adam steps and prints the mean square error of the normalised rate over the
last 50 steps (the rate's variance is about 1).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.paths import portable


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--npz", type=Path, default=None,
                   help="the archive (default: data_adapters.fem_npz.data_dir())")
    p.add_argument("--work", type=Path, default=Path("heat-series"),
                   help="folder for the series and the run (kept; the series are reused)")
    p.add_argument("--out", type=Path, required=True, help="log file")
    p.add_argument("--ablation", type=int, metavar="STEPS", default=0,
                   help="fit the rate with each conditioning for STEPS steps instead")
    p.add_argument("--dataset", choices=["heat", "hole"], default="heat",
                   help="heat: unsteady_heat.npz (one mesh); hole: the transient stand-in "
                        "(one mesh per trajectory)")
    args = p.parse_args(argv)
    if args.ablation:
        return ablation(args)
    log: list[str] = []
    roots = {"$WORK": args.work}  # the stored log names the series and the run by it

    def say(text: str) -> None:
        print(text, flush=True)
        log.append(portable(text, roots))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(log) + "\n")

    say("# command: " + " ".join([os.path.basename(sys.executable), "-m",
                                  "benchmarks.time_series", *sys.argv[1:]]))
    data, params = _export(args, say)
    run = args.work / "run"
    train = [sys.executable, "-m", "meshops", "train", "--series", "--data",
             str(data / "train"), "--inputs", "", "--targets", "u", "--params", params,
             "--out", str(run), *extra]
    evaluate = [sys.executable, "-m", "meshops", "evaluate", str(run), "--data",
                str(data / "test"), "--plot", str(args.out.with_suffix(".png"))]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for cmd, what in ((train, "training"), (evaluate, "evaluation")):
        say(f"# load average {', '.join(f'{v:.1f}' for v in os.getloadavg())} on "
            f"{os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}")
        say("$ meshops " + " ".join(f"'{a}'" if a == "" else a for a in cmd[3:]))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        for line in proc.stdout:
            if "Warning" not in line and "warnings.warn" not in line:
                say(line.rstrip())
        proc.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        say(f"# {what}: exit {proc.returncode}, {(time.perf_counter() - t0) / 60:.1f} min wall, "
            f"{cpu / 60:.1f} min CPU; load average "
            f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")
        if proc.returncode:
            return proc.returncode
    js = subprocess.run(evaluate[:-2] + ["--json"], capture_output=True, text=True, env=env)
    if js.returncode == 0:
        doc = json.loads(js.stdout)
        args.out.with_suffix(".json").write_text(json.dumps(portable(doc, roots)) + "\n")
        for line in summary(doc, run):
            say(line)
    return 0


def _export(args, say) -> tuple[Path, str]:
    """The data set's series folders under ``--work`` (written once) and its parameters."""
    data = args.work / "series"
    if args.dataset == "heat":
        from data_adapters.unsteady_heat import export_heat_series as export
        params = "mu0,mu1"
    else:
        from data_adapters.standins.transient_hole import PARAMS
        from data_adapters.standins.transient_hole import write_transient_hole_series as export
        params = ",".join(PARAMS)
    if not (data / "train" / "params.csv").is_file():
        t0 = time.perf_counter()
        w = export(data, overwrite=True) if args.dataset == "hole" else \
            export(data, args.npz, overwrite=True)
        say(f"# wrote {len(w['train'])} training / {len(w['test'])} test series to {data} in "
            f"{time.perf_counter() - t0:.0f} s")
    return data, params


def summary(report: dict, run: Path) -> list[str]:
    """The choice's validation figures and the test figures against the baselines."""
    out = []
    choice = run / "choice.json"
    if choice.is_file():
        rec = json.loads(choice.read_text())
        out.append(f"# chosen on validation ({len(rec['val_series'])} series): {rec['chosen']}; "
                   + ", ".join(f"{k} {v['val_mean']:.4e}" for k, v in rec["candidates"].items()))
    preds = report["predictors"]
    model = preds["model"]["all_steps_mean"]
    for name in ("persistence", "nearest training trajectory"):
        if "all_steps_mean" not in preds.get(name, {}):
            continue
        b = report["below"][name]
        other = preds[name]["all_steps_mean"]
        out.append(f"# test, all steps: model {model:.4e}, {name} {other:.4e} "
                   f"({other / model:.2f}x the model's); model below it at "
                   f"{b['steps_below']}/{b['steps']} steps")
    return out


def ablation(args) -> int:
    """The rate-fit comparison of ``--ablation`` (see the module docstring)."""
    import torch

    from data_adapters.unsteady_heat import export_heat_series
    from meshops.datasets.series import read_series_folder
    from meshops.models.next_step import NextStep
    from meshops.training.dataset import make_loader, prepare_batch
    from meshops.training.rollout import rollout_windows, series_statistics
    from meshops.training.seed import seed_everything
    from meshops.training.trainer import with_mesh_structures

    data = args.work / "series"
    if not (data / "train" / "params.csv").is_file():
        export_heat_series(data, args.npz, overwrite=True)
    names = sorted(p.name for p in (data / "train").iterdir() if p.is_dir())[:4]
    series = read_series_folder(data / "train", ["u"], ["mu0", "mu1"], names)
    pit = {"width": 64, "heads": 2, "blocks": 2, "num_latent": 128}
    lines = [f"# command: python -m benchmarks.time_series --ablation {args.ablation} "
             f"--out {args.out}",
             f"# load average {', '.join(f'{v:.1f}' for v in os.getloadavg())} on "
             f"{os.cpu_count()} cores; {len(series)} series, "
             f"{sum(len(s) - 1 for s in series)} one-step windows, batch 16, AdamW 1e-3, "
             f"PiT {pit}",
             "time features | output modes | trunk | rate mse (last 50 steps)"]
    print("\n".join(lines), flush=True)
    for frequencies, modes, trunk in ((0, 0, False), (0, 16, False), (8, 0, False),
                                      (8, 16, False), (8, 16, True)):
        seed_everything(0)
        model = NextStep("pit", 1, 2, 0, 2, True, pit, modes=modes,
                         time_frequencies=frequencies, trunk=trunk)
        model.set_statistics(series_statistics(series, ["u"], [], True))
        windows = with_mesh_structures(
            model, rollout_windows(series, ["u"], [], 1, True, torch.float32), "", False)
        loader = make_loader(windows, 16, shuffle=True,
                             generator=torch.Generator().manual_seed(0))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
        losses: list[float] = []
        while len(losses) < args.ablation:
            for b in loader:
                b = prepare_batch(b)
                cond = b.cond[:, 0]
                rate = (b.y - b.x) / cond[:, 1][b.batch][:, None]
                target = model.rate_normalizer.encode(rate)
                loss = ((model.normalized_rate(b, b.x, None, cond, b.batch) - target) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                if len(losses) == args.ablation:
                    break
        line = (f"{frequencies or 'none':>13} | {modes or 'none':>12} | "
                f"{'yes' if trunk else 'no':>5} | {sum(losses[-50:]) / 50:.3f}")
        print(line, flush=True)
        lines.append(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
