"""The ``meshops`` command: ``info``, ``train``, ``predict``, ``evaluate``, ``plot``.

Every subcommand has ``--help`` with examples. Errors in the user's data or
arguments (missing files or fields, empty folders, field shapes that differ
between files, a checkpoint that does not fit the data, bad config keys) print
``meshops: error: ...`` naming the file on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from meshops.errors import CheckpointError, MeshError


class CLIError(Exception):
    """A usage or data error the command reports as ``meshops: error: ...`` (exit 2)."""


# Model modules that register themselves in meshops.models.MODELS when imported.
_MODEL_MODULES = ("transformer_no", "galerkin_transformer", "patched", "pit")

RUN_CHECKPOINT = "best.pt"
RUN_CONFIG = "config.yaml"


# =============================================================================== info
def mesh_summary(mesh) -> dict:
    """Plain-data summary of a :class:`MeshData` (what ``meshops info`` prints)."""
    from meshops.quadrature import CELL_DIMS

    pos = mesh.pos
    counts = mesh.cell_counts()
    # The measure is of the highest-dimensional cells (a surface's area in 3-D);
    # a point cloud's weights estimate the volume of the space it fills.
    tdim = max((CELL_DIMS.get(t, 0) for t, n in counts.items() if n), default=0)
    return {
        "file": str(getattr(mesh, "source", None)),
        "points": int(pos.shape[0]),
        "dimension": int(pos.shape[1]),
        "cell_dimension": tdim or int(pos.shape[1]),
        "cells": counts,
        "measure": float(mesh.weight.sum()),
        "bounding_box": {"min": pos.min(0).values.tolist(), "max": pos.max(0).values.tolist()},
        "fields": {k: list(v.shape) for k, v in (getattr(mesh, "fields", None) or {}).items()},
    }


def _cmd_info(args) -> int:
    from meshops.io import read_mesh

    for path in args.files:
        info = mesh_summary(read_mesh(path))
        if args.json:
            print(json.dumps(info))
            continue
        name = {1: "length", 2: "area", 3: "volume"}[info["cell_dimension"]]
        print(f"{info['file']}")
        print(f"  points     {info['points']}  (dimension {info['dimension']})")
        print("  cells      " + ", ".join(f"{n} {t}" for t, n in info["cells"].items()))
        print(f"  {name:<10} {info['measure']:.10g}  (sum of quadrature weights)")
        lo, hi = info["bounding_box"]["min"], info["bounding_box"]["max"]
        print("  bounds     " + "  ".join(f"[{a:.6g}, {b:.6g}]" for a, b in zip(lo, hi)))
        fields = info["fields"]
        print("  fields     " + (", ".join(f"{k} {s}" for k, s in fields.items())
                                 or "none"))
    return 0


# ============================================================================ helpers
def _load_model_modules() -> None:
    """Import the model modules present in this installation, so that they register."""
    for name in _MODEL_MODULES:
        mod = f"meshops.models.{name}"
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)


def _names(value, key: str) -> list[str]:
    """A list of field names from ``"a,b"``, ``""`` or a list."""
    if value is None:
        return []
    if isinstance(value, str):
        names = [s.strip() for s in value.split(",")]
        names = [s for s in names if s]
    elif isinstance(value, (list, tuple)):
        names = []
        for v in value:
            if not isinstance(v, str) or not v.strip():
                raise CLIError(f"{key}: field names must be non-empty strings, got {v!r}")
            names.append(v.strip())
    else:
        raise CLIError(f"{key}: expected a comma-separated string or a list of field "
                       f"names, got {value!r}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CLIError(f"{key}: field(s) {dup} given more than once")
    return names


def _progress(iterable, **kw):
    """A tqdm bar on stderr, shown only on a terminal (no bar spam in logs)."""
    from meshops._progress import progress

    return progress(iterable, **kw)


def _field_shape(v) -> list[int]:
    """Per-point shape of a field: ``[]`` for a scalar, ``[c]`` for a vector."""
    return [int(s) for s in v.shape[1:]]


def _channels(shape: Sequence[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def _fmt_shape(shape: Sequence[int]) -> str:
    return "scalar" if not shape else "x".join(str(s) for s in shape) + " per point"


def _available(mesh) -> str:
    from meshops.io import WEIGHT_FIELD

    names = [k for k in (getattr(mesh, "fields", None) or {}) if k != WEIGHT_FIELD]
    return ", ".join(sorted(names)) or "none"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _is_main_rank() -> bool:
    from meshops.training.distributed import torchrun_env

    env = torchrun_env()
    return env is None or env[1] == 0


# ============================================================================ train
TRAIN_DEFAULTS: dict[str, Any] = {
    "data": None,
    "inputs": None,
    "targets": None,
    "model": "pit",
    "model_config": {},
    # None: chosen from the data (meshops.training.defaults); epochs to fit `minutes`.
    "epochs": None,
    "minutes": 10.0,
    "batch_size": None,
    "lr": None,
    "weight_decay": 1e-4,
    "scheduler": "cosine",
    "grad_clip": None,
    "quadrature_loss": True,
    "val_fraction": 0.2,
    "val_data": None,
    "seed": 0,
    "out": "run",
    "device": None,
    "dtype": "float32",
}

# Model hyperparameters the CLI sets differently from the class defaults (none at
# the moment: the class defaults are the documented benchmark sizes). The input and
# output channels and the spatial dimension always come from the data.
CLI_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {}
INFERRED = ("in_channels", "out_channels", "pos_dim")


def _to_int(key, v, minimum=None):
    if isinstance(v, bool):
        raise CLIError(f"{key}: expected an integer, got {v!r}")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        try:
            v = int(v)
        except ValueError:
            raise CLIError(f"{key}: expected an integer, got {v!r}") from None
    if not isinstance(v, int):
        raise CLIError(f"{key}: expected an integer, got {v!r}")
    if minimum is not None and v < minimum:
        raise CLIError(f"{key}: must be >= {minimum}, got {v}")
    return v


def _to_float(key, v, positive=False, nonneg=False):
    if isinstance(v, bool):
        raise CLIError(f"{key}: expected a number, got {v!r}")
    try:
        v = float(v)  # YAML reads 1e-3 (without a dot) as a string
    except (TypeError, ValueError):
        raise CLIError(f"{key}: expected a number, got {v!r}") from None
    if not math.isfinite(v) or (positive and v <= 0) or (nonneg and v < 0):
        raise CLIError(f"{key}: must be a finite {'positive' if positive else 'non-negative'} "
                       f"number, got {v}")
    return v


def _to_bool(key, v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "yes", "1", "false", "no", "0"):
        return v.lower() in ("true", "yes", "1")
    raise CLIError(f"{key}: expected true or false, got {v!r}")


def _opt_str(key, v):
    if v is None or (isinstance(v, str) and v.lower() in ("", "none", "null")):
        return None
    if not isinstance(v, (str, os.PathLike)):
        raise CLIError(f"{key}: expected a string, got {v!r}")
    return str(v)


def _parse_value(text: str):
    """A ``key=value`` value: int, float, bool, null or string (YAML scalars)."""
    import yaml

    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (str, bool, int, float, list)) or v is None else text


def _model_config_from_pairs(pairs: Sequence[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise CLIError(f"--model-config: expected key=value, got {pair!r}")
        out[key] = _parse_value(value.strip())
    return out


def _validate_train_config(cfg: dict, where: str) -> dict:
    """Type-check and normalise a (partial) train config; ``where`` names its source."""
    out = {}
    for key, v in cfg.items():
        k = f"{where}: {key}"
        if key in ("data", "val_data", "out", "device"):
            v = _opt_str(k, v)
        elif key in ("inputs", "targets"):
            v = _names(v, k)
        elif key == "model":
            if not isinstance(v, str) or not v:
                raise CLIError(f"{k}: expected a model name, got {v!r}")
        elif key == "model_config":
            if v is None:
                v = {}
            if not isinstance(v, dict):
                raise CLIError(f"{k}: expected a mapping of hyperparameters, got {v!r}")
            v = {str(a).replace("-", "_"): b for a, b in v.items()}
        elif key in ("epochs", "batch_size"):
            v = _to_int(k, v, minimum=1)
        elif key == "seed":
            v = _to_int(k, v, minimum=0)
        elif key == "lr":
            v = _to_float(k, v, positive=True)
        elif key == "minutes":
            v = _to_float(k, v, positive=True)
        elif key == "weight_decay":
            v = _to_float(k, v, nonneg=True)
        elif key == "grad_clip":
            v = None if v is None or v == "none" else _to_float(k, v, positive=True)
        elif key == "val_fraction":
            v = None if v is None else _to_float(k, v, nonneg=True)
            if v is not None and v >= 1:
                raise CLIError(f"{k}: must be in [0, 1), got {v}")
        elif key == "quadrature_loss":
            v = _to_bool(k, v)
        elif key == "scheduler":
            v = None if v is None or str(v).lower() in ("none", "constant") else str(v)
            if v not in (None, "cosine", "onecycle"):
                raise CLIError(f"{k}: must be cosine, onecycle or none, got {v!r}")
        elif key == "dtype":
            if v not in ("float32", "float64"):
                raise CLIError(f"{k}: must be float32 or float64, got {v!r}")
        out[key] = v
    return out


def _check_keys(cfg: dict, where: str) -> dict:
    """Normalise ``batch-size`` to ``batch_size`` and reject unknown keys."""
    out = {}
    for key, v in cfg.items():
        k = str(key).replace("-", "_")
        if k not in TRAIN_DEFAULTS:
            close = difflib.get_close_matches(k, list(TRAIN_DEFAULTS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CLIError(f"{where}: unknown key {key!r}{hint}; valid keys: "
                           f"{', '.join(TRAIN_DEFAULTS)}")
        out[k] = v
    return out


def load_config_file(path) -> dict:
    """Read a train config file (YAML, or TOML by the ``.toml`` suffix): a flat
    mapping of the ``meshops train`` options (``batch_size`` or ``batch-size``),
    with ``model_config`` a nested mapping. Unknown keys are an error."""
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"{path}: no such config file")
    text = path.read_bytes()
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            cfg = tomllib.loads(text.decode("utf-8"))
        else:
            import yaml

            cfg = yaml.safe_load(text.decode("utf-8"))
    except Exception as e:  # yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError
        raise CLIError(f"{path}: cannot parse config ({type(e).__name__}: {e})") from None
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise CLIError(f"{path}: a config file must be a mapping of options, got "
                       f"{type(cfg).__name__}")
    return _validate_train_config(_check_keys(cfg, str(path)), str(path))


def _flag_config(args) -> dict:
    """Options given on the command line (argparse leaves absent ones out)."""
    cfg = {k: getattr(args, k) for k in TRAIN_DEFAULTS
           if k != "model_config" and hasattr(args, k)}
    if getattr(args, "model_config", None):
        cfg["model_config"] = _model_config_from_pairs(args.model_config)
    return _validate_train_config(cfg, "command line")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if k == "model_config":
            out[k] = {**out.get(k, {}), **v}
        else:
            out[k] = v
    return out


def resolve_train_config(args) -> dict:
    """Defaults, then ``RUN/config.yaml`` (with ``--resume``), then ``--config FILE``,
    then the flags; ``val_data`` replaces ``val_fraction``."""
    flags = _flag_config(args)
    from_file = load_config_file(args.config) if getattr(args, "config", None) else {}
    if "val_data" in from_file and "val_fraction" in from_file and from_file["val_data"]:
        raise CLIError(f"{args.config}: give val_fraction or val_data, not both")
    cfg = dict(TRAIN_DEFAULTS, model_config={})
    out = flags.get("out", from_file.get("out", cfg["out"]))
    levels = [from_file, flags]
    if getattr(args, "resume", False) and (Path(out) / RUN_CONFIG).is_file():
        levels.insert(0, load_config_file(Path(out) / RUN_CONFIG))
    val = {"val_fraction": cfg["val_fraction"], "val_data": None}
    for level in levels:
        cfg = _merge(cfg, level)
        # The highest level that says how to validate decides (val_data or val_fraction).
        if level.get("val_data"):
            val = {"val_fraction": None, "val_data": level["val_data"]}
        elif level.get("val_fraction") is not None:
            val = {"val_fraction": level["val_fraction"], "val_data": None}
    cfg.update(val)
    missing = [k for k in ("data", "inputs", "targets") if cfg.get(k) is None]
    if missing:
        hint = {"data": "--data DIR", "inputs": '--inputs a,b (or --inputs "" for '
                "geometry-only problems)", "targets": "--targets u"}
        raise CLIError("train: missing " + "; ".join(hint[k] for k in missing)
                       + " (on the command line or in --config)")
    if not cfg["targets"]:
        raise CLIError("train: --targets needs at least one field name")
    both = sorted(set(cfg["inputs"]) & set(cfg["targets"]))
    if both:
        raise CLIError(f"train: field(s) {both} are both inputs and targets")
    return cfg


def load_folder(root, inputs: Sequence[str], targets: Sequence[str], dtype,
                desc: str = "reading") -> tuple[list, list, dict, int]:
    """Read every mesh of a folder as a lean training sample.

    Returns ``(files, samples, field_shapes, pos_dim)``; the samples carry ``pos``,
    ``weight``, ``x``, ``y`` and ``source``. Field shapes and the spatial
    dimension must agree across the files (the error names the first that
    disagrees). Input and target values must be finite (checked by
    :class:`~meshops.datasets.MeshFolderDataset`), and a mesh whose targets are
    zero everywhere is refused: the relative L2 loss is undefined for it.
    """
    import torch

    from meshops.datasets import MeshFolderDataset
    from meshops.data import MeshData
    from meshops.training.loss import lp_norms, zero_target

    ds = MeshFolderDataset(root, inputs=inputs, targets=targets, dtype=dtype)
    names = list(inputs) + list(targets)
    samples, shapes, dim = [], None, None
    for i in _progress(range(len(ds)), desc=desc, unit="mesh", leave=False):
        s = ds[i]
        path = ds.files[i]
        sh = {k: _field_shape(s.fields[k]) for k in names}
        if shapes is None:
            shapes, dim = sh, int(s.pos.shape[1])
        else:
            for k in names:
                if sh[k] != shapes[k]:
                    raise CLIError(f"{path}: field {k!r} is {_fmt_shape(sh[k])} but it is "
                                   f"{_fmt_shape(shapes[k])} in {ds.files[0].name}")
            if int(s.pos.shape[1]) != dim:
                raise CLIError(f"{path}: the mesh is {int(s.pos.shape[1])}-D but "
                               f"{ds.files[0].name} is {dim}-D")
        y = s.y.to(torch.float64)
        zero = torch.zeros_like(y)
        if targets and bool(zero_target(lp_norms(zero, y, s.weight.to(torch.float64))[1])
                            | zero_target(lp_norms(zero, y)[1])):
            raise CLIError(f"{path}: the target field(s) {', '.join(targets)} are zero "
                           f"everywhere (or at every point of positive weight); the relative "
                           f"L2 loss and error are undefined for this mesh: leave it out of "
                           f"the training data")
        samples.append(MeshData(pos=s.pos, weight=s.weight, x=s.x, y=s.y, source=str(path)))
    return list(ds.files), samples, shapes, dim


def build_model(name: str, model_config: dict, in_channels: int, out_channels: int,
                pos_dim: int):
    """A registered model with the CLI defaults, ``model_config`` and the channels and
    dimension of the data."""
    from meshops.models import MODELS

    _load_model_modules()
    if name not in MODELS:
        raise CLIError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    cls = MODELS[name]
    params = inspect.signature(cls.__init__).parameters
    accepted = {k for k, p in params.items() if k != "self"
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    open_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    inferred = {"in_channels": in_channels, "out_channels": out_channels, "pos_dim": pos_dim}
    for key, value in model_config.items():
        if key in inferred:
            if value != inferred[key]:
                raise CLIError(f"model_config: {key} = {value!r} but the data has "
                               f"{inferred[key]} (it is set from the data; leave it out)")
        elif key not in accepted and not open_kw:
            close = difflib.get_close_matches(key, sorted(accepted - set(INFERRED)), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CLIError(f"model_config: unknown key {key!r} for model {name!r}{hint}; "
                           f"valid keys: {', '.join(sorted(accepted - set(INFERRED)))}")
    kwargs = {**CLI_MODEL_DEFAULTS.get(name, {}), **model_config}
    kwargs.update({k: v for k, v in inferred.items() if k in accepted or open_kw})
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CLIError(f"model {name!r} with {model_config or 'the default config'}: {e}") \
            from None


def _split(n: int, cfg: dict) -> tuple[list[int], list[int]]:
    """Deterministic train/validation indices from the seed."""
    from meshops.training.splits import validation_split

    try:
        return validation_split(n, cfg["val_fraction"] or 0.0, cfg["seed"])
    except ValueError as e:
        raise CLIError(f"{cfg['data']}: {e}; add files, pass --val-data DIR or "
                       f"--val-fraction 0") from None


def _public_config(cfg: dict, model) -> dict:
    """The resolved config as written to ``RUN/config.yaml`` (and printed by
    ``--dry-run``): every option, with the model's full hyperparameters."""
    out = {k: cfg[k] for k in TRAIN_DEFAULTS}
    out["model_config"] = {k: v for k, v in dict(model.config).items()}
    return out


def _plain(v):
    """YAML-safe plain data (tuples as lists, paths and other objects as strings)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _dump_yaml(cfg: dict) -> str:
    import yaml

    return yaml.safe_dump(_plain(cfg), sort_keys=False, default_flow_style=False)


def _check_writable_folder(out: Path) -> None:
    """Create the run folder and a file in it, so that an ``--out`` that cannot be
    written (read-only, under a file, under ``/proc``) fails with one line before
    training rather than with a traceback after the first epoch. Called once the
    data has been read and checked: bad data leaves no run folder behind."""
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".meshops-write-check.", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CLIError(f"{out}: cannot write the run folder ({_os_reason(e)})") from None


def _os_reason(e: OSError) -> str:
    """``strerror: filename`` of an OSError (its str() repeats the errno)."""
    reason = e.strerror or str(e)
    return f"{reason}: {e.filename}" if e.filename is not None else reason


def _cmd_train(args) -> int:
    import torch

    from meshops._atomic import atomic_write
    from meshops.training import RelativeLpLoss, Trainer
    from meshops.training.defaults import fill_epochs, fill_from_data
    from meshops.training.seed import seed_everything

    cfg = resolve_train_config(args)
    main_rank = _is_main_rank()
    out = Path(cfg["out"])
    if not args.dry_run and not args.resume and (out / "last.pt").exists():
        raise CLIError(f"{out}: already holds a training run (last.pt); pass --resume to "
                       f"continue it or choose another --out")
    if args.resume and (out / "last.pt").is_file():
        # Before the data is read and before config.yaml is rewritten: a resume the
        # Trainer would refuse (a damaged last.pt, another epoch count under a
        # learning-rate schedule) must leave the run folder as it was.
        try:
            state = Trainer.read_state(out / "last.pt")
            Trainer.check_resume_epochs(out / "last.pt", state["training"], cfg["epochs"],
                                        cfg["scheduler"] is not None)
        except (CheckpointError, ValueError) as e:
            raise CLIError(str(e)) from None
        del state
    # Before anything draws a random number: the model's initial weights (built
    # below) then depend on the seed alone, not on what ran before in the process.
    # The Trainer seeds again (seed + rank) for dropout and the data order.
    seed_everything(cfg["seed"])
    dtype = getattr(torch, cfg["dtype"])

    files, samples, shapes, dim = load_folder(cfg["data"], cfg["inputs"], cfg["targets"],
                                              dtype, desc="reading data")
    if cfg["val_data"]:
        val_files, val_samples, val_shapes, val_dim = load_folder(
            cfg["val_data"], cfg["inputs"], cfg["targets"], dtype, desc="reading val data")
        for k, sh in shapes.items():
            if val_shapes[k] != sh:
                raise CLIError(f"{val_files[0]}: field {k!r} is {_fmt_shape(val_shapes[k])} "
                               f"but {_fmt_shape(sh)} in {files[0]}")
        if val_dim != dim:
            raise CLIError(f"{val_files[0]}: the mesh is {val_dim}-D but {files[0]} is {dim}-D")
        train_idx, train_samples = list(range(len(files))), samples
        val_idx = []
    else:
        train_idx, val_idx = _split(len(files), cfg)
        train_samples = [samples[i] for i in train_idx]
        val_samples = [samples[i] for i in val_idx] or None
        val_files = [files[i] for i in val_idx]
    c_in = sum(_channels(shapes[k]) for k in cfg["inputs"])
    c_out = sum(_channels(shapes[k]) for k in cfg["targets"])
    # Options nobody set come from the data; a resumed run's config.yaml sets them all.
    chosen = [fill_from_data(cfg, train_samples)]
    model = build_model(cfg["model"], cfg["model_config"], c_in, c_out, dim)
    if dtype == torch.float64:
        model = model.double()
    # The epoch count fitted to --minutes from one timed step is printed and saved in
    # config.yaml; the run then trains exactly that many epochs (no wall-clock stop), so
    # that `--epochs N` with the same seed repeats it bit for bit.
    chosen.append(fill_epochs(cfg, model, train_samples, len(val_samples or [])))
    chosen = "; ".join(c for c in chosen if c)
    resolved = _public_config(cfg, model)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    summary = (f"{cfg['model']} ({n_params:,} parameters) on {len(train_samples)} meshes of "
               f"{cfg['data']}, validating on "
               + (f"{len(val_samples)}" if val_samples else "none")
               + f"; inputs {', '.join(cfg['inputs']) or '(none: geometry only)'} "
               f"({_plural(c_in, 'channel')}) -> targets {', '.join(cfg['targets'])} "
               f"({_plural(c_out, 'channel')}), "
               f"{dim}-D")
    if args.dry_run:
        if main_rank:
            print(_dump_yaml(resolved), end="")
            if chosen:
                print(f"# defaults from the data: {chosen}", file=sys.stderr)
            print(f"# {summary}", file=sys.stderr)
        return 0

    metadata = {
        "inputs": list(cfg["inputs"]), "targets": list(cfg["targets"]),
        "field_shapes": shapes, "in_channels": c_in, "out_channels": c_out, "pos_dim": dim,
        "data": str(cfg["data"]),
        "split": {"train": [Path(files[i]).name for i in train_idx],
                  "val": [Path(f).name for f in val_files]},
    }
    _check_writable_folder(out)
    if main_rank:
        atomic_write(out / RUN_CONFIG, lambda tmp: Path(tmp).write_text(_dump_yaml(resolved)))
        if chosen:
            print(f"defaults from the data: {chosen}")
        print(f"training {summary}; writing {out}/")
    trainer = Trainer(
        model, train_samples, val_samples, epochs=cfg["epochs"], batch_size=cfg["batch_size"],
        lr=cfg["lr"], weight_decay=cfg["weight_decay"], scheduler=cfg["scheduler"],
        grad_clip=cfg["grad_clip"], loss=RelativeLpLoss(quadrature=cfg["quadrature_loss"]),
        seed=cfg["seed"], device=cfg["device"], out_dir=out, resume=args.resume,
        metadata=metadata, progress=sys.stderr.isatty(), log=print)
    try:
        history = trainer.fit()
    except FloatingPointError as e:
        raise CLIError(str(e)) from None
    except CheckpointError as e:  # a damaged, truncated or malicious RUN/last.pt
        raise CLIError(str(e)) from None
    except ValueError as e:
        if not args.resume:
            raise
        # e.g. RUN/last.pt was saved for another model config
        raise CLIError(str(e)) from None
    if trainer.dist.is_main:
        if val_samples is None:
            # No validation data: best.pt is the final model, so that predict/evaluate
            # find it in the usual place.
            model.save(out / RUN_CHECKPOINT, **metadata, epoch=trainer.epoch,
                       metric=None, val=None, selected="last epoch (no validation data)")
            print(f"no validation data: {out / RUN_CHECKPOINT} is the model after epoch "
                  f"{trainer.epoch}")
        elif history:
            best = trainer.best
            print(f"best validation {trainer.metric} {best['value']:.4e} at epoch "
                  f"{best['epoch']}: {out / RUN_CHECKPOINT}")
    return 0


# ===================================================================== load a run
def load_run(run, device: str | None = None):
    """The model of a run folder (``RUN/best.pt``) or a checkpoint file, with its
    path and metadata."""
    from meshops.models import NeuralOperator

    _load_model_modules()
    run = Path(run)
    if run.is_dir():
        ckpt = run / RUN_CHECKPOINT
        if not ckpt.is_file():
            hint = (f"; {run / 'last.pt'} holds the latest epoch"
                    if (run / "last.pt").is_file() else "")
            raise CLIError(f"{run}: no {RUN_CHECKPOINT} in this run folder{hint}")
    elif run.is_file():
        ckpt = run
    else:
        raise CLIError(f"{run}: no such run folder or checkpoint")
    try:
        model = NeuralOperator.from_checkpoint(ckpt, map_location=device or _default_device())
    except CheckpointError as e:  # damaged, truncated, malicious, inconsistent: names the file
        raise CLIError(str(e)) from None
    except (FileNotFoundError, ValueError, KeyError, RuntimeError, TypeError) as e:
        raise CLIError(f"{ckpt}: cannot load the model ({e})") from None
    meta = dict(getattr(model, "metadata", {}) or {})
    _check_run_metadata(meta, dict(getattr(model, "config", {}) or {}), ckpt)
    return model, ckpt, meta


def _check_run_metadata(meta: dict, config: dict, ckpt: Path) -> None:
    """The metadata ``meshops train`` records (field names and shapes, channels,
    dimension) has the right types and agrees with itself and with the model's
    config; :class:`RunSpec` then relies on it."""
    def fail(what: str):
        raise CLIError(f"{ckpt}: inconsistent metadata: {what}")

    for role in ("inputs", "targets"):
        names = meta.get(role)
        if names is not None and (not isinstance(names, list)
                                  or not all(isinstance(n, str) and n for n in names)):
            fail(f"{role} is {names!r}, not a list of field names")
    for key in ("in_channels", "out_channels", "pos_dim"):
        if key not in meta:
            continue
        v = meta[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            fail(f"{key} is {v!r}, not a channel count")
        if key in config and config[key] != v:
            fail(f"{key} is {v} but the model's config has {config[key]!r}")
    shapes = meta.get("field_shapes")
    if shapes is None:
        return
    if not isinstance(shapes, dict) or not all(
            isinstance(sh, list) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                         for n in sh) for sh in shapes.values()):
        fail(f"field_shapes is {shapes!r}, not a mapping of field name to shape")
    absent = [n for role in ("inputs", "targets") for n in (meta.get(role) or [])
              if n not in shapes]
    if absent:
        fail(f"field(s) {', '.join(absent)} have no entry in field_shapes "
             f"({', '.join(shapes) or 'empty'})")


class RunSpec:
    """What a checkpoint expects of the data: input/target names and shapes,
    channel counts and the spatial dimension."""

    def __init__(self, model, ckpt: Path, meta: dict, inputs=None, targets=None) -> None:
        cfg = dict(getattr(model, "config", {}) or {})
        self.ckpt = ckpt
        self.dtype = next(model.parameters()).dtype
        self.in_channels = int(cfg.get("in_channels", meta.get("in_channels", 0)))
        self.out_channels = int(cfg.get("out_channels", meta.get("out_channels", 1)))
        self.pos_dim = cfg.get("pos_dim", meta.get("pos_dim"))
        self.shapes = {k: list(v) for k, v in (meta.get("field_shapes") or {}).items()}
        for role, given in (("inputs", inputs), ("targets", targets)):
            saved = meta.get(role)
            if given is not None and saved is not None and list(given) != list(saved):
                raise CLIError(f"{ckpt}: the model was trained with {role} "
                               f"{','.join(saved) or '(none)'}, not {','.join(given) or '(none)'}")
            value = list(saved) if saved is not None else given
            if value is None:
                raise CLIError(f"{ckpt}: the checkpoint does not record its {role} (it was not "
                               f"saved by meshops train); pass --{role}")
            setattr(self, role, list(value))
        if not self.shapes:  # a checkpoint without shapes: one channel per field if it fits
            for role, total in (("inputs", self.in_channels), ("targets", self.out_channels)):
                names = getattr(self, role)
                if len(names) == 1:
                    self.shapes[names[0]] = [] if total == 1 else [total]
                elif len(names) == total:
                    self.shapes.update({k: [] for k in names})
                else:
                    raise CLIError(f"{ckpt}: {len(names)} {role} for {total} channels; "
                                   f"cannot tell the channels of each field")
        c_in = sum(_channels(self.shapes[k]) for k in self.inputs)
        c_out = sum(_channels(self.shapes[k]) for k in self.targets)
        if (c_in, c_out) != (self.in_channels, self.out_channels):
            raise CLIError(f"{ckpt}: inputs {self.inputs} / targets {self.targets} give "
                           f"{c_in}/{c_out} channels but the model has "
                           f"{self.in_channels}/{self.out_channels}")

    def describe(self) -> str:
        return (f"inputs {', '.join(self.inputs) or '(none)'} -> targets "
                f"{', '.join(self.targets)}")

    def check_mesh(self, mesh, path, roles=("inputs",)) -> None:
        """The mesh has the fields (with the shapes and finite values) and the
        dimension the model expects."""
        from meshops.training.dataset import check_finite_fields

        fields = getattr(mesh, "fields", None) or {}
        for role in roles:
            for name in getattr(self, role):
                if name not in fields:
                    raise CLIError(
                        f"{path}: {role[:-1]} field {name!r} not found (the model in "
                        f"{self.ckpt} needs {self.describe()}); available point fields: "
                        f"{_available(mesh)}")
                sh = _field_shape(fields[name])
                if sh != self.shapes[name]:
                    raise CLIError(f"{path}: field {name!r} is {_fmt_shape(sh)} but the model in "
                                   f"{self.ckpt} was trained on {_fmt_shape(self.shapes[name])}")
            # A NaN/inf input would spread to every predicted value (global attention).
            # Inputs are cast to the model's dtype: 1e300 is finite in the file but inf
            # in float32.
            check_finite_fields(fields, getattr(self, role), path, role[:-1],
                                self.dtype if role == "inputs" else None)
        d = int(mesh.pos.shape[1])
        if self.pos_dim is not None and d != int(self.pos_dim):
            raise CLIError(f"{path}: the mesh is {d}-D but the model in {self.ckpt} was trained "
                           f"on {self.pos_dim}-D meshes")

    def split(self, out) -> dict:
        """Model output ``[N, C_out]`` -> ``{target: [N] or [N, c]}``."""
        res, c = {}, 0
        n = out.shape[0]
        for name in self.targets:
            shape = self.shapes[name]
            k = _channels(shape)
            res[name] = out[:, c:c + k].reshape(n, *shape)
            c += k
        return res


def predict_mesh(model, spec: RunSpec, mesh):
    """``model.predict`` on one mesh: ``[N, C_out]`` in the model's dtype."""
    import torch

    from meshops.data import MeshData

    param = next(model.parameters())
    n = int(mesh.pos.shape[0])
    cols = [mesh.fields[k].reshape(n, -1).to(torch.float64) for k in spec.inputs]
    x = torch.cat(cols, 1) if cols else torch.zeros(n, 0, dtype=torch.float64)
    data = MeshData(pos=mesh.pos.to(param.dtype), weight=mesh.weight.to(param.dtype),
                    x=x.to(param.dtype)).to(param.device)
    return model.predict(data).cpu()


# ========================================================================== predict
def _mesh_files(paths: Sequence[str]) -> list[Path]:
    from meshops.datasets import list_mesh_files

    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = list_mesh_files(p)
            if not found:
                raise CLIError(f"{p}: no mesh files in this folder")
            out += found
        else:
            out.append(p)
    return out


def _suffix(fmt: str | None, path: Path) -> str:
    if not fmt:
        return path.suffix
    return fmt if fmt.startswith(".") else "." + fmt


def _cmd_predict(args) -> int:
    import torch

    from meshops.io import read_mesh, write_mesh

    model, ckpt, meta = load_run(args.run, args.device)
    spec = RunSpec(model, ckpt, meta, _opt_names(args.inputs), _opt_names(args.targets))
    files = _mesh_files(args.meshes)
    out_dir = Path(args.output)
    targets = {}
    for f in files:
        dest = out_dir / (f.stem + _suffix(args.format, f))
        if dest.resolve() == f.resolve():
            raise CLIError(f"{f}: the output would overwrite the input; choose another -o "
                           f"folder or --format")
        if dest in targets.values():
            raise CLIError(f"{f}: two inputs would both be written to {dest}")
        targets[f] = dest
    written = []
    for f in _progress(files, desc="predicting", unit="mesh"):
        mesh = read_mesh(f)
        spec.check_mesh(mesh, f)
        out = predict_mesh(model, spec, mesh)
        bad = (~torch.isfinite(out)).nonzero()
        if bad.numel():  # the inputs are finite (checked above): the model is at fault
            raise CLIError(f"{f}: the model in {spec.ckpt} predicts a non-finite value "
                           f"({out[bad[0, 0], bad[0, 1]].item()}) at point {int(bad[0, 0])} "
                           f"although the inputs are finite; nothing written for this file")
        pred = spec.split(out)
        written.append(write_mesh(targets[f], mesh,
                                  point_data={f"{k}_pred": v for k, v in pred.items()}))
    fields = ", ".join(f"{k}_pred" for k in spec.targets)
    print(f"wrote {len(written)} file(s) with {fields} to {out_dir}/")
    return 0


def _opt_names(value) -> list[str] | None:
    return None if value is None else _names(value, "--inputs/--targets")


# ========================================================================= evaluate
def _stats(values, files) -> dict:
    """Mean, median and worst of per-sample errors over the samples where they are
    defined (NaN: relative error against an all-zero target), with the count and
    names of the others (``n``, ``undefined``)."""
    from meshops.training.loss import summarize_errors

    return summarize_errors(values, files)


def _json_number(v):
    """NaN (undefined) as null: JSON has no NaN."""
    return None if isinstance(v, float) and math.isnan(v) else v


def _training_samples(meta: dict, spec: RunSpec):
    """The run's training samples (``meta["data"]``, files ``meta["split"]["train"]``)
    in float64, or ``(None, why not)``."""
    import torch

    from meshops.datasets import MeshFolderDataset
    from meshops.errors import MeshError

    root, names = meta.get("data"), (meta.get("split") or {}).get("train")
    if not root or not names:
        return None, "n/a: the checkpoint does not record its training files"
    if not Path(root).is_dir():
        return None, f"n/a: the training data {root} is not here"
    try:
        ds = MeshFolderDataset(root, inputs=spec.inputs, targets=spec.targets,
                               dtype=torch.float64)
        index = {Path(f).name: i for i, f in enumerate(ds.files)}
        missing = [n for n in names if n not in index]
        if missing:
            return None, (f"n/a: {len(missing)} training file(s) are no longer in {root} "
                          f"(e.g. {missing[0]})")
        return [ds[index[n]] for n in names], ""
    except (MeshError, OSError, ValueError, KeyError) as e:
        return None, f"n/a: cannot read the training data {root} ({e})"


def _baseline_report(train, note: str, tests: list, names: list, slices: dict) -> dict:
    """Both baselines of :mod:`meshops.training.baselines` on the evaluated samples, per
    target field (``slices``) and metric, as ``{name: {"note", field: {metric: stats}}}``."""
    import torch

    from meshops.training.baselines import baselines
    from meshops.training.loss import sample_errors

    if train is None:
        return {"training mean": {"note": note}, "nearest training sample": {"note": note}}
    out = {}
    for b in baselines(train, tests):
        out[b.name] = entry = {"note": b.note}
        if not b.available:
            continue
        for key, sl in slices.items():
            per = [sample_errors(p[:, sl].to(torch.float64), t.y[:, sl].to(torch.float64),
                           t.weight.to(torch.float64)) for p, t in zip(b.predictions, tests)]
            entry[key] = {m: _stats([v[m] for v in per], names) for m in _METRICS}
    return out


# The per-sample errors that evaluate reports (sample_errors), for the model and the
# baselines alike.
_METRICS = ("l2", "l2_unweighted", "abs_l2")
_METRIC_LABELS = (("l2", "rel. L2 (quad)"), ("l2_unweighted", "rel. L2 (plain)"),
                  ("abs_l2", "abs. L2 (quad)"))


def _cmd_evaluate(args) -> int:
    import torch

    from meshops.datasets import MeshFolderDataset
    from meshops.training.loss import sample_errors

    model, ckpt, meta = load_run(args.run, args.device)
    spec = RunSpec(model, ckpt, meta, _opt_names(args.inputs), _opt_names(args.targets))
    ds = MeshFolderDataset(args.data, inputs=spec.inputs, targets=spec.targets,
                           dtype=torch.float64)
    names = [Path(f).name for f in ds.files]
    keys = list(spec.targets) + (["all"] if len(spec.targets) > 1 else [])
    errs = {k: {m: [] for m in _METRICS} for k in keys}
    per_sample, tests = [], []
    for i in _progress(range(len(ds)), desc="evaluating", unit="mesh"):
        s = ds[i]
        tests.append(s)
        spec.check_mesh(s, ds.files[i], roles=("inputs", "targets"))
        pred = predict_mesh(model, spec, s).to(torch.float64)
        truth = s.y.to(torch.float64)
        w = s.weight.to(torch.float64)
        row, c = {"file": names[i]}, 0
        slices = {}
        for name in spec.targets:
            k = _channels(spec.shapes[name])
            slices[name] = slice(c, c + k)
            c += k
        if "all" in keys:
            slices["all"] = slice(0, c)
        for key, sl in slices.items():
            values = sample_errors(pred[:, sl], truth[:, sl], w)
            for m, v in values.items():
                errs[key][m].append(v)
            row[key] = {m: _json_number(v) for m, v in values.items()}
            if math.isnan(values["l2"]) or math.isnan(values["l2_unweighted"]):
                # undefined, not huge: say so once per file and target
                print(f"meshops: warning: {ds.files[i]}: target {key!r} is zero everywhere; "
                      f"its relative L2 error is undefined and left out of the relative "
                      f"statistics (absolute L2 error {values['abs_l2']:.4e})", file=sys.stderr)
        per_sample.append(row)
    result = {
        "checkpoint": str(ckpt), "model": model.model_name, "data": str(args.data),
        "n": len(ds), "inputs": spec.inputs, "targets": spec.targets,
        "fields": {k: {m: _stats(v, names) for m, v in errs[k].items()} for k in keys},
        "samples": per_sample,
    }
    train_names = set((meta.get("split") or {}).get("train", []))
    overlap = sorted(set(names) & train_names) if Path(args.data).resolve() == \
        Path(str(meta.get("data", ""))).resolve() else []
    if overlap:
        result["note"] = (f"{len(overlap)} of the {len(names)} files were in the training "
                          f"split of this run")
    if not args.no_baselines and tests:
        result["baselines"] = _baseline_report(*_training_samples(meta, spec), tests, names,
                                               slices)
    if args.plot:
        from meshops.plot import plot_comparisons

        main = "all" if "all" in keys else spec.targets[0]
        stats = result["fields"][main]["l2"]
        if stats["worst_sample"] is None:  # no defined relative error: rank by absolute
            stats = result["fields"][main]["abs_l2"]
        picks = [("median", names.index(stats["median_sample"])),
                 ("worst", names.index(stats["worst_sample"]))]
        items = []
        for label, i in picks:
            s = ds[i]
            pred = spec.split(predict_mesh(model, spec, s).to(torch.float64))
            truth = spec.split(s.y.to(torch.float64))
            for name in spec.targets:
                items.append((s, truth[name].numpy(), pred[name].numpy(),
                              f"{label}: {names[i]}", name))
        plot_comparisons(items, args.plot,
                         title=f"{ckpt} on {args.data}: median and worst samples "
                               f"(of {len(ds)})")
        result["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{ckpt} ({model.model_name}) on {args.data}: {len(ds)} meshes, "
          f"{spec.describe()}")
    print(f"{'field':<12} {'error':<16} {'mean':>10} {'median':>10} {'worst':>10}  "
          f"worst sample")
    fmt = lambda v: f"{v:>10.4e}" if v is not None else f"{'undefined':>10}"  # noqa: E731
    for key in keys:
        for metric, label in _METRIC_LABELS:
            st = result["fields"][key][metric]
            print(f"{key:<12} {label:<16} {fmt(st['mean'])} {fmt(st['median'])} "
                  f"{fmt(st['max'])}  {st['worst_sample'] or '-'}")
        undefined = result["fields"][key]["l2"]["undefined"]
        if undefined:
            print(f"note: {key}: the relative L2 error is undefined for {len(undefined)} of "
                  f"{len(ds)} meshes (target zero everywhere: "
                  f"{', '.join(undefined[:5])}{', ...' if len(undefined) > 5 else ''}); the "
                  f"relative statistics are over the other {len(ds) - len(undefined)}")
    for name, entry in result.get("baselines", {}).items():
        print(f"baseline: {name}: {entry['note']}")
        for key in keys:
            for metric, label in _METRIC_LABELS:
                if key in entry:
                    st = entry[key][metric]
                    print(f"{key:<12} {label:<16} {fmt(st['mean'])} {fmt(st['median'])} "
                          f"{fmt(st['max'])}  {st['worst_sample'] or '-'}")
    if "note" in result:
        print(f"note: {result['note']}")
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


# ============================================================================= plot
def _cmd_plot(args) -> int:
    from meshops.io import read_mesh
    from meshops.plot import plot_comparison, plot_comparisons, plot_fields

    mesh = read_mesh(args.mesh)
    fields = getattr(mesh, "fields", None) or {}

    def get(name):
        if name not in fields:
            raise CLIError(f"{args.mesh}: point field {name!r} not found; available point "
                           f"fields: {_available(mesh)}")
        v = fields[name]
        if args.component is not None:
            n = v.shape[0]
            flat = v.reshape(n, -1)
            if not 0 <= args.component < flat.shape[1]:
                raise CLIError(f"{args.mesh}: field {name!r} has {flat.shape[1]} component(s); "
                               f"--component {args.component} is out of range")
            v = flat[:, args.component]
        return v

    suffix = f"[{args.component}]" if args.component is not None else ""
    title = args.title if args.title is not None else Path(args.mesh).name
    if args.truth or args.pred:
        if not (args.truth and args.pred):
            raise CLIError("plot: --truth and --pred go together")
        plot_comparison(mesh, get(args.truth), get(args.pred), args.output,
                        name=args.truth + suffix, title=title)
    else:
        if not args.field:
            raise CLIError("plot: give --field NAME[,NAME...] or --truth NAME --pred NAME")
        names = _names(args.field, "--field")
        pairs = [f"{n}_pred" in fields for n in names]
        if all(pairs) and not args.no_compare:
            if len(names) == 1:
                plot_comparison(mesh, get(names[0]), get(f"{names[0]}_pred"), args.output,
                                name=names[0] + suffix, title=title)
            else:
                plot_comparisons([(mesh, get(n), get(f"{n}_pred"), None, n + suffix)
                                  for n in names],
                                 args.output, title=title)
        else:
            plot_fields(mesh, [get(n) for n in names], [n + suffix for n in names],
                        args.output, suptitle=title)
    print(f"wrote {args.output}")
    return 0


# =========================================================================== parser
_FMT = argparse.RawDescriptionHelpFormatter


def _wrap(text: str) -> str:
    """A description paragraph wrapped for the raw formatter (which keeps the epilog's
    layout but would not wrap the description)."""
    import textwrap

    return textwrap.fill(" ".join(text.split()), 79)

TRAIN_EPILOG = """\
examples:
  # one mesh file per sample in data/ with point fields f (input) and u (target)
  meshops train --data data/ --inputs f --targets u --out runs/poisson
  meshops train --data data/ --inputs f --targets u --model transformer_no \\
      --model-config width=64 layers=2 --epochs 50 --batch-size 4 --out runs/tno
  # geometry-only problem: the input is the mesh itself
  meshops train --data elasticity/ --inputs "" --targets sigma --model pit
  # options from a file (YAML or TOML; flags override it)
  meshops train --config train.yaml --epochs 10
  # continue an interrupted run (its config.yaml is the base config)
  meshops train --out runs/poisson --resume
  # data-parallel on 4 GPUs
  torchrun --nproc_per_node=4 -m meshops train --config train.yaml

config file (train.yaml); keys are the long options (batch_size or batch-size):
  data: data/
  inputs: [f]          # or "f", or [] for geometry-only problems
  targets: [u]
  model: galerkin_transformer
  model_config: {width: 64, layers: 2}
  epochs: 50
  val_fraction: 0.2    # or val_data: val/

The run folder gets best.pt (lowest validation error; the final model without
validation data), last.pt (resumable state), history.json (per-epoch losses and
metrics) and config.yaml (the resolved config, usable as --config).
"""

PREDICT_EPILOG = """\
examples:
  meshops predict runs/poisson new/*.vtu -o predicted/
  meshops predict runs/poisson/last.pt case.msh -o predicted/ --format .vtu
  meshops plot predicted/case.vtu --field u -o case.png

Each output file is the input mesh with all its fields plus <target>_pred for
every target the model was trained on; open it in ParaView.
"""

EVALUATE_EPILOG = """\
examples:
  meshops evaluate runs/poisson --data test/
  meshops evaluate runs/poisson --data test/ --plot test.png --json > test.json

Each mesh needs the input and target fields the model was trained with, with
finite values. The relative L2 error of a sample is ||pred - truth|| / ||truth||
over the mesh, with the norms integrated with the mesh's quadrature weights
("quad") or summed over the points ("plain", the convention of published
benchmarks); the absolute L2 error is sqrt(sum_i w_i |pred_i - truth_i|^2). A
sample whose target is zero everywhere has no relative error: it is named in a
warning and left out of the relative statistics (its absolute error counts; in
the JSON output its relative errors are null). The JSON output also lists every
sample's errors.
"""

PLOT_EPILOG = """\
examples:
  meshops plot predicted/case.vtu --field u -o case.png        # u vs u_pred, error
  meshops plot case.vtu --truth u --pred u_fem -o cmp.png
  meshops plot case.vtu --field f,u -o fields.png               # side by side
  meshops plot case.vtu --field velocity --component 0 -o vx.png

2-D meshes are coloured on their cells (quads split into 2 triangles); point
clouds are Delaunay-triangulated with triangles masked whose longest edge is
more than 3x the local point spacing (so holes stay empty). 3-D surface meshes
are drawn as coloured surfaces, volume meshes and 3-D clouds as point scatters.
Vector fields are shown as their magnitude unless --component is given.
"""


# ====================================================================== build-kernels
def _cmd_build_kernels(args) -> int:
    """Compile the fused CPU attention kernel into its cache now, not at a first forward."""
    from meshops.kernels import (KernelBuildError, attention_kernel, build_attention_kernel,
                                 kernels_enabled)
    from meshops.kernels.build import load_module

    try:
        built = build_attention_kernel(force=args.force)
        load_module(attention_kernel().name, built.path)  # one that will not load is no build
    except KernelBuildError as err:
        raise CLIError(f"cannot build the fused CPU attention kernel: {err}") from None
    how = "already built" if built.seconds is None else f"built in {built.seconds:.0f} s"
    print(f"fused CPU attention kernel: {built.path} ({how})")
    if not kernels_enabled():
        print("meshops: note: MESHOPS_KERNELS is off in this environment, so the layers will "
              "not use it", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshops", description="Mesh-agnostic neural operators on unstructured meshes.",
        epilog="Run 'meshops COMMAND --help' for the options and examples of a command.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("info", help="summarise mesh files (points, cells, measure, fields)",
                       description="Read mesh files (any meshio format) and print points, "
                       "dimension, cell counts by type, total measure (sum of quadrature "
                       "weights), bounding box and point fields.")
    p.add_argument("files", nargs="+", metavar="FILE", help="mesh file(s)")
    p.add_argument("--json", action="store_true", help="one JSON object per file")
    p.set_defaults(func=_cmd_info)

    S = argparse.SUPPRESS  # absent options stay absent, so a config file can set them
    p = sub.add_parser(
        "train", help="train a neural operator on a folder of meshes",
        description=_wrap("Train a neural operator on a folder with one mesh file per sample "
        "(any meshio format: .vtu, .vtk, .msh, .xdmf, ...), input and target fields in "
        "the point data. The files are split into training and validation sets "
        "deterministically from --seed; normalisers are fitted on the training split "
        "only; the loss is the relative L2 error in physical units."),
        epilog=TRAIN_EPILOG, formatter_class=_FMT, argument_default=S)
    p.add_argument("--config", metavar="FILE", default=None,
                   help="YAML or TOML file of options (the long option names); command-line "
                   "flags override it; unknown keys are an error")
    g = p.add_argument_group("data")
    g.add_argument("--data", metavar="DIR", help="folder of training meshes")
    g.add_argument("--inputs", metavar="A,B",
                   help='input point fields, comma-separated; "" for geometry-only problems')
    g.add_argument("--targets", metavar="U,V", help="target point fields, comma-separated")
    v = g.add_mutually_exclusive_group()
    v.add_argument("--val-fraction", type=float, metavar="F", dest="val_fraction",
                   help="fraction of the files held out for validation (default 0.2; 0: none)")
    v.add_argument("--val-data", metavar="DIR", dest="val_data",
                   help="folder of validation meshes (instead of a split of --data)")
    g = p.add_argument_group("model")
    g.add_argument("--model", metavar="NAME",
                   help="transformer_no, galerkin_transformer, patched_transformer or pit "
                   "(default pit)")
    g.add_argument("--model-config", nargs="+", action="extend", metavar="KEY=VALUE",
                   dest="model_config",
                   help="model hyperparameters, e.g. width=64 layers=2 heads=4 (defaults: "
                   "the model's; in/out channels and pos_dim come from the data)")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=int, metavar="N",
                   help="epochs (default: as many as fit --minutes, from a timed step)")
    g.add_argument("--minutes", type=float, metavar="M",
                   help="wall-clock budget that sets the default epoch count (default 10)")
    g.add_argument("--batch-size", type=int, metavar="B", dest="batch_size",
                   help="meshes per step (per process under torchrun; default from the "
                        "data: 4 for a parametric map on one mesh, else 8)")
    g.add_argument("--lr", type=float, help="learning rate (default from the data: 3e-3 for "
                                            "a parametric map on one mesh, else 1e-3)")
    g.add_argument("--weight-decay", type=float, dest="weight_decay", metavar="W",
                   help="AdamW weight decay (default 1e-4)")
    g.add_argument("--scheduler", choices=["cosine", "onecycle", "none"],
                   help="learning-rate schedule (default cosine)")
    g.add_argument("--grad-clip", type=float, dest="grad_clip", metavar="NORM",
                   help="clip the gradient norm (default off)")
    g.add_argument("--quadrature-loss", action=argparse.BooleanOptionalAction,
                   dest="quadrature_loss",
                   help="weight the relative L2 loss with the mesh quadrature (default); "
                   "--no-quadrature-loss: plain per-point norms as in published benchmarks")
    g.add_argument("--seed", type=int, metavar="N", help="seed of the split, the initial weights, "
                   "the data order and dropout: one seed, one result on one machine (default 0)")
    g.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    g.add_argument("--dtype", choices=["float32", "float64"], help="default float32")
    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="RUN", help="run folder (default ./run)")
    g.add_argument("--resume", action="store_true", default=False,
                   help="continue RUN from RUN/last.pt (with RUN/config.yaml as the base "
                   "config); under a learning-rate schedule --epochs must stay the run's")
    g.add_argument("--dry-run", action="store_true", default=False, dest="dry_run",
                   help="read the data, print the resolved config (YAML) and exit")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "predict", help="predict on meshes and write them with <target>_pred fields",
        description=_wrap("Load a trained model (RUN/best.pt, or a .pt file), predict on "
        "each mesh and write it to OUTDIR with the predicted fields added as "
        "<target>_pred, in the input's format (or --format)."), epilog=PREDICT_EPILOG, formatter_class=_FMT)
    p.add_argument("run", metavar="RUN", help="run folder (uses best.pt) or checkpoint file")
    p.add_argument("meshes", nargs="+", metavar="MESH", help="mesh files or folders of them")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="output folder")
    p.add_argument("--format", metavar=".EXT", help="output format by suffix, e.g. .vtu")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--inputs", help="input fields, for checkpoints that do not record them")
    p.add_argument("--targets", help="target names, for checkpoints that do not record them")
    p.set_defaults(func=_cmd_predict)

    p = sub.add_parser(
        "evaluate", help="relative L2 errors of a trained model on a folder of meshes",
        description=_wrap("Predict on every mesh of DIR and print the relative L2 error "
        "per target field (mean, median, worst sample), quadrature-weighted and "
        "unweighted, next to two baselines that need no training, on the same meshes "
        "and metric: the mean of the training targets (when all meshes are one fixed "
        "mesh or structured grids of one shape) and the targets of the nearest "
        "training sample (by the mean of each input field, or by the geometry when the "
        "model has no inputs)."),
        epilog=EVALUATE_EPILOG, formatter_class=_FMT)
    p.add_argument("run", metavar="RUN", help="run folder (uses best.pt) or checkpoint file")
    p.add_argument("--data", required=True, metavar="DIR", help="folder of meshes with the "
                   "input and target fields")
    p.add_argument("--plot", metavar="FILE.png", help="save truth/prediction/error of the "
                   "median and the worst sample")
    p.add_argument("--json", action="store_true", help="print one JSON object (with the "
                   "per-sample errors)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--inputs", help="input fields, for checkpoints that do not record them")
    p.add_argument("--targets", help="target fields, for checkpoints that do not record them")
    p.add_argument("--no-baselines", action="store_true", dest="no_baselines",
                   help="skip the two baselines that need no training (the training mean "
                   "field and the nearest training sample), which read the run's training "
                   "files")
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser(
        "plot", help="picture of fields on a mesh (truth, prediction, error)",
        description=_wrap("Plot point fields of a mesh to a PNG: one field or several "
        "side by side, or truth, prediction and error with the relative L2 error."),
        epilog=PLOT_EPILOG, formatter_class=_FMT)
    p.add_argument("mesh", metavar="MESH", help="mesh file")
    p.add_argument("--field", metavar="NAME[,NAME]",
                   help="field(s) to plot; a field with a NAME_pred partner in the file "
                   "(from meshops predict) is compared with it")
    p.add_argument("--truth", metavar="NAME", help="reference field (with --pred)")
    p.add_argument("--pred", metavar="NAME", help="predicted field (with --truth)")
    p.add_argument("--no-compare", action="store_true", dest="no_compare",
                   help="plot --field as it is even if NAME_pred exists")
    p.add_argument("--component", type=int, metavar="K",
                   help="component K of vector fields (default: the magnitude)")
    p.add_argument("--title", help="figure title (default: the file name)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.png", help="output picture")
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser(
        "build-kernels", help="compile the fused CPU attention kernel ahead of time",
        description=_wrap("Compile the fused CPU attention kernel (one to three minutes) "
        "into its cache, $TORCH_EXTENSIONS_DIR/meshops (default "
        "~/.cache/torch_extensions/meshops), keyed by the source, torch version and Python "
        "ABI, so that no first forward pays for it. Prints the library's path and the time "
        "taken; exits 2 when it cannot be built. MESHOPS_KERNEL_TIMEOUT (seconds, default "
        "600) bounds the wait for another process's build and the compile."))
    p.add_argument("--force", action="store_true",
                   help="compile again even if the cache has the kernel")
    p.set_defaults(func=_cmd_build_kernels)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (MeshError, CLIError) as e:
        print(f"meshops: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        # A file the user named cannot be read or written (permissions, a full
        # disk, a folder that vanished): one line, not a traceback. A closed
        # stdout pipe (``meshops info | head``) is not an error of ours.
        if isinstance(e, BrokenPipeError):
            raise
        print(f"meshops: error: {_os_reason(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("meshops: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
