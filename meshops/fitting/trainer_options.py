"""A fit's options for the Trainer: precision, compile, memory and loggers; their
coercers, the combinations refused before any data is read, and the Trainer callbacks
they make (TensorBoard under ``RUN/tensorboard`` by default when it is installed, MLflow
in ``RUN/mlflow.db`` on request)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from meshops.errors import UsageError
from meshops.runs.run_folder import TENSORBOARD_FOLDER
from meshops.training.distributed import is_main_rank

log = logging.getLogger(__name__)

LOGGERS = ("tensorboard", "mlflow")


# --------------------------------------------------------------- config coercers
def coerce_amp(key, v):
    """``bf16``, ``fp16`` or ``None`` (off)."""
    if v is None or v is False or (isinstance(v, str) and v.lower() in ("none", "off", "")):
        return None
    from meshops.training.precision import AMP_CHOICES

    if v not in AMP_CHOICES:
        raise UsageError(f"{key}: must be bf16, fp16 or none, got {v!r}")
    return {"bfloat16": "bf16", "float16": "fp16"}.get(v, v)


def coerce_loggers(key, v):
    """A list of logger names; ``None``: TensorBoard when installed; ``[]``: none."""
    if v is None:
        return None
    if isinstance(v, str):
        v = [s.strip() for s in v.split(",") if s.strip()]
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
        raise UsageError(f"{key}: expected a comma-separated list of tensorboard, mlflow or "
                       f"none, got {v!r}")
    v = [s.lower() for s in v]
    if "none" in v:
        if len(v) > 1:
            raise UsageError(f"{key}: 'none' cannot be combined with other loggers, got {v}")
        return []
    bad = [s for s in v if s not in LOGGERS]
    if bad:
        raise UsageError(f"{key}: unknown logger(s) {bad}; choose from tensorboard, mlflow, none")
    return list(dict.fromkeys(v))


# ------------------------------------------------------------------------ checks
def check(cfg, say) -> None:
    """Combinations that cannot work, refused before the data is read; ``say(key,
    value)`` writes an option as the caller gives it (the command's flag, or
    :func:`meshops.fit`'s keyword: :func:`~meshops.fitting.config.option_name`)."""
    import torch

    from meshops.training.precision import amp_dtype

    if cfg.amp is not None:
        device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        try:
            amp_dtype(cfg.amp, device, getattr(torch, cfg.dtype))
        except ValueError as e:
            raise UsageError(f"{say('amp', cfg.amp)}: {e}" + (
                f" ({say('dtype', 'float64')})" if cfg.dtype == "float64" else "")) from None
    if cfg.logger:
        from meshops.training.loggers import require

        for name in cfg.logger:
            try:
                require(name)
            except ImportError as e:
                raise UsageError(f"{say('logger', name)}: {e}") from None


def loggers(cfg) -> list[str]:
    """The loggers a run uses: as configured, or TensorBoard when it is installed."""
    from meshops.training.loggers import available

    if cfg.logger is not None:
        return list(cfg.logger)
    return ["tensorboard"] if available("tensorboard") else []


def callbacks(cfg, out: Path, config: dict) -> list:
    """The Trainer callbacks of the run's loggers, writing under the run folder ``out``."""
    from meshops.training.loggers import MLflowLogger, TensorBoardLogger

    made = []
    for name in loggers(cfg):
        if name == "tensorboard":
            made.append(TensorBoardLogger(out / TENSORBOARD_FOLDER, config=config))
        else:
            uri = os.environ.get("MLFLOW_TRACKING_URI")
            local = None if uri else (out.resolve() / "mlartifacts").as_uri()
            made.append(MLflowLogger(uri or f"sqlite:///{out.resolve()}/mlflow.db",
                                     run_name=out.name, config=config,
                                     artifact_location=local))
    return made


def train_members(request, cfg, out: Path, train) -> None:
    """The other members of ``--ensemble K``: the same command with seeds ``seed + k``
    into ``RUN/ensemble/seed<seed + k>/`` (with the run's epoch count), one by one."""
    from meshops.inference.trust import ENSEMBLE

    for k in range(1, cfg.ensemble):
        seed = cfg.seed + k
        sub = request.with_options(seed=seed, ensemble=1, epochs=cfg.epochs,
                                   out=str(out / ENSEMBLE / f"seed{seed}"))
        if is_main_rank():
            log.info(f"ensemble member {k + 1}/{cfg.ensemble}: seed {seed} -> "
                     f"{sub.options['out']}/")
        train(sub)

