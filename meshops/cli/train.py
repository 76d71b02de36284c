"""``meshops train``: a neural operator from a folder of meshes to a run folder."""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
import sys
from pathlib import Path

from meshops.cli._common import RAW, CLIError, is_main_rank, os_reason, plural, wrap
from meshops.cli.config import RUN_CONFIG, TrainConfig
from meshops.cli.folder import load_folder
from meshops.errors import CheckpointError
from meshops.inference import RUN_CHECKPOINT, _channels, _fmt_shape

# Set from the data, never by model_config.
INFERRED = ("in_channels", "out_channels", "pos_dim")


def build_model(name: str, model_config: dict, in_channels: int, out_channels: int,
                pos_dim: int):
    """A registered model (:data:`meshops.models.MODELS`) with ``model_config`` and the
    channels and dimension of the data; a key the model does not take is refused."""
    from meshops.models import MODELS

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
    kwargs = dict(model_config)
    kwargs.update({k: v for k, v in inferred.items() if k in accepted or open_kw})
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CLIError(f"model {name!r} with {model_config or 'the default config'}: {e}") \
            from None


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


def cmd_train(args) -> int:
    import torch

    from meshops.training import RelativeLpLoss, Trainer
    from meshops.training.defaults import fill_epochs, fill_from_data
    from meshops.training.seed import seed_everything

    cfg = TrainConfig.resolve(args)
    out = Path(cfg.out)
    if not args.dry_run and not args.resume and (out / "last.pt").exists():
        raise CLIError(f"{out}: already holds a training run (last.pt); pass --resume to "
                       f"continue it or choose another --out")
    if args.resume and (out / "last.pt").is_file():
        # Before the data is read and before config.yaml is rewritten: a resume the
        # Trainer would refuse (a damaged last.pt, another epoch count under a
        # learning-rate schedule) must leave the run folder as it was.
        try:
            state = Trainer.read_state(out / "last.pt")
            Trainer.check_resume_epochs(out / "last.pt", state["training"], cfg.epochs,
                                        cfg.scheduler is not None)
        except (CheckpointError, ValueError) as e:
            raise CLIError(str(e)) from None
        del state
    # Before anything draws a random number: the model's initial weights (built
    # below) then depend on the seed alone, not on what ran before in the process.
    # The Trainer seeds again (seed + rank) for dropout and the data order.
    seed_everything(cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    if cfg.series:
        from meshops.cli.series import train_series

        return train_series(cfg, args, dtype)

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
        train_samples = [samples[i] for i in train_idx]
        val_samples = [samples[i] for i in val_idx] or None
        val_files = [files[i] for i in val_idx]
    c_in = sum(_channels(shapes[k]) for k in cfg.inputs)
    c_out = sum(_channels(shapes[k]) for k in cfg.targets)
    # Options nobody set come from the data; a resumed run's config.yaml sets them all.
    chosen = [fill_from_data(cfg, train_samples)]
    model = build_model(cfg.model, cfg.model_config, c_in, c_out, dim)
    if dtype == torch.float64:
        model = model.double()
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
               + f"; inputs {', '.join(cfg.inputs) or '(none: geometry only)'} "
               f"({plural(c_in, 'channel')}) -> targets {', '.join(cfg.targets)} "
               f"({plural(c_out, 'channel')}), "
               f"{dim}-D")
    metadata = {
        "inputs": list(cfg.inputs), "targets": list(cfg.targets),
        "field_shapes": shapes, "in_channels": c_in, "out_channels": c_out, "pos_dim": dim,
        "data": str(cfg.data),
        "split": {"train": [Path(files[i]).name for i in train_idx],
                  "val": [Path(f).name for f in val_files]},
    }
    return run_training(args, cfg, model, train_samples, val_samples, metadata, resolved,
                        chosen, summary, loss=RelativeLpLoss(quadrature=cfg.quadrature_loss))


def run_training(args, cfg, model, train_samples, val_samples, metadata: dict,
                 resolved: str, chosen: str, summary: str, **trainer_options) -> int:
    """The end of ``meshops train`` for a built model and its samples (mesh folders here,
    time series in :mod:`meshops.cli.series`): ``--dry-run`` prints the resolved
    config; otherwise write ``config.yaml``, train with the
    :class:`~meshops.training.Trainer` (``trainer_options``: the loss, ...) and leave
    ``best.pt``."""
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
        return 0

    _check_writable_folder(out)
    if main_rank:
        atomic_write(out / RUN_CONFIG, lambda tmp: Path(tmp).write_text(resolved))
        if chosen:
            print(f"defaults from the data: {chosen}")
        print(f"training {summary}; writing {out}/")
    trainer = Trainer(
        model, train_samples, val_samples, epochs=cfg.epochs, batch_size=cfg.batch_size,
        lr=cfg.lr, weight_decay=cfg.weight_decay, scheduler=cfg.scheduler,
        grad_clip=cfg.grad_clip, seed=cfg.seed, device=cfg.device, out_dir=out,
        resume=args.resume, metadata=metadata, progress=sys.stderr.isatty(), log=print,
        **trainer_options)
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
  # time series (one folder, .pvd or .xdmf per series): a next-step model of u,
  # trained on rollouts of 4 steps, parameters from heat/train/params.csv
  meshops train --series --data heat/train --inputs "" --targets u --params mu1,mu2 \\
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
metrics) and config.yaml (the resolved config, usable as --config).
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
    g.add_argument("--targets", metavar="U,V", help="target point fields, comma-separated")
    g.add_argument("--params", metavar="A,B", help="with --series: scalar parameters of each "
                   "series, from a params.csv / params.json beside the series (keyed by the "
                   "series' name) or the field data of its first file")
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
    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="RUN", help="run folder (default ./run)")
    g.add_argument("--resume", action="store_true", default=False,
                   help="continue RUN from RUN/last.pt (with RUN/config.yaml as the base "
                   "config); under a learning-rate schedule --epochs must stay the run's")
    g.add_argument("--dry-run", action="store_true", default=False, dest="dry_run",
                   help="read the data, print the resolved config (YAML) and exit")
    p.set_defaults(func=cmd_train)
