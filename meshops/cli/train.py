"""``meshops train``: its options and examples; the run is :func:`meshops.fitting.train.train`."""

from __future__ import annotations

import argparse
import sys

from meshops.cli._common import RAW, wrap


def cmd_train(args) -> int:
    """``meshops train``: the run of :func:`meshops.fitting.train.train` with the flags given;
    a dry run prints the resolved config (YAML) on standard output and what was chosen
    on standard error. What training says is logged (:func:`meshops.cli._common.command_log`
    prints it)."""
    from meshops.fitting.train import train

    training = train(train_request(args))
    if training.dry_run:
        print(training.config.render(), end="")
        reason = training.choice.reason if training.choice else ""
        if reason:
            print(f"# defaults from the data: {reason}", file=sys.stderr)
        if training.summary:
            print(f"# {training.summary}", file=sys.stderr)
    return 0


def train_request(args):
    """The :class:`~meshops.fitting.train.TrainRequest` of ``meshops train``'s parsed flags
    (absent options left out, so that a config file or the resumed run sets them)."""
    from meshops.fitting.config import TrainConfig
    from meshops.fitting.train import TrainRequest

    options = {k: getattr(args, k) for k in TrainConfig.keys() if hasattr(args, k)}
    return TrainRequest(options, args.config, args.resume, args.overwrite, args.dry_run,
                        "command line")


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
                   "1 unless all are more than 10 %% faster, from a timed step, and timed "
                   "again when the steps slow down; on a shared machine: --threads 1)")
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
    _add_speed_arguments(p)
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


def _add_speed_arguments(parser) -> None:
    """The flags (their values absent unless given, so a config file can set them)."""
    g = parser.add_argument_group("speed, memory and logging")
    g.add_argument("--amp", metavar="bf16|fp16|none",
                   help="mixed precision (torch.autocast) of a float32 model, on CPU and GPU; "
                   "fp16 uses a gradient scaler (default none)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="train and validate through torch.compile (default off)")
    g.add_argument("--checkpoint-blocks", action=argparse.BooleanOptionalAction,
                   dest="checkpoint_blocks",
                   help="activation checkpointing of the processor blocks: less memory, "
                   "about one more forward pass of them per step (default off)")
    g.add_argument("--ensemble", type=int, metavar="K",
                   help="train K models with seeds SEED..SEED+K-1 (the others in "
                   "RUN/ensemble/seed<N>/); predict then writes their mean and standard "
                   "deviation (default 1)")
    g.add_argument("--logger", metavar="NAMES",
                   help="experiment logging: tensorboard (RUN/tensorboard), mlflow "
                   "(MLFLOW_TRACKING_URI, else RUN/mlflow.db), both comma-separated, or "
                   "none (default: tensorboard when installed)")
