"""One data set through every model: train (or fit) on ``train/``, predict ``test/``,
score every prediction with :mod:`benchmarks.accuracy.metric`."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from benchmarks.accuracy import classical, remesh
from benchmarks.accuracy.folder import description, list_files, read_split, same_mesh
from benchmarks.accuracy.meshops_cli import (
    run_meshops,
    run_subprocess,
    split_of_run,
    stop_after_s,
    thread_env,
)
from benchmarks.accuracy.metric import field_columns, field_errors, summarize
from benchmarks.accuracy.peer_train import TRAINED
from benchmarks.reporting import write_json

#: Every model, in the order they run and are shown.
MODELS = ("meshops", "mean", "nearest", "pod_rbf", "transolver", "gino")
LABELS = {"meshops": "meshops default", "mean": "training mean",
          "nearest": "nearest training sample", "pod_rbf": "POD + RBF",
          "transolver": "Transolver", "gino": "GINO"}
PEERS = ("transolver", "gino")
REPO = Path(__file__).resolve().parents[2]


def score(predictions: dict, test, columns: dict) -> dict:
    """Summary and per-sample errors of ``{file name: [N, C]}`` on the test samples:
    the mean over the target fields (``columns``, :func:`metric.field_columns`) and,
    with several fields, each field's (``"fields"``)."""
    missing = [s.name for s in test if s.name not in predictions]
    if missing:
        return {"note": f"no prediction for {len(missing)} test file(s), e.g. {missing[0]}"}
    per = [field_errors(predictions[s.name], s.targets, s.weight, columns) for s in test]
    out = {**summarize([e["mean"] for e in per]),
           "errors": [round(e["mean"], 8) for e in per]}
    if len(columns) > 1:
        out["fields"] = {f: {**summarize([e[f] for e in per]),
                             "errors": [round(e[f], 8) for e in per]} for f in columns}
    return out


def score_remeshed(out: dict, predictions: dict, remeshed: dict, columns: dict,
                   test=(), test_predictions: dict | None = None) -> None:
    """Add to a model's result ``out`` its scores on the re-meshed splits
    (``predictions``: ``{split: {file name: [N, C]}}``; ``remeshed``: ``{split:
    samples}``), each with ``ratio``, its mean error over the model's own on ``test/``,
    and ``moved``: the score of its ``test_predictions`` on the ``test`` samples carried
    onto the re-meshed ones (:func:`benchmarks.accuracy.remesh.moved_predictions`)."""
    for split, samples in remeshed.items():
        if split not in predictions:
            continue
        r = score(predictions[split], samples, columns)
        if test_predictions:
            r["moved"] = score(remesh.moved_predictions(test, test_predictions, samples),
                               samples, columns)
        if r.get("mean") is not None and out.get("mean"):
            r["ratio"] = r["mean"] / out["mean"]
        for f, v in r.get("fields", {}).items():
            own = out.get("fields", {}).get(f, {}).get("mean")
            if v.get("mean") is not None and own:
                v["ratio"] = v["mean"] / own
        out.setdefault("remeshed", {})[split] = r


def _classical(model: str, train, test, columns: dict, remeshed: dict) -> dict:
    fn = {"mean": classical.training_mean, "nearest": classical.nearest_sample,
          "pod_rbf": classical.pod_rbf}[model]
    t0 = time.perf_counter()
    try:
        preds = fn(train, test)
        extra = {split: dict(zip((s.name for s in samples), fn(train, samples)))
                 for split, samples in remeshed.items()}
    except classical.NotApplicable as e:
        return {"note": f"n/a: {e}"}
    out = score(dict(zip((s.name for s in test), preds)), test, columns)
    score_remeshed(out, extra, remeshed, columns, test, dict(zip((s.name for s in test),
                                                                  preds)))
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    if model in ("pod_rbf", "nearest"):
        out["note"] = classical.LAST_NOTE[0]
    return out


def epochs_of(args, model: str) -> int | None:
    """The fixed epochs of a trained ``model``: its own (``--model-epochs``) or the run's
    ``--epochs`` (None: the ``--minutes`` clock)."""
    return (getattr(args, "model_epochs", None) or {}).get(model, getattr(args, "epochs", None))


def _peer(model: str, data: Path, desc: dict, train_names, val_names, test, remeshed, args,
          work: Path, log: Callable[[str], None], columns: dict) -> dict:
    job = {"model": model, "data": str(data), "inputs": desc["inputs"],
           "targets": desc["targets"], "fields": columns, "train": train_names,
           "val": val_names, "test": [s.name for s in test],
           "extra": {split: [s.name for s in samples] for split, samples in remeshed.items()},
           "minutes": args.minutes, "epochs": epochs_of(args, model),
           "threads": args.threads, "seed": args.seed, "out": str(work / model)}
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{model}-job.json").write_text(json.dumps(job))
    env = thread_env(args.threads)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [args.peers_python, "-m", "benchmarks.accuracy.peer_train",
           str(work / f"{model}-job.json")]
    log(f"  $ {' '.join(cmd)}")
    done = all((work / f"{model}{end}").is_file() for end in (".npz", ".json"))
    if getattr(args, "reuse", False) and done:
        log(f"  (reused what {model} trained and predicted before in {work})")
        # its time is that earlier run's, not kept: no wall time rather than 0 s
        rc, wall, stopped = 0, None, False
    else:
        rc, wall, stopped = run_subprocess(
            cmd, env, lambda line: None if "Warp CUDA warning" in line else log(line),
            deadline_s=None if job["epochs"] else stop_after_s(args.minutes, args.grace),
            deadline_until=TRAINED)
    if rc != 0 or not (work / f"{model}.npz").is_file():
        return {"note": f"{model} runner exited {rc}" + (" (stopped)" if stopped else ""),
                "wall_s": round(wall, 1)}
    preds = {}
    for split in ("", *remeshed):
        path = work / f"{model}{'-' + split if split else ''}.npz"
        if path.is_file():
            with np.load(path) as z:
                preds[split] = {k: z[k] for k in z.files}
    own = preds.pop("")
    out = score(own, test, columns)
    score_remeshed(out, preds, remeshed, columns, test, own)
    info = json.loads((work / f"{model}.json").read_text())
    out.update(wall_s=None if wall is None else round(wall, 1),
               train_wall_s=info["train_wall_s"],
               parameters=info["parameters"], config=info["config"],
               run={k: info[k] for k in ("steps", "epochs", "batch", "accumulate",
                                         "validate_every", "best_step", "best_val",
                                         "stopped_at_budget", "threads", "torch")},
               history=info["history"])
    return out


def _one_model(model, name, data, desc, names, train, test, remeshed, columns, args, work,
               log, run_config):
    """One model's result on a data set's test files (and re-meshed splits), and the
    meshops run's config (for the peers' split)."""
    if model == "meshops":
        r = run_meshops(data, desc["inputs"], desc.get("fields") or list(desc["targets"]),
                        args.minutes, work / "meshops",
                        thread_env(args.threads), log, args.grace, extra=list(remeshed),
                        epochs=epochs_of(args, "meshops"), seed=args.seed,
                        reuse=getattr(args, "reuse", False),
                        model_config=getattr(args, "meshops_config", None) or ())
        run_config = r.get("run_config")
        out = score(r["predictions"], test, columns) if "predictions" in r else {}
        score_remeshed(out, r.get("extra_predictions", {}), remeshed, columns, test,
                       r.get("predictions"))
        out.update({k: v for k, v in r.items()
                    if k not in ("predictions", "extra_predictions")})
    elif model in PEERS:
        # without meshops in this run: the split its run of this seed draws
        tr, va = split_of_run(run_config, len(names), seed=args.seed)
        out = _peer(model, data, desc, [names[i] for i in tr], [names[i] for i in va],
                    test, remeshed, args, work, log, columns)
    else:
        out = _classical_once(model, name, data, train, test, columns, remeshed, args, work,
                              log)
    return out, run_config


def _classical_once(model, name, data, train, test, columns, remeshed, args, work,
                    log) -> dict:
    """A classical predictor's result, computed once: no seed enters it, so with --seeds
    the first seed's is reused (``args.classical_cache``); and it is written to
    ``work/MODEL-result.json`` with a digest of the arrays it read, so that --reuse of a
    kept folder takes it back instead of recomputing it (the training mean's transfers
    take about half an hour on each 3-D family) when the digest still matches."""
    cache = getattr(args, "classical_cache", None)
    key = (name, str(data), model)
    if cache is not None and key in cache:
        out, note = json.loads(cache[key]), "seed-independent: computed once for every seed"
    else:
        out, note = _classical_kept(model, train, test, columns, remeshed, args, work, log)
        if cache is not None:
            cache[key] = json.dumps(out)
    if note:
        out["note"] = "; ".join(filter(None, [out.get("note"), note]))
    return out


def _classical_kept(model, train, test, columns, remeshed, args, work,
                    log) -> tuple[dict, str]:
    """``(result, note)``: the result kept in ``work/MODEL-result.json`` where --reuse
    is given and its digest matches the arrays, else computed and kept there."""
    kept = work / f"{model}-result.json"
    digest = _digest(train, test, remeshed, columns)
    if getattr(args, "reuse", False) and _kept_digest(kept) == digest:
        log(f"  (reused the {LABELS[model]}'s result kept in {kept})")
        return json.loads(kept.read_text())["result"], f"reused from {kept.name}"
    out = _classical(model, train, test, columns, remeshed)
    work.mkdir(parents=True, exist_ok=True)
    write_json(kept, {"digest": digest, "result": out})
    return out, ""


def _digest(train, test, remeshed: dict, columns: dict) -> str:
    """SHA-256 of every array a classical predictor reads (points, cells, inputs,
    targets, parameters of each sample, in order) and of the field columns."""
    h = hashlib.sha256(json.dumps(columns, sort_keys=True).encode())
    for split in (train, test, *remeshed.values()):
        for s in split:
            h.update(s.name.encode())
            for a in (s.points, s.cells, s.inputs, s.targets, s.given_params):
                if a is not None:
                    a = np.ascontiguousarray(a)
                    h.update(f"{a.dtype}{a.shape}".encode())
                    h.update(a.tobytes())
    return h.hexdigest()


def _kept_digest(path: Path) -> str | None:
    """The digest a kept classical result was written with; None if there is none or the
    file is not a whole one (a write is atomic, so that means an older format)."""
    try:
        return json.loads(path.read_text()).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


def run_dataset(name: str, data: Path, models: Sequence[str], args, work: Path,
                log: Callable[[str], None]) -> dict:
    """Every model of ``models`` on the data set in ``data``; the result's ``models``
    maps each to its summary (``mean``, ``median``, ``worst``, ``errors``, ...) or to a
    ``note`` saying why it has none."""
    desc = description(data)
    inputs, targets = desc["inputs"], desc["targets"]
    fields = desc.get("fields") or list(targets)
    train = read_split(data, "train", inputs, targets)
    test = read_split(data, "test", inputs, targets)
    columns = field_columns(targets, fields)
    remeshed = {split: read_split(data, split, inputs, targets)
                for split in desc.get("extra_splits", [])}
    names = list_files(data / "train")
    nodes = sorted({len(s.points) for s in train + test})
    res = {"description": desc["description"], "inputs": inputs, "targets": targets,
           "fields": fields, "train": len(train), "test": len(test),
           "nodes": nodes[0] if len(nodes) == 1 else [nodes[0], nodes[-1]],
           "one_mesh": same_mesh(train + test), "models": {},
           "truth_difference": {split: remesh.truth_difference(test, samples, columns)
                                for split, samples in remeshed.items()}}
    log(f"[{name}] {desc['description']}")
    log(f"[{name}] {len(train)} training / {len(test)} test files; inputs {','.join(inputs)}; "
        f"target fields {','.join(fields)}")
    run_config = None
    for model in models:
        t0 = time.perf_counter()
        try:
            out, run_config = _one_model(model, name, data, desc, names, train, test, remeshed,
                                         columns, args, work, log, run_config)
        except Exception as e:  # one model's failure must not lose the others' results
            import traceback

            log("".join(traceback.format_exception(e)).rstrip())
            out = {"note": f"failed: {type(e).__name__}: {e}"}
        out.setdefault("wall_s", round(time.perf_counter() - t0, 1))
        res["models"][model] = out
        per_field = "".join(f"; {f} {v['mean']:.4g}" for f, v in out.get("fields", {}).items()
                            if v.get("mean") is not None)
        log(f"[{name}] {LABELS[model]}: " + (
            f"mean {out['mean']:.4g}, median {out['median']:.4g}, worst {out['worst']:.4g}"
            f"{per_field}" if out.get("mean") is not None else out.get("note", "no result"))
            + (f" ({out['wall_s']:.0f} s)" if out["wall_s"] is not None else " (reused)"))
        sys.stdout.flush()
    if run_config is None and any(m in PEERS for m in models):
        res["validation"] = "meshops train's default val_fraction and seed"
    else:
        res["validation"] = "the validation files of the meshops run (its config.yaml)"
    return res
