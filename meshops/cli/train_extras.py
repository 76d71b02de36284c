"""``meshops train``'s precision, compile, memory and logging options: their flags,
their config-file coercers, the combinations refused before any data is read, and the
Trainer callbacks they make (TensorBoard under ``RUN/tensorboard`` by default when it
is installed, MLflow in ``RUN/mlflow.db`` on request)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from meshops.cli._common import CLIError, is_main_rank

LOGGERS = ("tensorboard", "mlflow")


# --------------------------------------------------------------- config coercers
def coerce_amp(key, v):
    """``bf16``, ``fp16`` or ``None`` (off)."""
    if v is None or v is False or (isinstance(v, str) and v.lower() in ("none", "off", "")):
        return None
    from meshops.training.precision import AMP_CHOICES

    if v not in AMP_CHOICES:
        raise CLIError(f"{key}: must be bf16, fp16 or none, got {v!r}")
    return {"bfloat16": "bf16", "float16": "fp16"}.get(v, v)


def coerce_loggers(key, v):
    """A list of logger names; ``None``: TensorBoard when installed; ``[]``: none."""
    if v is None:
        return None
    if isinstance(v, str):
        v = [s.strip() for s in v.split(",") if s.strip()]
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
        raise CLIError(f"{key}: expected a comma-separated list of tensorboard, mlflow or "
                       f"none, got {v!r}")
    v = [s.lower() for s in v]
    if "none" in v:
        if len(v) > 1:
            raise CLIError(f"{key}: 'none' cannot be combined with other loggers, got {v}")
        return []
    bad = [s for s in v if s not in LOGGERS]
    if bad:
        raise CLIError(f"{key}: unknown logger(s) {bad}; choose from tensorboard, mlflow, none")
    return list(dict.fromkeys(v))


# ------------------------------------------------------------------------- flags
def add_arguments(parser) -> None:
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


# ------------------------------------------------------------------------ checks
def check(cfg) -> None:
    """Combinations that cannot work, refused before the data is read."""
    import torch

    from meshops.training.precision import amp_dtype

    if cfg.amp is not None:
        device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        try:
            amp_dtype(cfg.amp, device, getattr(torch, cfg.dtype))
        except ValueError as e:
            raise CLIError(f"--amp {cfg.amp}: {e}" + (" (--dtype float64)" if
                                                        cfg.dtype == "float64" else "")) \
                from None
    if cfg.logger:
        from meshops.training.experiment import require

        for name in cfg.logger:
            try:
                require(name)
            except ImportError as e:
                raise CLIError(f"--logger {name}: {e}") from None


def loggers(cfg) -> list[str]:
    """The loggers a run uses: as configured, or TensorBoard when it is installed."""
    from meshops.training.experiment import available

    if cfg.logger is not None:
        return list(cfg.logger)
    return ["tensorboard"] if available("tensorboard") else []


def callbacks(cfg, out: Path, config: dict) -> list:
    """The Trainer callbacks of the run's loggers, writing under the run folder ``out``."""
    from meshops.training.experiment import MLflowLogger, TensorBoardLogger

    made = []
    for name in loggers(cfg):
        if name == "tensorboard":
            made.append(TensorBoardLogger(out / "tensorboard", config=config))
        else:
            uri = os.environ.get("MLFLOW_TRACKING_URI")
            local = None if uri else (out.resolve() / "mlartifacts").as_uri()
            made.append(MLflowLogger(uri or f"sqlite:///{out.resolve()}/mlflow.db",
                                     run_name=out.name, config=config,
                                     artifact_location=local))
    return made


def train_members(args, cfg, out: Path, train) -> int:
    """The other members of ``--ensemble K``: the same command with seeds ``seed + k``
    into ``RUN/ensemble/seed<seed + k>/`` (with the run's epoch count), one by one."""
    import copy

    from meshops.inference.trust import ENSEMBLE

    for k in range(1, cfg.ensemble):
        sub = copy.copy(args)
        sub.seed, sub.ensemble, sub.epochs = cfg.seed + k, 1, cfg.epochs
        sub.out = str(out / ENSEMBLE / f"seed{sub.seed}")
        if is_main_rank():
            print(f"ensemble member {k + 1}/{cfg.ensemble}: seed {sub.seed} -> {sub.out}/")
        train(sub)
    return 0

