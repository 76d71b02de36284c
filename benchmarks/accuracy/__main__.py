"""``python -m benchmarks.accuracy``: meshops' defaults against the baselines and the
neural peers, side by side, on the same files, budget and metric.

Examples::

    python -m benchmarks.accuracy                                  # everything, 10 min per model
    python -m benchmarks.accuracy --minutes 0.5 --datasets heat --models meshops,mean,pod_rbf
    python -m benchmarks.accuracy --table benchmarks/results/accuracy-cpu-2core-10min.json

See docs/accuracy.md. A full run takes about (data sets x neural models x minutes):
six data sets x three trained models x 10 minutes = 3 hours of exclusive CPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.accuracy import datasets
from benchmarks.accuracy.report import budget_words, console_table, markdown_table, plot_histories
from benchmarks.accuracy.run import MODELS, PEERS, REPO, run_dataset
from benchmarks.paths import portable

SCHEMA = "meshops-accuracy-1"
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_PEERS_PYTHON = "/work/scratch/peers-venv/bin/python"


def _csv(choices):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {bad or text!r}; choose from "
                                             f"{','.join(choices)}")
        return items
    return parse


def _seed_list(text: str) -> list[int]:
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected at least two distinct seeds, got {text!r}")
    return seeds


def _model_epochs(p: argparse.ArgumentParser, pairs, epochs) -> dict:
    """``--model-epochs gino=13 ...`` as ``{"gino": 13}``, each a trained model's."""
    if not pairs:
        return {}
    if epochs is None:
        p.error("--model-epochs needs --epochs (a fixed amount of work for every model)")
    out = {}
    for pair in pairs:
        model, _, n = pair.partition("=")
        if model not in ("meshops", *PEERS) or not n.isdigit() or int(n) < 1:
            p.error(f"--model-epochs: expected MODEL=N with MODEL one of meshops, "
                    f"{', '.join(PEERS)} and N >= 1, got {pair!r}")
        out[model] = int(n)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", type=_csv(datasets.NAMES), default=list(datasets.NAMES),
                   help=f"comma-separated, from {','.join(datasets.NAMES)} (default all)")
    p.add_argument("--models", type=_csv(MODELS), default=list(MODELS),
                   help=f"comma-separated, from {','.join(MODELS)} (default all)")
    p.add_argument("--minutes", type=float, default=10.0,
                   help="training budget per trained model and data set (default 10)")
    p.add_argument("--epochs", type=int, default=None,
                   help="a fixed number of epochs per trained model instead of the --minutes "
                        "clock: the load of the machine then changes the time, not the result")
    p.add_argument("--model-epochs", nargs="+", default=None, metavar="MODEL=N",
                   help="with --epochs: a trained model's own number of epochs (e.g. gino=13 "
                        "for a peer whose step costs several of the others'); the tables "
                        "name it beside the model")
    p.add_argument("--threads", type=int, default=2, help="threads per model (default 2)")
    p.add_argument("--meshops-config", nargs="+", default=None, metavar="KEY=VALUE",
                   help="train a variant of meshops' default model: these go to meshops "
                        "train --model-config, the rest as the data choose it")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of every trained model (meshops' --seed, which also draws its "
                        "validation split, and the peers'); --merge of several seeds' results "
                        "averages them (default 0)")
    p.add_argument("--seeds", type=_seed_list, default=None, metavar="S,S,...",
                   help="run everything once per seed (each seed's result as OUT-seedS.json, "
                        "kept runs under KEEP/seedS) and write their combination, the mean "
                        "of the seeds with its spread, to --out; instead of --seed")
    p.add_argument("--grace", type=float, default=1.2,
                   help="a model is stopped at grace x budget + 3 minutes (default 1.2)")
    p.add_argument("--peers-python", default=None,
                   help="python of the peers' environment (default: "
                        f"{DEFAULT_PEERS_PYTHON} if it exists, else this one)")
    p.add_argument("--data-root", type=Path, default=None,
                   help="where the data folders are written once (default "
                        "$MESHOPS_CACHE/accuracy or ~/.cache/meshops/accuracy)")
    p.add_argument("--out", type=Path, default=None,
                   help="result JSON (default benchmarks/results/accuracy-cpu-<threads>core-"
                        "<minutes>min.json; the console log goes beside it as .log)")
    p.add_argument("--keep", type=Path, default=None,
                   help="keep the runs and predictions in this folder (default: a temporary "
                        "folder, removed)")
    p.add_argument("--reuse", action="store_true",
                   help="with --keep: a meshops run already trained in the kept folder is "
                        "predicted and scored again instead of trained again, a peer's "
                        "kept predictions are scored again, and a classical predictor's "
                        "kept result is taken back if the files it read are unchanged: "
                        "how a stopped suite resumes")
    p.add_argument("--table", type=Path, metavar="FILE.json",
                   help="print the Markdown table of a stored result and exit")
    p.add_argument("--plot", type=Path, metavar="FILE.json",
                   help="plot the validation error against training time of a stored "
                        "result's trained models into FILE.png and exit")
    p.add_argument("--zero-shot", type=Path, nargs="+", metavar="FILE.json",
                   help="print the table of in-distribution and zero-shot (re-meshed) errors "
                        "of stored results, a later file's data set replacing an earlier "
                        "one's, plot it into --out (PNG) and exit")
    p.add_argument("--merge", type=Path, nargs="+", metavar="FILE.json",
                   help="combine stored results (same budget and threads; a later file's "
                        "result for a data set and model replaces an earlier one's; the "
                        "results of several seeds are averaged, with their spread) into "
                        "--out and exit")
    args = p.parse_args(argv)
    if not args.minutes > 0:
        p.error(f"--minutes must be positive, got {args.minutes}")
    if args.reuse and args.keep is None:
        p.error("--reuse needs --keep FOLDER (where the runs were kept)")
    if args.epochs is not None and args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    args.model_epochs = _model_epochs(p, args.model_epochs, args.epochs)
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    if args.seeds is not None and args.seed is not None:
        p.error("give either --seed or --seeds, not both")
    args.seed = 0 if args.seed is None else args.seed
    # meshops first: the peers take their validation files from its run
    args.models = [m for m in MODELS if m in args.models]
    if args.peers_python is None:
        args.peers_python = DEFAULT_PEERS_PYTHON if Path(DEFAULT_PEERS_PYTHON).exists() \
            else sys.executable
    return args


#: What a fixed-epoch result says of itself (the load of the machine is in it too).
FIXED_WORK = ("a fixed amount of work (--epochs): the load of the machine changes the time a "
              "run takes, not its result; no time in this file is a figure")


def _data_root(arg) -> Path:
    if arg is not None:
        return arg
    env = os.environ.get("MESHOPS_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "meshops") / "accuracy"


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _load() -> float:
    return round(os.getloadavg()[0], 1)


def _merge(files: list[Path], out: Path | None) -> int:
    from benchmarks.accuracy.report import merge
    from benchmarks.accuracy.seeds import combine_seeds
    from benchmarks.reporting import write_json

    if out is None:
        print("error: --merge needs --out FILE.json", file=sys.stderr)
        return 2
    docs = _read_results(files)
    if docs is None:
        return 2
    try:
        several = len({d.get("seed", 0) for d in docs}) > 1
        merged = combine_seeds(docs) if several else merge(docs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json(out, merged)
    print(f"wrote {out}")
    return 0


def _read_results(files: list[Path]) -> list[dict] | None:
    """The stored results of ``files``, or None after saying in one line what is wrong."""
    import json

    docs = []
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            print(f"error: {f}: {e}", file=sys.stderr)
            return None
        if doc.get("schema") != SCHEMA:
            print(f"error: {f}: not an accuracy result (schema {doc.get('schema')!r})",
                  file=sys.stderr)
            return None
        docs.append(doc)
    return docs


def _zero_shot(files: list[Path], out: Path | None) -> int:
    from benchmarks.accuracy import zero_shot

    if out is None or out.suffix != ".png":
        print("error: --zero-shot needs --out FILE.png", file=sys.stderr)
        return 2
    docs = _read_results(files)
    if docs is None:
        return 2
    sources = [portable(str(f.resolve()), {}) for f in files]
    print(zero_shot.markdown_table(docs, sources), end="")
    n = zero_shot.plot(docs, out)
    print(f"wrote {out} ({n} panels)" if n else "no data set has re-meshed splits; nothing "
                                                   "plotted")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)

    if args.table or args.plot:
        import json

        stored = args.table or args.plot
        try:
            doc = json.loads(stored.read_text())
        except (OSError, ValueError) as e:
            print(f"error: {stored}: {e}", file=sys.stderr)
            return 2
        if doc.get("schema") != SCHEMA:
            print(f"error: {stored}: not an accuracy result (schema "
                  f"{doc.get('schema')!r})", file=sys.stderr)
            return 2
        if args.plot:
            png = stored.with_suffix(".png")
            n = plot_histories(doc, png)
            print(f"wrote {png} ({n} data sets)" if n else
                  f"{stored}: no trained model has a validation history; nothing plotted")
            return 0
        print(markdown_table(doc), end="")
        return 0
    if args.merge:
        return _merge(args.merge, args.out)
    if args.zero_shot:
        return _zero_shot(args.zero_shot, args.out)
    if any(m in PEERS for m in args.models):
        try:
            ok = subprocess.run([args.peers_python, "-c", "import physicsnemo, neuralop"],
                                capture_output=True, text=True).returncode == 0
        except OSError:
            ok = False
        if not ok:
            print(f"error: {args.peers_python} cannot import physicsnemo and neuralop (install "
                  f"the peers: pip install -e .[peers], see docs/accuracy.md), or leave "
                  f"transolver,gino out of --models", file=sys.stderr)
            return 2
    budget = f"{args.epochs}epochs" if args.epochs else f"{args.minutes:g}min"
    out = args.out or RESULTS / f"accuracy-cpu-{args.threads}core-{budget}.json"
    command = "python -m benchmarks.accuracy " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    if args.seeds is None:
        return run_once(args, out, command)
    return run_seeds(args, out, command)


def run_seeds(args, out: Path, command: str) -> int:
    """``run_once`` for every seed of ``args.seeds`` (``OUT-seedS.json``, kept runs under
    ``KEEP/seedS``), then their combination (:func:`benchmarks.accuracy.seeds.combine_seeds`)
    into ``out`` and its table on the console."""
    import json

    files = []
    args.classical_cache = {}  # shared by the seeds' namespaces: the same dict
    for seed in args.seeds:
        one = argparse.Namespace(**{**vars(args), "seed": seed, "seeds": None,
                                    "keep": args.keep / f"seed{seed}" if args.keep else None})
        files.append(out.with_name(f"{out.stem}-seed{seed}{out.suffix}"))
        rc = run_once(one, files[-1], f"{command}  # seed {seed}")
        if rc:
            return rc
    rc = _merge(files, out)
    if rc == 0:
        print(console_table(json.loads(out.read_text())))
    return rc


def run_once(args, out: Path, command: str) -> int:
    """Every data set and model of ``args`` with one seed; the result in ``out`` and the
    console log beside it."""
    from benchmarks.reporting import write_json

    keep = args.keep
    work = keep or Path(tempfile.mkdtemp(prefix="meshops-accuracy-"))
    # the stored log and JSON name the data and the runs by these, not by this machine's paths
    roots = {"$DATA_ROOT": _data_root(args.data_root), "$WORK": work}
    log_lines = [portable(f"$ {command}", roots)]

    def log(text: str) -> None:
        print(text, flush=True)
        log_lines.append(portable(text, roots))

    doc = {"schema": SCHEMA, "command": command, "minutes": args.minutes, "epochs": args.epochs,
           **({"model_epochs": args.model_epochs} if args.model_epochs else {}),
           "seed": args.seed,
           **({"note": FIXED_WORK} if args.epochs else {}),
           **({"meshops_config": args.meshops_config} if args.meshops_config else {}),
           "threads": args.threads, "models": args.models, "grace": args.grace,
           "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": sys.version.split()[0]},
           "meshops_commit": _commit(), "peers_python": args.peers_python,
           "started": dt.datetime.now().isoformat(timespec="seconds"),
           "load": {"start": _load()}, "datasets": {}}
    log(f"# {command}")
    log(f"# {doc['machine']['cpu']}, {doc['machine']['cores']} cores, load average "
        f"{doc['load']['start']}; {budget_words(doc)} per trained model, {args.threads} threads")
    if doc.get("note"):
        log(f"# {doc['note']}")
    try:
        for name in args.datasets:
            data = datasets.prepare(name, _data_root(args.data_root))
            doc["datasets"][name] = run_dataset(name, data, args.models, args, work / name, log)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    doc["load"]["end"] = _load()
    doc["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    log("")
    log(console_table(doc))
    write_json(out, doc, roots)
    if not args.epochs and plot_histories(doc, out.with_suffix(".png")):  # no time figures
        log(f"plotted the validation histories into {out.with_suffix('.png')}")
    log(f"\nwrote {out} and {out.with_suffix('.log')}")
    out.with_suffix(".log").write_text("\n".join(log_lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
