"""Validation probes of a neural peer's recipe (issue 36): the same search on validation
that chose the defaults of ``meshops train``, given to Transolver or GINO.

:mod:`benchmarks.family_probe` chose meshops' default recipe (batch size, learning rate,
schedule) on a geometry family's validation samples, each probe a budget of CPU seconds
of one thread. This module runs one such probe for a peer: the peer's own runner
(:mod:`benchmarks.accuracy.peer_train`, in the peers' environment) trains on the
training files of the split ``meshops train`` holds out (its default ``val_fraction``
and seed), under a budget of CPU seconds of its process (``"clock": "cpu"``), with the
recipe given here in place of the one in its ``CONFIGS``; the test files are never
read. Because the budget is CPU time of one thread, probes may run beside other work.

Example (in meshops' environment, the peers' Python named)::

    python -m benchmarks.peer_probe --data ~/.cache/meshops/accuracy/obstacle \\
        --model transolver --batch-size 2 --lr 1e-3 --scheduler onecycle \\
        --cpu-minutes 3 --peers-python ../peers/bin/python \\
        --out benchmarks/results/peer-probes-cpu-3min.jsonl

Each probe appends one JSON line in the format of :mod:`benchmarks.family_probe`'s
(recipe, epochs, CPU seconds, the best validation error, the validation curve, the
command) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.paths import REPO, command, portable


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a benchmark data set folder")
    p.add_argument("--model", required=True, choices=["transolver", "gino"])
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--scheduler", required=True, choices=["onecycle", "cosine", "step"])
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=JSON",
                   help="change the peer's configuration (a key of CONFIGS[model] or of its "
                        "'model'), e.g. fno_hidden_channels=32 "
                        "out_gno_channel_mlp_hidden_layers=[128,128]: the size a budget "
                        "shrinks it to")
    p.add_argument("--cpu-minutes", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peers-python", required=True, help="the peers' environment's python")
    p.add_argument("--out", type=Path, required=True, help="JSON lines file to append to")
    args = p.parse_args(argv)
    args.changes = {}
    for pair in args.set:
        key, _, value = pair.partition("=")
        try:
            args.changes[key] = json.loads(value)
        except json.JSONDecodeError:
            p.error(f"--set {pair!r}: expected KEY=JSON, e.g. fno_hidden_channels=32")
    return args


def _check_changes(model: str, changes: dict) -> None:
    """Refuse, before the peer's process starts, what its runner would refuse."""
    from benchmarks.accuracy.peer_train import configured

    try:
        configured(model, changes)
    except ValueError as e:
        raise SystemExit(f"--set: {e}") from None


def probe_job(data: Path, args, work: Path) -> dict:
    """The peer runner's job: the training files ``meshops train`` trains on, the ones it
    holds out as validation, no test files, a budget of CPU seconds."""
    from benchmarks.accuracy.folder import description, list_files
    from benchmarks.accuracy.meshops_cli import split_of_run
    from benchmarks.accuracy.metric import field_columns

    desc = description(data)
    names = list_files(data / "train")
    tr, va = split_of_run(None, len(names))
    columns = field_columns(desc["targets"], desc.get("fields") or list(desc["targets"]))
    return {"model": args.model, "data": str(data), "inputs": desc["inputs"],
            "targets": desc["targets"], "fields": columns,
            "train": [names[i] for i in tr], "val": [names[i] for i in va], "test": [],
            "minutes": args.cpu_minutes, "clock": "cpu", "threads": 1, "seed": args.seed,
            "config": {**args.changes, "batch": args.batch_size, "lr": args.lr,
                       "schedule": args.scheduler},
            "out": str(work / args.model), "name": desc["name"]}


def record_of(job: dict, summary: dict, args, argv) -> dict:
    """One JSON line: the probe's recipe and its best validation error."""
    roots = {"$DATA_ROOT": args.data.parent}
    best = min(summary["history"], key=lambda h: h["val"])
    return portable({
        "data": job["name"], "model": args.model, "model_config": summary["config"]["model"],
        **({"changes": args.changes} if args.changes else {}),
        "batch_size": args.batch_size, "lr": args.lr, "scheduler": args.scheduler,
        "seed": args.seed, "parameters": summary["parameters"],
        "cpu_minutes": args.cpu_minutes, "epochs": summary["epochs"],
        "cpu_s": summary["train_wall_s"], "best_step": best["step"], "val": best["val"],
        "train": len(job["train"]), "num_val": len(job["val"]),
        "curve": [round(h["val"], 6) for h in summary["history"]],
        "command": command("benchmarks.peer_probe", argv, roots),
    }, roots)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from benchmarks.accuracy.meshops_cli import run_subprocess, thread_env

    _check_changes(args.model, args.changes)
    with tempfile.TemporaryDirectory(prefix="peer-probe-") as tmp:
        work = Path(tmp)
        job = probe_job(args.data, args, work)
        (work / "job.json").write_text(json.dumps(job))
        env = thread_env(1)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        rc, _, _ = run_subprocess([args.peers_python, "-m", "benchmarks.accuracy.peer_train",
                                   str(work / "job.json")], env, print)
        if rc != 0:
            print(f"the peer's runner exited {rc}; nothing written", file=sys.stderr)
            return 1
        summary = json.loads((work / f"{args.model}.json").read_text())
    record = record_of(job, summary, args, argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"{job['name']} {args.model} bs {args.batch_size} lr {args.lr:g} {args.scheduler}: "
          f"{summary['epochs']} epochs, best val {record['val']:.4e} at step "
          f"{record['best_step']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
