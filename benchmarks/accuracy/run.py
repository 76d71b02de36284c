"""One data set through every model: train (or fit) on ``train/``, predict ``test/``,
score every prediction with :mod:`benchmarks.accuracy.metric`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from benchmarks.accuracy import classical
from benchmarks.accuracy.folder import description, list_files, read_split, same_mesh
from benchmarks.accuracy.meshops_cli import run_meshops, run_subprocess, split_of_run, thread_env
from benchmarks.accuracy.metric import relative_l2, summarize

#: Every model, in the order they run and are shown.
MODELS = ("meshops", "mean", "nearest", "pod_rbf", "transolver", "gino")
LABELS = {"meshops": "meshops default", "mean": "training mean",
          "nearest": "nearest training sample", "pod_rbf": "POD + RBF",
          "transolver": "Transolver", "gino": "GINO"}
PEERS = ("transolver", "gino")
REPO = Path(__file__).resolve().parents[2]


def score(predictions: dict, test) -> dict:
    """Summary and per-sample errors of ``{file name: [N, C]}`` on the test samples."""
    missing = [s.name for s in test if s.name not in predictions]
    if missing:
        return {"note": f"no prediction for {len(missing)} test file(s), e.g. {missing[0]}"}
    errors = [relative_l2(predictions[s.name], s.targets, s.weight) for s in test]
    return {**summarize(errors), "errors": [round(e, 8) for e in errors]}


def _classical(model: str, train, test) -> dict:
    fn = {"mean": classical.training_mean, "nearest": classical.nearest_sample,
          "pod_rbf": classical.pod_rbf}[model]
    t0 = time.perf_counter()
    try:
        preds = fn(train, test)
    except classical.NotApplicable as e:
        return {"note": f"n/a: {e}"}
    out = score(dict(zip((s.name for s in test), preds)), test)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    if model == "pod_rbf":
        out["note"] = classical.LAST_NOTE[0]
    return out


def _peer(model: str, data: Path, desc: dict, train_names, val_names, test, args,
          work: Path, log: Callable[[str], None]) -> dict:
    job = {"model": model, "data": str(data), "inputs": desc["inputs"],
           "targets": desc["targets"], "train": train_names, "val": val_names,
           "test": [s.name for s in test], "minutes": args.minutes, "threads": args.threads,
           "seed": args.seed, "out": str(work / model)}
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{model}-job.json").write_text(json.dumps(job))
    env = thread_env(args.threads)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [args.peers_python, "-m", "benchmarks.accuracy.peer_train",
           str(work / f"{model}-job.json")]
    log(f"  $ {' '.join(cmd)}")
    rc, wall, stopped = run_subprocess(
        cmd, env, lambda line: None if "Warp CUDA warning" in line else log(line),
        deadline_s=60 * args.minutes * args.grace + 180)
    if rc != 0 or not (work / f"{model}.npz").is_file():
        return {"note": f"{model} runner exited {rc}" + (" (stopped)" if stopped else ""),
                "wall_s": round(wall, 1)}
    with np.load(work / f"{model}.npz") as z:
        preds = {k: z[k] for k in z.files}
    out = score(preds, test)
    info = json.loads((work / f"{model}.json").read_text())
    out.update(wall_s=round(wall, 1), train_wall_s=info["train_wall_s"],
               parameters=info["parameters"], config=info["config"],
               run={k: info[k] for k in ("steps", "epochs", "batch", "accumulate",
                                         "validate_every", "best_step", "best_val",
                                         "stopped_at_budget", "threads", "torch")},
               history=info["history"])
    return out


def run_dataset(name: str, data: Path, models: Sequence[str], args, work: Path,
                log: Callable[[str], None]) -> dict:
    """Every model of ``models`` on the data set in ``data``; the result's ``models``
    maps each to its summary (``mean``, ``median``, ``worst``, ``errors``, ...) or to a
    ``note`` saying why it has none."""
    desc = description(data)
    inputs, targets = desc["inputs"], desc["targets"]
    train = read_split(data, "train", inputs, targets)
    test = read_split(data, "test", inputs, targets)
    names = list_files(data / "train")
    nodes = sorted({len(s.points) for s in train + test})
    res = {"description": desc["description"], "inputs": inputs, "targets": targets,
           "train": len(train), "test": len(test),
           "nodes": nodes[0] if len(nodes) == 1 else [nodes[0], nodes[-1]],
           "one_mesh": same_mesh(train + test), "models": {}}
    log(f"[{name}] {desc['description']}")
    log(f"[{name}] {len(train)} training / {len(test)} test files; inputs {','.join(inputs)}; "
        f"targets {','.join(targets)}")
    run_config = None
    for model in models:
        t0 = time.perf_counter()
        if model == "meshops":
            r = run_meshops(data, inputs, targets, args.minutes, work / "meshops",
                            thread_env(args.threads), log, args.grace)
            run_config = r.get("run_config")
            out = score(r["predictions"], test) if "predictions" in r else {}
            out.update({k: v for k, v in r.items() if k not in ("predictions",)})
        elif model in PEERS:
            tr, va = split_of_run(run_config, len(names))
            out = _peer(model, data, desc, [names[i] for i in tr], [names[i] for i in va],
                        test, args, work, log)
        else:
            out = _classical(model, train, test)
        out.setdefault("wall_s", round(time.perf_counter() - t0, 1))
        res["models"][model] = out
        log(f"[{name}] {LABELS[model]}: " + (
            f"mean {out['mean']:.4g}, median {out['median']:.4g}, worst {out['worst']:.4g}"
            if out.get("mean") is not None else out.get("note", "no result"))
            + f" ({out['wall_s']:.0f} s)")
        sys.stdout.flush()
    if run_config is None and any(m in PEERS for m in models):
        res["validation"] = "meshops train's default val_fraction and seed"
    else:
        res["validation"] = "the validation files of the meshops run (its config.yaml)"
    return res
