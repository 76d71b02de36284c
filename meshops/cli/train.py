"""``meshops train``: a neural operator from a folder of meshes to a run folder."""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
import sys
from pathlib import Path

from meshops.cli import train_extras, trust_reports
from meshops.cli._common import (RAW, CLIError, device_or_error, is_main_rank, os_reason,
                                 plural, wrap)
from meshops.cli.config import RUN_CONFIG, TrainConfig
from meshops.cli.lazy import data_loader, take, with_structures
from meshops.cli.provenance import changes, fingerprint, listing, same_content
from meshops.cli.run_folder import (check_out_folder, check_resume_options, clear_run_files,
                                    recorded_config)
from meshops.errors import CheckpointError, MeshError
from meshops.inference import RUN_CHECKPOINT, _channels, _fmt_shape
from meshops.layout import SampleLayout

# Set from the data, never by model_config.
INFERRED = ("in_channels", "out_channels", "pos_dim", "param_channels")


def build_model(name: str, model_config: dict, in_channels: int, out_channels: int,
                pos_dim: int, param_channels: int = 0, dtype=None, device=None):
    """A registered model (:data:`meshops.models.MODELS`) with ``model_config`` and the
    channels, dimension and parameter count of the data; a key the model does not take
    is refused, as are parameters for a model that takes none, and a model whose
    training would not fit in the memory of ``device`` (checked on the meta device,
    before anything is allocated; ``dtype``: the training dtype)."""
    from meshops._memory import module_bytes, skeleton, too_big
    from meshops.models import MODELS, count_parameters

    if name not in MODELS:
        raise CLIError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    cls = MODELS[name]
    params = inspect.signature(cls.__init__).parameters
    accepted = {k for k, p in params.items() if k != "self"
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    open_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    inferred = {"in_channels": in_channels, "out_channels": out_channels, "pos_dim": pos_dim,
                "param_channels": param_channels}
    if param_channels and "param_channels" not in accepted and not open_kw:
        raise CLIError(f"model {name!r} does not take parameter vectors (--params): it has no "
                       f"param_channels argument")
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
    kwargs = dict(model_config)
    kwargs.update({k: v for k, v in inferred.items() if k in accepted or open_kw})
    described = f"model {name!r} with {model_config or 'the default config'}"
    try:
        shapes = skeleton(lambda: cls(**kwargs))
        # weights, gradients and the two moments of AdamW
        why = too_big(4 * module_bytes(shapes, dtype), device,
                      f"training it ({count_parameters(shapes):,} parameters, 4 copies: "
                      f"weights, gradients, 2 optimiser moments)")
        if why:
            raise CLIError(f"{described}: {why}; choose a smaller model_config")
        del shapes
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{described}: {e}") from None


def _split(n: int, cfg) -> tuple[list[int], list[int]]:
    """Deterministic train/validation indices from the seed (``cfg``: a
    :class:`TrainConfig` or a mapping with ``val_fraction``, ``seed``, ``data``)."""
    from meshops.training.splits import validation_split

    try:
        return validation_split(n, cfg["val_fraction"] or 0.0, cfg["seed"])
    except ValueError as e:
        raise CLIError(f"{cfg['data']}: {e}; add files, pass --val-data DIR or "
                       f"--val-fraction 0") from None


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
        raise CLIError(f"{out}: cannot write the run folder ({os_reason(e)})") from None


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist: the data set says so when it reads it
        return False


def _check_run_folder(args, cfg: TrainConfig, out: Path) -> dict | None:
    """The checks of ``--out`` and ``--resume`` made before the data is read, so that a
    refused run leaves the folder as it was. Returns the metadata of ``last.pt`` when
    resuming a run, else ``None``."""
    from meshops.training import Trainer

    last = out / "last.pt"
    if not (args.resume and last.is_file()):
        check_out_folder(out, cfg, args.overwrite)
        return None
    try:
        state = Trainer.read_state(last)
        Trainer.check_resume_epochs(last, state["training"], cfg.epochs,
                                    cfg.scheduler is not None)
    except (CheckpointError, ValueError) as e:
        raise CLIError(str(e)) from None
    meta = dict(state.get("metadata") or {})
    # runs before the train_config record: their config.yaml
    recorded = meta.get("train_config") or recorded_config(out)
    if recorded:
        check_resume_options(cfg, recorded, args, last)
    return meta


def _check_same_data(meta: dict, cfg: TrainConfig, out: Path) -> None:
    """Refuse to resume a run whose training or validation files changed."""
    diff = changes(meta["data_files"], cfg.data)
    if cfg.val_data and meta.get("val_files") is not None:
        diff += changes(meta["val_files"], cfg.val_data)
    if diff:
        raise CLIError(f"{out / 'last.pt'}: the data behind this run changed since it was "
                       f"trained ({listing(diff)}); --resume continues on the files it was "
                       f"trained on: restore them, or start a new run with another --out")


class _RunFiles:
    """What a new run records about its data (paths, file fingerprints, split, config)
    and the preparation of its folder, shared by every model's way of training."""

    def __init__(self, cfg, files, train_idx, val_files, shapes, sizes, resumed, out,
                 main_rank, layout) -> None:
        self.cfg, self.files, self.train_idx, self.val_files = cfg, files, train_idx, val_files
        self.shapes, self.sizes, self.resumed = shapes, sizes, resumed
        self.out, self.main_rank, self.layout = out, main_rank, layout

    def metadata(self, resolved: str, train_samples) -> dict:
        """The checkpoint metadata; ``resolved`` is the rendered config. Refuses to
        resume on changed data and warns of validation files equal to training files."""
        import yaml

        cfg = self.cfg
        data_files = fingerprint(self.files, "fingerprinting data")
        val_record = fingerprint(self.val_files, "fingerprinting val data") if cfg.val_data \
            else None
        if self.resumed is not None and self.resumed.get("data_files") is not None:
            _check_same_data(self.resumed, cfg, self.out)
        if val_record and self.main_rank:
            same = same_content([Path(cfg.val_data) / n for n in val_record], data_files)
            if same:
                pairs = [f"{v} = {t}" for v, t in same.items()]
                print(f"meshops: warning: {len(same)} of the {len(val_record)} validation "
                      f"files have the same content as training files ({listing(pairs)}): "
                      f"the best checkpoint is partly picked on training data",
                      file=sys.stderr)
        c_in, c_out, dim = self.sizes
        meta = {
            "inputs": self.layout.input_fields, "targets": list(cfg.targets),
            "params": list(cfg.params), "tags": list(cfg.tags),
            "location": self.layout.location,
            "field_shapes": self.shapes, "in_channels": c_in, "out_channels": c_out,
            "pos_dim": dim, "data": cfg.data, "val_data": cfg.val_data,
            "split": {"train": [Path(self.files[i]).name for i in self.train_idx],
                      "val": [Path(f).name for f in self.val_files]},
            "data_files": data_files, "val_files": val_record,
            "train_config": yaml.safe_load(resolved),
        }
        # descriptors of the training samples: predict and evaluate measure distances to them
        meta["training_set"] = trust_reports.training_set_metadata(train_samples, meta)
        return meta

    def prepare(self) -> None:
        """Create the run folder (or say why it cannot be written) and, for a new run,
        remove the files of an earlier one."""
        _check_writable_folder(self.out)
        if self.main_rank and self.resumed is None:
            clear_run_files(self.out)  # a new run leaves no best.pt of an earlier one behind


def cmd_train(args) -> int:
    import torch

    from meshops.training import RelativeLpLoss
    from meshops.training.defaults import fill_epochs, fill_from_data
    from meshops.training.distributed import check_device
    from meshops.training.seed import seed_everything

    cfg = TrainConfig.resolve(args)
    device_or_error(cfg.device)  # before any data is read
    train_extras.check(cfg)
    main_rank = is_main_rank()
    out = Path(cfg.out)
    # The run records where its data is, not where it was run from: evaluate and
    # --resume from another folder then read this data (see provenance.py).
    cfg.data = os.path.abspath(cfg.data)
    cfg.val_data = os.path.abspath(cfg.val_data) if cfg.val_data else None
    if cfg.val_data and _same_folder(cfg.val_data, cfg.data):
        raise CLIError(f"--val-data {cfg.val_data} is the training folder --data: the best "
                       f"checkpoint would be picked on the training files; give a folder "
                       f"of other meshes, or --val-fraction F to hold out part of --data")
    resumed = None if args.dry_run else _check_run_folder(args, cfg, out)
    # Before anything draws a random number: the model's initial weights (built
    # below) then depend on the seed alone, not on what ran before in the process.
    # The Trainer seeds again (seed + rank) for dropout and the data order.
    seed_everything(cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.series:
        from meshops.cli.series import train_series

        return train_series(cfg, args, dtype, resumed)

    try:  # how a file becomes a sample: points or cells, parameters, boundary tags
        layout = SampleLayout(cfg.inputs, cfg.targets, cfg.params, cfg.tags)
    except MeshError as e:
        raise CLIError(str(e)) from None
    # In memory, or lazily through an on-disk cache for data larger than memory.
    load_folder, workers, reading = data_loader(cfg, dtype, layout)
    if reading and main_rank:
        print(reading, file=sys.stderr if args.dry_run else sys.stdout)
    files, samples, shapes, dim = load_folder(cfg.data, cfg.inputs, cfg.targets,
                                              dtype, desc="reading data")
    if cfg.val_data:
        val_files, val_samples, val_shapes, val_dim = load_folder(
            cfg.val_data, cfg.inputs, cfg.targets, dtype, desc="reading val data")
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
        train_samples = take(samples, train_idx)
        val_samples = take(samples, val_idx) or None
        val_files = [files[i] for i in val_idx]
    c_in = sum(_channels(shapes[k]) for k in layout.input_fields)
    c_out = sum(_channels(shapes[k]) for k in cfg.targets)
    # Options nobody set come from the data; a resumed run's config.yaml sets them all.
    try:
        chosen = [fill_from_data(cfg, train_samples)]
    except ValueError as e:  # e.g. --model reduced_basis on data that is no study
        raise CLIError(str(e)) from None
    run = _RunFiles(cfg, files, train_idx, val_files, shapes, (c_in, c_out, dim), resumed,
                    out, main_rank, layout)
    if cfg.model == "reduced_basis":
        from meshops.cli.reduced import fit_reduced_run

        return fit_reduced_run(args, cfg, "; ".join(c for c in chosen if c), train_samples,
                               val_samples, run)
    model = build_model(cfg.model, cfg.model_config, c_in, c_out, dim, len(cfg.params), dtype,
                        check_device(cfg.device))  # (cuda when available, as the Trainer)
    if dtype == torch.float64:
        model = model.double()
    # Cached data get the model's mesh structures cached too (the Trainer builds those
    # of in-memory samples).
    train_samples = with_structures(train_samples, model, workers)
    val_samples = with_structures(val_samples, model, workers)
    # The epoch count fitted to --minutes from one timed step is printed and saved in
    # config.yaml; the run then trains exactly that many epochs (no wall-clock stop), so
    # that `--epochs N` with the same seed repeats it bit for bit.
    chosen.append(fill_epochs(cfg, model, train_samples, len(val_samples or [])))
    chosen = "; ".join(c for c in chosen if c)
    # Every option, with the model's full hyperparameters.
    resolved = cfg.render(model_config=model.config)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    summary = (f"{cfg.model} ({n_params:,} parameters) on {len(train_samples)} meshes of "
               f"{cfg.data}, validating on "
               + (f"{len(val_samples)}" if val_samples else "none")
               + f"; inputs {', '.join(layout.input_fields) or '(none: geometry only)'} "
               f"({plural(c_in, 'channel')}) -> targets {', '.join(cfg.targets)} "
               f"({plural(c_out, 'channel')}), "
               f"{dim}-D"
               + (", on the cells (midpoint rule)" if layout.location == "cells" else "")
               + (f"; parameters {', '.join(cfg.params)}" if cfg.params else ""))

    def begin() -> dict:
        metadata = run.metadata(resolved, train_samples)
        run.prepare()
        return metadata

    if not run_training(args, cfg, model, train_samples, val_samples, resolved, chosen,
                        summary, begin, loss=RelativeLpLoss(quadrature=cfg.quadrature_loss),
                        compile=cfg.compile, checkpoint_blocks=cfg.checkpoint_blocks,
                        num_workers=workers):
        return 0
    return train_extras.train_members(args, cfg, out, cmd_train)


def run_training(args, cfg, model, train_samples, val_samples, resolved: str, chosen: str,
                 summary: str, begin, **trainer_options) -> bool:
    """The end of ``meshops train`` for a built model and its samples (mesh folders in
    :func:`cmd_train`, time series in :mod:`meshops.cli.series`): ``--dry-run`` prints
    the resolved config and returns False; otherwise ``begin()`` records the run's data
    and prepares its folder (returning the checkpoint metadata), ``config.yaml`` is
    written, the :class:`~meshops.training.Trainer` trains (``trainer_options``: the
    loss, ...) and ``best.pt`` is left; returns True."""
    from meshops._atomic import atomic_write
    from meshops.training import Trainer

    main_rank = is_main_rank()
    out = Path(cfg.out)
    if args.dry_run:
        if main_rank:
            print(resolved, end="")
            if chosen:
                print(f"# defaults from the data: {chosen}", file=sys.stderr)
            print(f"# {summary}", file=sys.stderr)
        return False

    metadata = begin()
    if main_rank:
        atomic_write(out / RUN_CONFIG, lambda tmp: Path(tmp).write_text(resolved))
        if chosen:
            print(f"defaults from the data: {chosen}")
        print(f"training {summary}; writing {out}/")
    options = {"callbacks": train_extras.callbacks(
        cfg, out, {**cfg.to_dict(), "model_config": dict(model.config)}) if main_rank else []}
    options.update(trainer_options)
    trainer = Trainer(
        model, train_samples, val_samples, epochs=cfg.epochs, batch_size=cfg.batch_size,
        lr=cfg.lr, weight_decay=cfg.weight_decay, scheduler=cfg.scheduler,
        grad_clip=cfg.grad_clip, seed=cfg.seed, device=cfg.device, out_dir=out,
        resume=args.resume, metadata=metadata, progress=sys.stderr.isatty(), log=print,
        amp=cfg.amp or False, **options)
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
        elif history and trainer.best["epoch"] is None:
            last = history[-1]["val"] or {}
            why = (f"the model predicts non-finite values on {last['failed']} of "
                   f"{last['n']} validation meshes" if last.get("failed") else
                   f"{trainer.metric} is {last.get(trainer.metric)}")
            raise CLIError(f"no epoch had a finite validation error ({why}), so there is no "
                           f"best model: {out / RUN_CHECKPOINT} was not written; "
                           f"{out / 'last.pt'} holds the model after epoch {trainer.epoch}")
        elif history:
            best = trainer.best
            print(f"best validation {trainer.metric} {best['value']:.4e} at epoch "
                  f"{best['epoch']}: {out / RUN_CHECKPOINT}")
    return True


TRAIN_EPILOG = """\
examples:
  # one mesh file per sample in data/ with point fields f (input) and u (target)
  meshops train --data data/ --inputs f --targets u --out runs/poisson
  meshops train --data data/ --inputs f --targets u --model transformer_no \\
      --model-config width=64 layers=2 --epochs 50 --batch-size 4 --out runs/tno
  # geometry-only problem: the input is the mesh itself
  meshops train --data elasticity/ --inputs "" --targets sigma --model pit
  # a parametric study: parameters from field_data or data/params.csv, boundary tags
  # as input channels; targets stored as cell data train on the cells
  meshops train --data data/ --inputs "" --targets p --params alpha,Re --tags wall
  # options from a file (YAML or TOML; flags override it)
  meshops train --config train.yaml --epochs 10
  # continue an interrupted run (its config.yaml is the base config)
  meshops train --out runs/poisson --resume
  # data-parallel on 4 GPUs
  torchrun --nproc_per_node=4 -m meshops train --config train.yaml
  # time series (one folder, .pvd or .xdmf per series): a next-step model of u,
  # trained on rollouts of 4 steps, parameters from heat/train/params.csv
  # (docs/time-series.md)
  meshops train --series --data heat/train --inputs "" --targets u --params mu0,mu1 \\
      --rollout-train 4 --out runs/heat

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
metrics) and config.yaml (the resolved config, usable as --config). Checkpoints
record the absolute data folder and a fingerprint of its files (docs/trust.md).
A non-empty --out that is not a run of the same config needs --overwrite.
"""


def add_parser(sub) -> None:
    S = argparse.SUPPRESS  # absent options stay absent, so a config file can set them
    p = sub.add_parser(
        "train", help="train a neural operator on a folder of meshes",
        description=wrap("Train a neural operator on a folder with one mesh file per sample "
        "(any meshio format: .vtu, .vtk, .msh, .xdmf, ...), input and target fields in "
        "the point data. The files are split into training and validation sets "
        "deterministically from --seed; normalisers are fitted on the training split "
        "only; the loss is the relative L2 error in physical units."),
        epilog=TRAIN_EPILOG, formatter_class=RAW, argument_default=S)
    p.add_argument("--config", metavar="FILE", default=None,
                   help="YAML or TOML file of options (the long option names); command-line "
                   "flags override it; unknown keys are an error")
    g = p.add_argument_group("data")
    g.add_argument("--data", metavar="DIR", help="folder of training meshes")
    g.add_argument("--inputs", metavar="A,B",
                   help='input point fields, comma-separated; "" for geometry-only problems')
    g.add_argument("--targets", metavar="U,V", help="target fields, comma-separated: all "
                   "point data, or all cell data (then the model trains on the cells)")
    g.add_argument("--params", metavar="A,B", help="per-sample parameters, comma-separated, "
                   "from each file's field_data or a params.csv / params.json beside the "
                   "files (keyed by file name; with --series, by the series' name); they "
                   "condition the model")
    g.add_argument("--tags", metavar="T1,T2", help="boundary tags (Gmsh physical names or "
                   "ARRAY=VALUE of an integer cell array) whose indicator and outward normal "
                   "become input channels")
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
    g.add_argument("--threads", type=int, metavar="N", help="torch's CPU threads (default: "
                   "the faster of 1 and all, from a timed step)")
    g = p.add_argument_group("time series (see docs/time-series.md)")
    g.add_argument("--series", action="store_true",
                   help="--data holds time series (folders of numbered files, .pvd or "
                   ".xdmf); train a next-step model of the --targets (the state), with "
                   "--inputs as fields known at every step")
    g.add_argument("--rollout-train", type=int, metavar="K", dest="rollout_train",
                   help="unroll K steps per training sample (default 2; 1: one-step "
                   "training)")
    g.add_argument("--rollout-grad", choices=["all", "last"], dest="rollout_grad",
                   help="back-propagate only through the last of the K steps (default; "
                   "push-forward: the first K-1 steps run without gradient) or through all")
    g.add_argument("--rollout-loss", choices=["mse", "relative"], dest="rollout_loss",
                   help="the training loss of a step: its mean square error in units of the "
                   "typical one-step change (default), or its relative L2 error (the "
                   "metric, dominated by states near zero)")
    g.add_argument("--time-input", action=argparse.BooleanOptionalAction, dest="time_input",
                   help="give the model the time t (default; --no-time-input for autonomous "
                   "problems); it always gets dt and the parameters")
    train_extras.add_arguments(p)
    g = p.add_argument_group("data larger than memory (docs/large-data.md)")
    g.add_argument("--lazy", action=argparse.BooleanOptionalAction,
                   help="read the meshes one batch at a time from an on-disk cache of "
                   "parsed meshes and mesh structures, in worker processes (default: when "
                   "the parsed data would exceed a quarter of the available memory); "
                   "--no-lazy: always in memory")
    g.add_argument("--cache", metavar="DIR", help="the cache folder (implies --lazy; default "
                   "$MESHOPS_CACHE_DIR or ~/.cache/meshops/meshes); runs may share it")
    g.add_argument("--workers", type=int, metavar="N", help="DataLoader worker processes "
                   "that read and parse meshes (default 2 when lazy, else 0)")
    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="RUN", help="run folder (default ./run)")
    g.add_argument("--resume", action="store_true", default=False,
                   help="continue RUN from RUN/last.pt (with RUN/config.yaml as the base "
                   "config) on the same data; every option must stay the run's but --minutes, "
                   "--device and, without a learning-rate schedule, --epochs")
    g.add_argument("--overwrite", action="store_true", default=False,
                   help="start a new run in a non-empty --out that is not a run of the same "
                   "config (its best.pt, last.pt and history.json are removed first)")
    g.add_argument("--dry-run", action="store_true", default=False, dest="dry_run",
                   help="read the data, print the resolved config (YAML) and exit")
    p.set_defaults(func=cmd_train)
