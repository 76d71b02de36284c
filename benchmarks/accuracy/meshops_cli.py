"""meshops as a new user runs it: ``meshops train`` with its defaults, then
``meshops predict`` on the test files; the benchmark scores the written predictions.

The command lines are exactly::

    python -m meshops train --data DIR/train --inputs A,B --targets U,V --minutes M --out RUN
    python -m meshops predict RUN DIR/test -o PRED

so whatever the CLI's default model and recipe are at the time is what is measured.
``meshops train`` fits its epochs to ``--minutes`` itself; the benchmark stops it if it
runs past the budget by more than the grace (``best.pt`` is then the best validated
epoch so far) and records the wall time either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from benchmarks.accuracy.folder import read_sample

# What a run may take beyond grace x its budget before it is stopped, the same for every
# model: reading the files and building the model on a loaded machine are not training,
# and they must not cut short a smoke run whose budget is a fraction of a minute.
ALLOWANCE_S = 180.0


def stop_after_s(minutes: float, grace: float) -> float:
    """Seconds after which a model's process is stopped: ``grace x budget + ALLOWANCE_S``."""
    return 60 * minutes * grace + ALLOWANCE_S


def run_subprocess(cmd: Sequence[str], env: dict, log: Callable[[str], None],
                   deadline_s: float | None = None,
                   deadline_until: str | None = None) -> tuple[int, float, bool]:
    """Run ``cmd``, streaming its output lines to ``log``; stop it (SIGTERM, then
    SIGKILL) after ``deadline_s`` seconds, unless it has printed a line containing
    ``deadline_until`` by then (a peer's end of training: its predicting of the test and
    re-meshed files, minutes on a 3-D family whatever the budget, is not held to it).

    Returns:
        ``(return code, wall seconds, stopped at the deadline)``.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, bufsize=1)
    stopped = False
    released = threading.Event()

    def watchdog():
        nonlocal stopped
        if deadline_s is None:
            return
        while proc.poll() is None and not released.is_set():
            if time.perf_counter() - t0 > deadline_s:
                stopped = True
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                return
            time.sleep(0.5)

    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    for line in proc.stdout:
        if deadline_until is not None and deadline_until in line:
            released.set()
        log("    " + line.rstrip())
    rc = proc.wait()
    guard.join(timeout=1)
    return rc, time.perf_counter() - t0, stopped


def run_meshops(data: Path, inputs: Sequence[str], fields: Sequence[str], minutes: float,
                work: Path, env: dict, log: Callable[[str], None], grace: float,
                extra: Sequence[str] = (), epochs: int | None = None, seed: int = 0,
                reuse: bool = False, model_config: Sequence[str] = ()) -> dict:
    """Train with the CLI's defaults (``--targets`` the target ``fields``: ``u+v,p``) and
    predict on ``data/test`` (and on ``data/SPLIT`` for every split of ``extra``: the
    test shapes re-meshed). With ``epochs``, ``--epochs N`` replaces ``--minutes`` (a fixed
    amount of work) and nothing is stopped at a deadline. With ``reuse``, a run already
    trained in ``work`` (a kept folder) is predicted and scored again, not retrained.
    ``model_config`` (``KEY=VALUE`` strings) goes to ``--model-config``: a variant of the
    default model, the rest of its configuration as the data choose it.

    Returns:
        ``{"predictions": {file name: [N, C]}, "extra_predictions": {split: {file name:
        [N, C]}}, "commands": [...],
        "train_wall_s", "stopped", "note", "history"}``; ``predictions`` is missing when a
        step failed; ``history`` lists the validation error of every epoch against the
        training time so far (``s``).
    """
    run, pred = work / "run", work / "pred"
    targets = [t for f in fields for t in f.split("+")]
    py = [sys.executable, "-m", "meshops"]
    train = py + ["train", "--data", str(data / "train"), "--inputs", ",".join(inputs),
                  "--targets", ",".join(fields),
                  *(["--epochs", str(epochs)] if epochs else ["--minutes", f"{minutes:g}"]),
                  "--seed", str(seed), "--out", str(run),
                  *(["--model-config", *model_config] if model_config else [])]
    # a rescored run replaces the predictions its earlier scoring wrote
    again = ["--overwrite"] if reuse else []
    predict = py + ["predict", str(run), str(data / "test"), "-o", str(pred), *again]
    out: dict = {"commands": [" ".join(train[1:]), " ".join(predict[1:])]}
    log("  $ " + out["commands"][0])
    # made here: a train that fails before writing its run must still leave its record
    work.mkdir(parents=True, exist_ok=True)
    record = work / "train.json"
    if reuse and (run / "best.pt").is_file():
        done = json.loads(record.read_text()) if record.is_file() else {}
        log(f"  (reused the run trained before in {run})")
        rc, stopped = done.get("rc", 0), done.get("stopped", False)
        out.update(train_wall_s=done.get("train_wall_s"), stopped=stopped, reused=True)
    else:
        rc, wall, stopped = run_subprocess(train, env, log, deadline_s=None if epochs else
                                           stop_after_s(minutes, grace))
        out.update(train_wall_s=round(wall, 1), stopped=stopped)
        record.write_text(json.dumps({"rc": rc, "stopped": stopped,
                                      "train_wall_s": out["train_wall_s"]}))
    if not (run / "best.pt").is_file():
        out["note"] = f"meshops train exited {rc} without best.pt"
        return out
    if rc != 0 and not stopped:
        out["note"] = f"meshops train exited {rc}"
        return out
    log("  $ " + out["commands"][1])
    rc, wall, _ = run_subprocess(predict, env, log)
    out["predict_wall_s"] = round(wall, 1)
    if rc != 0:
        out["note"] = f"meshops predict exited {rc}"
        return out
    out["predictions"] = _read_predictions(pred, targets)
    for split in extra:
        cmd = py + ["predict", str(run), str(data / split), "-o", str(work / f"pred_{split}"),
                    *again]
        out["commands"].append(" ".join(cmd[1:]))
        log("  $ " + out["commands"][-1])
        if run_subprocess(cmd, env, log)[0] == 0:
            out.setdefault("extra_predictions", {})[split] = _read_predictions(
                work / f"pred_{split}", targets)
    out["history"] = _history(run)
    out["note"] = ("stopped at the budget; best.pt = best validated epoch so far" if stopped
                   else "")
    out["run_config"] = (run / "config.yaml").read_text() if (run / "config.yaml").is_file() \
        else None
    return out


def _read_predictions(folder: Path, targets: Sequence[str]) -> dict:
    """``{file name: [N, C]}`` of the ``<target>_pred`` fields ``meshops predict`` wrote."""
    return {f.name: read_sample(f, [], [f"{t}_pred" for t in targets]).targets
            for f in sorted(folder.glob("*.vtu"))}


def _history(run: Path) -> list[dict]:
    """The run's validation error after every epoch against its training time so far:
    ``[{"epoch", "s", "val"}]`` (empty for a fitted model, which has no epochs)."""
    import json

    try:
        hist = json.loads((run / "history.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(hist, list):
        return []
    out, t = [], 0.0
    for e in hist:
        t += float(e.get("time_s") or 0.0)
        val = (e.get("val") or {}).get("l2_mean")
        out.append({"epoch": e.get("epoch"), "s": round(t, 1), "val": val})
    return out


def thread_env(threads: int) -> dict:
    """The environment of a model's process: ``threads`` intra-op threads."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    return env


def split_of_run(run_config: str | None, n: int,
                 seed: int | None = None) -> tuple[list[int], list[int]]:
    """The train/validation indices ``meshops train`` used on ``n`` files: its
    ``val_fraction`` and ``seed`` (from the run's ``config.yaml``, else the CLI's
    defaults, and ``seed``, the ``--seed`` it was or would be given) through
    :func:`meshops.training.splits.validation_split`."""
    import yaml

    from meshops.fitting.config import TrainConfig
    from meshops.training.splits import validation_split

    defaults = TrainConfig()
    cfg = yaml.safe_load(run_config) if run_config else {}
    frac = cfg.get("val_fraction", defaults.val_fraction)
    seed = cfg.get("seed", defaults.seed if seed is None else seed)
    return validation_split(n, frac or 0.0, seed)


__all__ = ["run_meshops", "run_subprocess", "split_of_run", "thread_env", "np"]
