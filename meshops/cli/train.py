"""``meshops train``: a neural operator from a folder of meshes to a run folder."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from meshops.cli import train_extras, trust_reports
from meshops.cli._common import RAW, CLIError, device_or_error, is_main_rank, plural, wrap
from meshops.cli.config import TrainConfig
from meshops.cli.lazy import data_loader, fingerprints, shards_of, take, with_structures
from meshops.cli.provenance import (
    changes,
    fingerprint,
    listing,
    param_changes,
    param_fingerprint,
    refuse_changed,
    same_content,
)
from meshops.cli.run_folder import (
    check_out_folder,
    check_resume_options,
    clear_run_files,
    recorded_config,
)
from meshops.cli.run_lock import run_lock
from meshops.cli.training_run import (
    build_model,
    check_writable_folder,
    epochs_to_fit,
    run_training,
    split_files,
)
from meshops.datasets.fields import TargetFields
from meshops.datasets.layout import SampleLayout
from meshops.errors import CheckpointError, MeshError
from meshops.inference.predict import field_channels, format_shape


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist: the data set says so when it reads it
        return False


def _check_run_folder(args, cfg: TrainConfig, out: Path) -> dict | None:
    """The checks of ``--out`` and ``--resume`` made before the data is read, so that a
    refused run leaves the folder as it was. Returns the metadata of ``last.pt`` when
    resuming a run, else ``None``."""
    from meshops.training.state import check_resume_epochs, read_training_state

    last = out / "last.pt"
    if not (args.resume and last.is_file()):
        check_out_folder(out, cfg, args.overwrite, args.resume)
        return None
    try:
        state = read_training_state(last)
        check_resume_epochs(last, state["training"], cfg.epochs, cfg.schedule is not None)
    except (CheckpointError, ValueError) as e:
        raise CLIError(str(e)) from None
    meta = dict(state.get("metadata") or {})
    # runs before the train_config record: their config.yaml
    recorded = meta.get("train_config") or recorded_config(out)
    if recorded:
        check_resume_options(cfg, recorded, args, last)
    return meta


def _check_same_data(meta: dict, cfg: TrainConfig, out: Path) -> None:
    """Refuse to resume a run whose training or validation files (mesh files and
    parameter files) changed."""
    diff = changes(meta["data_files"], cfg.data)
    if meta.get("param_files") is not None:
        diff += param_changes(meta["param_files"], cfg.data)
    if cfg.val_data and meta.get("val_files") is not None:
        diff += changes(meta["val_files"], cfg.val_data)
    if cfg.val_data and meta.get("val_param_files") is not None:
        diff += param_changes(meta["val_param_files"], cfg.val_data)
    refuse_changed(diff, out / "last.pt")


class _RunFiles:
    """What a new run records about its data (paths, file fingerprints, split, config)
    and the preparation of its folder, shared by every model's way of training."""

    def __init__(self, cfg, data: "_TrainData", resumed, out, main_rank) -> None:
        self.cfg, self.files, self.train_idx = cfg, data.files, data.train_idx
        self.val_files, self.shapes, self.sizes = data.val_files, data.shapes, data.sizes
        self.resumed, self.out, self.main_rank = resumed, out, main_rank
        self.layout, self.fields, self.known = data.layout, data.fields, data.known

    def metadata(self, resolved: str, train_samples) -> dict:
        """The checkpoint metadata; ``resolved`` is the rendered config. Refuses to
        resume on changed data and warns of validation files equal to training files."""
        import yaml

        cfg = self.cfg
        data_files = fingerprint(self.files, "fingerprinting data", known=self.known["data"])
        val_record = fingerprint(self.val_files, "fingerprinting val data",
                                 known=self.known["val"]) if cfg.val_data else None
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
            "fields": self.fields.to_dict(),
            "params": list(cfg.params), "tags": list(cfg.tags),
            "location": self.layout.location,
            "field_shapes": self.shapes, "in_channels": c_in, "out_channels": c_out,
            "pos_dim": dim, "data": cfg.data, "val_data": cfg.val_data,
            "split": {"train": [Path(self.files[i]).name for i in self.train_idx],
                      "val": [Path(f).name for f in self.val_files]},
            "data_files": data_files, "val_files": val_record,
            # the parameter files give the samples' values as much as the meshes do
            "param_files": param_fingerprint(cfg.data) if cfg.params else None,
            "val_param_files": param_fingerprint(cfg.val_data)
            if cfg.params and cfg.val_data else None,
            "train_config": yaml.safe_load(resolved),
        }
        # descriptors of the training samples: predict and evaluate measure distances to them
        meta["training_set"] = trust_reports.training_set_metadata(train_samples, meta)
        return meta

    def prepare(self) -> None:
        """Create the run folder (or say why it cannot be written) and, for a new run,
        remove the files of an earlier one."""
        check_writable_folder(self.out)
        if self.main_rank and self.resumed is None:
            clear_run_files(self.out)  # a new run leaves no best.pt of an earlier one behind


@dataclass
class _TrainData:
    """The samples of a run: the files of ``--data``, their field shapes, the training
    and validation samples (and files), the channels and dimension they give, how a file
    becomes a sample (``layout``) and the loader's worker processes (lazy data)."""

    files: list
    shapes: dict
    train_idx: list[int]
    train: list
    val: list | None
    val_files: list
    sizes: tuple[int, int, int]       # in_channels, out_channels, pos_dim
    layout: SampleLayout
    workers: int
    fields: TargetFields
    # fingerprints a lazy run's cache took already, of --data and --val-data ("data",
    # "val": file name -> [size, mtime_ns, sha256])
    known: dict


def cmd_train(args) -> int:
    """``meshops train``: the config, the data, the options chosen from the data, the
    model, then the training (or the fit of a reduced basis; time series in
    :mod:`meshops.cli.series`), holding the run folder's lock
    (:mod:`meshops.cli.run_lock`)."""
    cfg = _resolve_config(args)
    if args.dry_run or not is_main_rank():  # writes nothing, or only what rank 0 says
        return _train(args, cfg)
    # One run at a time in a folder, from its first look at it to its last write.
    with run_lock(Path(cfg.out)):
        return _train(args, cfg)


def _train(args, cfg: TrainConfig) -> int:
    """:func:`cmd_train` from the resolved config on."""
    import torch

    from meshops.training import RelativeLpLoss
    from meshops.training.seed import seed_everything

    main_rank = is_main_rank()
    out = Path(cfg.out)
    resumed = None if args.dry_run else _check_run_folder(args, cfg, out)
    # Before anything draws a random number: the model's initial weights (built
    # below) then depend on the seed alone, not on what ran before in the process.
    # The Trainer seeds again (seed + rank) for dropout and the data order.
    seed_everything(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.series:
        from meshops.cli.series import train_series

        return train_series(cfg, args, getattr(torch, cfg.dtype), resumed)
    data, cfg, chosen = _data_and_options(cfg, main_rank, args.dry_run)
    if cfg.model == "reduced_basis":
        from meshops.cli.reduced import fit_reduced_run

        return fit_reduced_run(args, cfg, chosen, data.train, data.val,
                               _RunFiles(cfg, data, resumed, out, main_rank))
    model = _build_model(cfg, data)
    # Cached data get the model's mesh structures cached too (the Trainer builds those
    # of in-memory samples).
    data.train = with_structures(data.train, model, data.workers)
    data.val = with_structures(data.val, model, data.workers)
    # The epoch count fitted to --minutes from one timed step is printed and saved in
    # config.yaml; the run then trains exactly that many epochs (no wall-clock stop), so
    # that `--epochs N` with the same seed repeats it bit for bit.
    cfg, fitted = epochs_to_fit(cfg, model, data.train, len(data.val or []))
    chosen = "; ".join(c for c in (chosen, fitted) if c)
    # Every option, with the model's full hyperparameters.
    resolved = cfg.render(model_config=model.config)
    run = _RunFiles(cfg, data, resumed, out, main_rank)

    def begin() -> dict:
        metadata = run.metadata(resolved, data.train)
        run.prepare()
        return metadata

    if not run_training(args, cfg, model, data.train, data.val, resolved, chosen,
                        _summary(cfg, model, data), begin,
                        loss=RelativeLpLoss(quadrature=cfg.quadrature_loss,
                                            fields=data.fields),
                        compile=cfg.compile, checkpoint_blocks=cfg.checkpoint_blocks,
                        num_workers=data.workers, shards=shards_of(cfg, data.train)):
        return 0
    return train_extras.train_members(args, cfg, out, cmd_train)


def _resolve_config(args) -> TrainConfig:
    """The run's options (defaults, config files, flags), with the data folders made
    absolute, checked before any data is read."""
    cfg = TrainConfig.resolve(args)
    device_or_error(cfg.device)  # before any data is read
    train_extras.check(cfg)
    # The run records where its data is, not where it was run from: evaluate and
    # --resume from another folder then read this data (see provenance.py).
    cfg = cfg.with_options("command line", data=os.path.abspath(cfg.data),
                           val_data=os.path.abspath(cfg.val_data) if cfg.val_data else None)
    if cfg.val_data and _same_folder(cfg.val_data, cfg.data):
        raise CLIError(f"--val-data {cfg.val_data} is the training folder --data: the best "
                       f"checkpoint would be picked on the training files; give a folder "
                       f"of other meshes, or --val-fraction F to hold out part of --data")
    return cfg


def _data_and_options(cfg: TrainConfig, main_rank: bool, dry_run: bool
                      ) -> tuple[_TrainData, TrainConfig, str]:
    """The data, and the config with the options chosen from it (and why). A reduced
    basis fits in float64, whatever ``--dtype``: its parameters (a timestamp-like
    1.7e9 + 100 a is quantised in float32) and snapshots are read in float64, again
    when the data chose it."""
    dtype = "float64" if cfg.model == "reduced_basis" else cfg.dtype
    data = _read_data(cfg, main_rank, dry_run, dtype)
    cfg, chosen = _options_from_data(cfg, data.train)
    if cfg.model == "reduced_basis" and dtype != "float64":
        data = _read_data(cfg, main_rank, dry_run, "float64")
    return data, cfg, chosen


def _read_data(cfg: TrainConfig, main_rank: bool, dry_run: bool, dtype: str) -> _TrainData:
    """The training (and validation) samples in ``dtype``: ``--val-data``, or a split of
    ``--data``; in memory, or lazily through an on-disk cache for data larger than
    memory."""
    import torch

    dtype = getattr(torch, dtype)
    try:  # how a file becomes a sample: points or cells, parameters, boundary tags
        layout = SampleLayout(cfg.inputs, cfg.targets, cfg.params, cfg.tags)
    except MeshError as e:
        raise CLIError(str(e)) from None
    load_folder, workers, reading = data_loader(cfg, dtype, layout)
    if reading and main_rank:
        print(reading, file=sys.stderr if dry_run else sys.stdout)
    files, samples, shapes, dim = load_folder(cfg.data, cfg.inputs, cfg.targets,
                                              dtype, desc="reading data")
    if cfg.val_data:
        val_files, val_samples, val_shapes, val_dim = load_folder(
            cfg.val_data, cfg.inputs, cfg.targets, dtype, desc="reading val data")
        for k, sh in shapes.items():
            if val_shapes[k] != sh:
                raise CLIError(f"{val_files[0]}: field {k!r} is {format_shape(val_shapes[k])} "
                               f"but {format_shape(sh)} in {files[0]}")
        if val_dim != dim:
            raise CLIError(f"{val_files[0]}: the mesh is {val_dim}-D but {files[0]} is {dim}-D")
        train_idx, train_samples = list(range(len(files))), samples
    else:
        train_idx, val_idx = split_files(len(files), cfg.val_fraction, cfg.seed, cfg.data)
        train_samples = take(samples, train_idx)
        val_samples = take(samples, val_idx) or None
        val_files = [files[i] for i in val_idx]
    c_in = sum(field_channels(shapes[k]) for k in layout.input_fields)
    c_out = sum(field_channels(shapes[k]) for k in cfg.targets)
    known = {"data": fingerprints(samples),
             "val": fingerprints(val_samples) if cfg.val_data else {}}
    return _TrainData(files, shapes, train_idx, train_samples, val_samples, val_files,
                      (c_in, c_out, dim), layout, workers, target_fields(cfg, shapes),
                      known)


def target_fields(cfg: TrainConfig, shapes: dict) -> TargetFields:
    """The run's target fields (:mod:`meshops.datasets.fields`) from its config and the
    target arrays' shapes."""
    try:
        return TargetFields.from_specs(cfg.field_specs, {k: field_channels(shapes[k])
                                                         for k in cfg.targets},
                                       cfg.field_weights)
    except ValueError as e:
        raise CLIError(f"train: {e}") from None


def _options_from_data(cfg: TrainConfig, samples) -> tuple[TrainConfig, str]:
    """Options nobody set, chosen from the data (a resumed run's config.yaml sets them
    all), and the reason said (``""``: nothing chosen)."""
    from meshops.training.defaults import options_from_data

    try:
        options, reason = options_from_data(samples, cfg.model, cfg.model_config,
                                            cfg.batch_size, cfg.lr, cfg.scheduler)
    except ValueError as e:  # e.g. --model reduced_basis on data that is no study
        raise CLIError(str(e)) from None
    return cfg.with_options("defaults", **options), reason


def _build_model(cfg: TrainConfig, data: _TrainData):
    """The model, on the meta device first (it must fit the device training uses: cuda
    when available, as the Trainer), in the training dtype."""
    import torch

    from meshops.training.distributed import check_device

    dtype = getattr(torch, cfg.dtype)
    model = build_model(cfg.model, cfg.model_config, *data.sizes, len(cfg.params), dtype,
                        check_device(cfg.device))
    return model.double() if dtype == torch.float64 else model


def _summary(cfg: TrainConfig, model, data: _TrainData) -> str:
    """One line: the model, its size, the data, the fields and channels."""
    c_in, c_out, dim = data.sizes
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return (f"{cfg.model} ({n_params:,} parameters) on {len(data.train)} meshes of "
            f"{cfg.data}, validating on "
            + (f"{len(data.val)}" if data.val else "none")
            + f"; inputs {', '.join(data.layout.input_fields) or '(none: geometry only)'} "
            f"({plural(c_in, 'channel')}) -> targets {', '.join(cfg.targets)} "
            f"({plural(c_out, 'channel')}), "
            f"{dim}-D"
            + (", on the cells (midpoint rule)" if data.layout.location == "cells" else "")
            + (f"; parameters {', '.join(cfg.params)}" if cfg.params else "")
            + (f"; the loss is the mean relative error of the fields {data.fields.describe()}"
               if len(data.fields) > 1 else ""))


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
A non-empty --out that is not a run of the same config, or that holds a finished
run (last.pt, or a reduced basis' best.pt), needs --overwrite. One run at a time
writes a run folder: a second run there is refused while the first one runs.
"""


def add_parser(sub) -> None:
    S = argparse.SUPPRESS  # absent options stay absent, so a config file can set them
    p = sub.add_parser(
        "train", help="train a model (a reduced basis or a neural operator) on a folder "
        "of meshes",
        description=wrap("Train a model on a folder with one mesh file per sample "
        "(any meshio format: .vtu, .vtk, .msh, .xdmf, ...), input and target fields in "
        "the point data. Without --model it is chosen from the data: a reduced basis "
        "(fitted, not trained by epochs) for a parametric study on one mesh, else the "
        "neural operator PiT. The files are split into training and validation sets "
        "deterministically from --seed; normalisers are fitted on the training split "
        "only; the loss is the relative L2 error in physical units."),
        epilog=TRAIN_EPILOG, formatter_class=RAW, argument_default=S)
    p.add_argument("--config", metavar="FILE", default=None,
                   help="YAML or TOML file of options (the long option names); command-line "
                   "flags override it; unknown keys are an error")
    g = p.add_argument_group("data")
    g.add_argument("--data", metavar="DIR", help="folder of training meshes")
    g.add_argument("--inputs", metavar="A,B",
                   help='input point fields, comma-separated ("" for geometry-only problems); '
                        'geo:distance and geo:direction are computed from each mesh (the '
                        'distance and direction to the domain boundary)')
    g.add_argument("--targets", metavar="U+V,P", help="target fields, comma-separated: all "
                   "point data, or all cell data (then the model trains on the cells). Each "
                   "field has its own relative error and the loss is their mean, so a small "
                   "field counts as much as a large one; join scalar arrays that form one "
                   "vector field with + (u+v,p: velocity and pressure)")
    g.add_argument("--field-weights", dest="field_weights", metavar="F=W,...",
                   help="weights of the target fields in the loss and the validation error "
                   "(default 1 each), e.g. u+v=1,p=0.5")
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
                   help="reduced_basis, pit, slice_transformer, transformer_no, "
                   "galerkin_transformer or patched_transformer (default: chosen from the "
                   "data: reduced_basis for "
                   "a parametric study, one mesh and a parameter vector or constant inputs "
                   "per sample; pit otherwise); with --series also trajectory_basis, and "
                   "the default a choice between it and a next-step model "
                   "(docs/time-series.md)")
    g.add_argument("--model-config", nargs="+", action="extend", metavar="KEY=VALUE",
                   dest="model_config",
                   help="model hyperparameters, e.g. width=64 layers=2 heads=4 (defaults: "
                   "the model's; in/out channels and pos_dim come from the data)")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=int, metavar="N",
                   help="epochs (default: as many as fit --minutes, from a timed step)")
    g.add_argument("--minutes", type=float, metavar="M",
                   help="wall-clock budget (default 10): it sets a neural operator's "
                   "epochs and the size of a reduced basis' MLP ensemble")
    g.add_argument("--batch-size", type=int, metavar="B", dest="batch_size",
                   help="meshes per step of a neural operator (per process under torchrun; "
                        "default from the data: 4 when the inputs are constant over each "
                        "mesh, e.g. a family of geometries, else 8); a reduced basis is "
                        "fitted and takes none")
    g.add_argument("--lr", type=float, help="learning rate of a neural operator (default "
                                            "from the data: 3e-3 when the inputs are "
                                            "constant over each mesh, else 1e-3)")
    g.add_argument("--weight-decay", type=float, dest="weight_decay", metavar="W",
                   help="AdamW weight decay (default 1e-4)")
    g.add_argument("--scheduler", choices=["auto", "cosine", "onecycle", "none"],
                   help="learning-rate schedule (default auto: chosen from the data, one-cycle "
                        "for the model of families of geometries, else cosine)")
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
                   "that read and parse meshes (default when lazy: 2, leaving 2 cores "
                   "to the training step, none on 2 cores; in memory 0)")
    g.add_argument("--shards", type=int, metavar="N", help="deal the training files into N "
                   "fixed parts, each step taking a batch of every part (default: under "
                   "torchrun with --lazy, one part per process, each reading only its own; "
                   "in one process with N times the batch, the steps of such a run; "
                   "docs/distributed.md)")
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
