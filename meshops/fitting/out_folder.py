"""The run folder a fit writes: what may be written into it, and what a resumed run
must keep (its layout, lock and provenance: :mod:`meshops.runs.run_folder`).

* A new run writes into ``--out`` only when the folder is absent, empty, or holds a
  meshops run of the same config that never saved a ``last.pt`` (a relaunch of a
  run that stopped before its first epoch ended). Anything else (a folder of other
  files, another run, or a finished run of any model: a reduced or trajectory basis
  is fitted in one go and writes ``best.pt`` and no ``last.pt``) is refused unless
  ``--overwrite``; no other run's ``best.pt`` is replaced without it.
* ``--resume`` continues exactly the run in ``last.pt``: every option must stay as
  it was, except ``--epochs`` (only without a learning-rate schedule), ``--minutes``
  (which only picks the epoch count of a new run) and ``--device``. A changed one is
  refused, naming the flag or the config file that changed it.
* ``--overwrite`` (and a relaunch) first removes everything an earlier run wrote:
  :data:`RUN_FILES`, the ensemble members under ``ensemble/seed*/`` (each cleared the
  same way) and TensorBoard's event files under ``tensorboard/``; a folder left empty is
  removed. Files of other names (the user's notes, a folder of their own) stay, so
  that ``--out .`` in a project folder deletes nothing the run did not write; so does
  an MLflow store (``mlflow.db``, ``mlartifacts/``), which keeps every run as its own
  record.
"""

from __future__ import annotations

import os
from pathlib import Path

from meshops.errors import UsageError
from meshops.fitting.config import TrainConfig, option_name
from meshops.runs.run_folder import LOCK_FILES, RUN_CONFIG, RUN_FILES, TENSORBOARD_FOLDER

# Options a resumed run may change (--epochs has its own rule: check_resume_epochs).
RESUME_MAY_CHANGE = ("epochs", "minutes", "device", "out")


def _norm(key: str, value):
    """An option's value as compared between runs: folders as absolute paths."""
    if key in ("data", "val_data") and value is not None:
        return os.path.abspath(value)
    return value


def option_label(key: str, request, out: Path) -> str:
    """Where option ``key`` came from: its flag (or :func:`meshops.fit`'s keyword),
    ``FILE: key`` for a ``--config`` file (``fit() config: key`` for fit()'s
    ``config``), else the run's own ``out/config.yaml``."""
    given = TrainConfig.from_request(request.options, request.source)
    if key == "fields" and "targets" in given:  # --targets u+v,p sets the fields
        return option_name("targets", request.source)
    if key in given:
        return option_name(key, request.source)
    label, options = TrainConfig.from_config(getattr(request, "config", None), request.source)
    if key in options:
        return f"{label}: {key}"
    return f"{out / RUN_CONFIG}: {key}"


def differences(cfg: TrainConfig, recorded: dict, keys, only_set: bool = False) -> list:
    """``[(key, now, recorded)]`` for the ``keys`` whose values differ. ``model_config``
    compares the hyperparameters set now with the recorded ones; with ``only_set`` an
    option left to the data now (``None``, a schedule ``"auto"``) is not compared."""
    out = []
    for key in keys:
        if key not in recorded:
            continue
        now, then = _norm(key, getattr(cfg, key)), _norm(key, recorded[key])
        if key == "fields":  # the grouping: None is every target its own field
            now, then = cfg.field_specs, list(then or recorded.get("targets") or [])
        if key == "model_config":
            then = then or {}
            changed = {k: v for k, v in (now or {}).items() if then.get(k) != v}
            if not only_set:
                changed.update({k: None for k in then if k not in (now or {})})
            if changed:
                out.append((key, changed, {k: then.get(k) for k in changed}))
        elif (not only_set or not _left_to_data(key, now)) and now != then:
            out.append((key, now, then))
    return out


def _left_to_data(key: str, value) -> bool:
    return value is None or (key == "scheduler" and value == "auto")


def _say(value) -> str:
    return "none" if value is None else str(value)


def check_resume_options(cfg: TrainConfig, recorded: dict, request, last: Path) -> None:
    """Refuse a resume whose options differ from those the run in ``last`` was trained
    with (``recorded``: its ``train_config``, or its ``config.yaml`` for older runs)."""
    keys = [k for k in TrainConfig.keys() if k not in RESUME_MAY_CHANGE]
    diff = differences(cfg, recorded, keys)
    if not diff:
        return
    labels = {k: option_label(k, request, last.parent) for k, _, _ in diff}
    flags = {k for k, v in labels.items() if v == option_name(k, request.source)
             or (k == "fields" and v == option_name("targets", request.source))}
    pair = ("val_fraction", "val_data")
    if set(pair) <= set(labels):  # one way of validating replaced by the other: say which
        given = [k for k in pair if k in flags]
        diff = [d for d in diff if d[0] not in pair or d[0] == (given or ["val_data"])[0]]
    # what the user gave first, then the --config file, then an edited config.yaml
    diff.sort(key=lambda d: (d[0] not in flags,
                             labels[d[0]].startswith(str(last.parent / RUN_CONFIG))))
    key, now, then = diff[0]
    label = labels[key]
    if key == "model_config":
        what = ", ".join(f"{k}={_say(now[k])} (the run: {_say(then[k])})" for k in now)
    else:
        what = f"{_say(now)} (the run: {_say(then)})"
    more = f" (and {len(diff) - 1} more option(s))" if len(diff) > 1 else ""
    say = lambda k: option_name(k, request.source)  # noqa: E731
    raise UsageError(f"{last}: {say('resume')} continues the run exactly, but {label} is "
                     f"{what}{more}; only {say('epochs')} (without a learning-rate schedule), "
                     f"{say('minutes')} and {say('device')} may change: leave the option "
                     f"out, or start a new run with another {say('out')}")


def recorded_config(out: Path) -> dict | None:
    """The options in ``out/config.yaml`` when it is a run's resolved config (every
    option present, as ``meshops train`` writes it), else ``None``."""
    path = out / RUN_CONFIG
    if not path.is_file():
        return None
    try:
        import yaml

        raw = yaml.safe_load(path.read_text())
        if not isinstance(raw, dict) or set(raw) != set(TrainConfig.keys()):
            return None
        return TrainConfig.coerce(raw, str(path))
    except (UsageError, OSError, ValueError, UnicodeDecodeError, yaml.YAMLError):
        return None


def check_out_folder(out: Path, cfg: TrainConfig, overwrite: bool, resume: bool = False,
                     source: str = "command line") -> None:
    """Refuse to start a new run in ``out`` unless it is absent, empty, or a run of the
    same config that never saved ``last.pt`` and is not a fitted reduced (or
    trajectory) basis; ``overwrite`` allows any folder. ``resume``: a resume was asked
    for (and ``out`` has no ``last.pt``), refused for a fitted basis with that reason.
    The messages name the options as ``source``'s caller writes them
    (:func:`~meshops.fitting.config.option_name`)."""
    if overwrite or not out.is_dir():
        return
    overwrite_, resume_, out_ = (option_name(k, source) for k in ("overwrite", "resume", "out"))
    hint = f"pass {overwrite_} to replace it, or choose another {out_}"
    fitted = _fitted(out)
    if fitted:  # finished: a reduced basis writes best.pt and no last.pt
        what = (f" and a {fitted} is fitted in one go, there is nothing to resume"
                if resume else "")
        raise UsageError(f"{out}: already holds a fitted {fitted} (best.pt){what}; {hint}")
    # the lock of this run (meshops.runs.run_folder) is no content
    entries = sorted(p.name for p in out.iterdir() if p.name not in LOCK_FILES)
    if not entries:
        return
    if (out / "last.pt").exists():
        raise UsageError(f"{out}: already holds a training run (last.pt); pass {resume_} to "
                         f"continue it, {overwrite_} to replace it, or choose another {out_}")
    recorded = recorded_config(out)
    if recorded is None:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise UsageError(f"{out}: the folder is not empty ({shown}) and is not a meshops run; "
                         f"training writes {', '.join(RUN_FILES[:4])} and more into it: pass "
                         f"{overwrite_} to allow that, or choose another {out_}")
    diff = differences(cfg, recorded, [k for k in TrainConfig.keys()
                                       if k not in ("out", "device")], only_set=True)
    if diff:
        key, now, then = diff[0]
        raise UsageError(f"{out}: holds a meshops run of another config ({key}: "
                       f"{_say(then)} there, {_say(now)} now); {hint}")


def _fitted(out: Path) -> str:
    """What finished model fitted in one go ``out`` holds (``"reduced basis"``,
    ``"trajectory basis"``), by its ``best.pt`` and config.yaml; ``""`` when none.
    (A run trained by epochs with ``best.pt`` and no ``last.pt`` stopped during its
    first epoch, between the two saves: the same command relaunches it.)"""
    model = (recorded_config(out) or {}).get("model") if (out / "best.pt").exists() else None
    return {"reduced_basis": "reduced basis",
            "trajectory_basis": "trajectory basis"}.get(model, "")


def clear_run_files(out: Path) -> None:
    """Remove the outputs of an earlier run from ``out``: :data:`RUN_FILES`, its
    ensemble members (each a run folder, cleared the same way) and TensorBoard event
    files; a sub-folder left empty goes too. The user's other files stay."""
    from meshops.inference.trust import ENSEMBLE
    from meshops.utils.atomic import clean_stale_temporaries

    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    clean_stale_temporaries(out)
    members = out / ENSEMBLE
    if members.is_dir():
        for member in members.glob("seed*"):
            if member.is_dir():
                clear_run_files(member)
                _remove_if_empty(member)
        _remove_if_empty(members)
    logs = out / TENSORBOARD_FOLDER
    if logs.is_dir():
        for f in logs.glob("events.out.tfevents.*"):
            f.unlink(missing_ok=True)
        _remove_if_empty(logs)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # holds files the run did not write
        pass
