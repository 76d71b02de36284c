"""The parts of training a run shared by its two kinds of data, mesh folders
(:mod:`meshops.fitting.train`) and time series (:mod:`meshops.fitting.series`): the model
built from the data's channels, the split of the files, the run folder's write check,
the epochs fitted to the time budget, and the training itself with its outcome."""

from __future__ import annotations

import difflib
import inspect
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from meshops.errors import CheckpointError, UsageError, os_reason
from meshops.fitting import trainer_options
from meshops.fitting.config import FIT, TrainConfig, option_name
from meshops.fitting.outcome import Training
from meshops.inference.predict import RUN_CHECKPOINT
from meshops.runs.choice import Choice
from meshops.runs.run_folder import RUN_CONFIG
from meshops.training.distributed import is_main_rank

if TYPE_CHECKING:  # for the annotations only
    from meshops.fitting.defaults import ThreadCheck

__all__ = ["INFERRED", "MEMORY_SHARE", "build_model", "check_writable_folder",
           "epochs_to_fit", "fit_memory", "run_training", "split_files"]

# Set from the data, never by model_config.
INFERRED = ("in_channels", "out_channels", "pos_dim", "param_channels")
log = logging.getLogger(__name__)


def build_model(name: str, model_config: dict, in_channels: int, out_channels: int,
                pos_dim: int, param_channels: int = 0, dtype=None, device=None,
                source: str = "command line"):
    """A registered model (:data:`meshops.models.MODELS`) with ``model_config`` and the
    channels, dimension and parameter count of the data; a key the model does not take
    is refused, as are parameters for a model that takes none, and a model whose
    training would not fit in the memory of ``device`` (checked on the meta device,
    before anything is allocated; ``dtype``: the training dtype; ``source``: whose words
    the errors use, :func:`~meshops.fitting.config.option_name`)."""
    from meshops.models import MODELS, count_parameters
    from meshops.utils.memory import module_bytes, skeleton, too_big

    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    cls = MODELS[name]
    params = inspect.signature(cls.__init__).parameters
    accepted = {k for k, p in params.items() if k != "self"
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    open_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    inferred = {"in_channels": in_channels, "out_channels": out_channels, "pos_dim": pos_dim,
                "param_channels": param_channels}
    if param_channels and "param_channels" not in accepted and not open_kw:
        raise UsageError(f"model {name!r} does not take parameter vectors "
                         f"({option_name('params', source)}): it has no param_channels "
                         f"argument")
    for key, value in model_config.items():
        if key in inferred:
            if value != inferred[key]:
                raise UsageError(f"model_config: {key} = {value!r} but the data has "
                               f"{inferred[key]} (it is set from the data; leave it out)")
        elif key not in accepted and not open_kw:
            close = difflib.get_close_matches(key, sorted(accepted - set(INFERRED)), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(f"model_config: unknown key {key!r} for model {name!r}{hint}; "
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
            raise UsageError(f"{described}: {why}; choose a smaller model_config")
        del shapes
        return cls(**kwargs)
    except UsageError:  # a ValueError too: said once, not wrapped again
        raise
    except (TypeError, ValueError) as e:
        raise UsageError(f"{described}: {e}") from None


def split_files(n: int, val_fraction: float | None, seed: int, data: str,
                source: str = "command line") -> tuple[list[int], list[int]]:
    """Deterministic train/validation indices of ``n`` files from the seed (``data``: the
    folder, named in the error when the split leaves nothing to train on; ``source``:
    whose words the error uses, :func:`~meshops.fitting.config.option_name`)."""
    from meshops.training.splits import validation_split

    try:
        return validation_split(n, val_fraction or 0.0, seed)
    except ValueError as e:
        raise UsageError(f"{data}: {e}; add files, pass "
                         f"{option_name('val_data', source, 'DIR')} or "
                         f"{option_name('val_fraction', source, '0')}") from None


def check_writable_folder(out: Path) -> None:
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
        raise UsageError(f"{out}: cannot write the run folder ({os_reason(e)})") from None


def epochs_to_fit(cfg: TrainConfig, model, samples, num_val: float
                  ) -> tuple[TrainConfig, str, "ThreadCheck | None"]:
    """``epochs`` (and ``threads``) when nobody set them: as many epochs as fit
    ``--minutes`` from one timed step on ``samples`` (``num_val``: the validation work in
    training samples' forwards), on the fewest threads nearly as fast as the fastest of
    one and all (:func:`meshops.fitting.defaults.epochs_to_fit`); returns the config,
    what was done (``""``: nothing) and, when the threads were chosen so, the
    :class:`~meshops.fitting.defaults.ThreadCheck` that times them again should the
    steps slow down (else ``None``; pass it to :func:`run_training`). A process of a
    data-parallel run times its own part of lazily read samples, and every process
    takes rank 0's choice (all must train the same epochs)."""
    import torch
    import torch.distributed as dist

    from meshops.fitting import defaults

    if cfg.epochs is not None:
        return cfg, "", None
    many = torch.get_num_threads()
    from meshops.training.dataset import own_part

    timed = own_part(samples)
    chosen = defaults.epochs_to_fit(model, timed, cfg.batch_size, cfg.minutes, num_val,
                                    cfg.threads)
    if dist.is_available() and dist.is_initialized():
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, chosen)
        chosen = every[0]
    epochs, threads, step, reason = chosen
    torch.set_num_threads(threads)
    check = None if cfg.threads is not None else defaults.ThreadCheck(
        model, timed, cfg.batch_size, step, many, math.ceil(num_val / cfg.batch_size),
        log.info if is_main_rank() else _quiet)
    return cfg.with_options("defaults", epochs=epochs, threads=threads), reason, check


def _quiet(line: str) -> None:
    """A log that says nothing (the processes other than the main one)."""


#: The share of the free memory a training step may plan to take (the rest: the data,
#: the mesh structures, the validation pass, other processes' growth).
MEMORY_SHARE = 0.8
#: A step planned above this share of the free memory is checkpointed when that brings
#: it under it: a step that takes most of a machine is ended by the kernel when other
#: processes grow, while recomputing costs little time (1.1-1.5x a step; the default
#: 3-D slice transformer at 1M points: 15.5 GB plain, 1.7 GB checkpointed).
COMFORTABLE_SHARE = 0.5


def fit_memory(cfg: TrainConfig, model, samples, source: str = "command line"
               ) -> tuple[TrainConfig, str]:
    """Check, before training, that a step on the largest training mesh fits the free
    memory of the device training uses (:mod:`meshops.training.footprint`, measured on
    that mesh): when it does not, or takes more than :data:`COMFORTABLE_SHARE` of it,
    but does (within that share) with the blocks' activations recomputed,
    ``checkpoint_blocks`` is turned on and said (``note``); when neither fits, a
    :class:`UsageError` says how much it would take, what is free and what would make
    it fit. Meshes below the probes' size, and machines whose peaks cannot be read, are
    not checked. A data-parallel run takes the first process's decision (all must
    train alike). ``source``: whose words the note and the error use (the command's
    flags, or :func:`meshops.fit`'s keywords: :func:`~meshops.fitting.config.option_name`).

    Returns:
        ``(cfg, note)``: the config (``checkpoint_blocks`` perhaps on) and what was done
        (``""``: nothing).
    """
    import torch.distributed as dist

    checkpoint, note, error = _memory_decision(cfg, model, samples, source)
    if dist.is_available() and dist.is_initialized():
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, (checkpoint, note, error))
        checkpoint, note, error = every[0]
    if error:
        raise UsageError(error)
    return (cfg.with_options("defaults", checkpoint_blocks=True) if checkpoint else cfg), note


def _memory_decision(cfg: TrainConfig, model, samples, source: str
                     ) -> tuple[bool, str, str]:
    """:func:`fit_memory`'s finding on this process: ``(turn checkpointing on, note,
    error)``."""
    import copy

    from meshops.training.distributed import check_device
    from meshops.training.footprint import largest_sample, step_memory
    from meshops.utils.memory import available_bytes, format_bytes

    device = check_device(cfg.device)
    free = available_bytes(device)
    if free is None:
        return False, "", ""
    sample, points = largest_sample(samples)
    # the Trainer moves the model to a GPU; the probes measure it there (on a copy)
    probe = copy.deepcopy(model).to(device) if device.type == "cuda" else model
    plain = step_memory(probe, sample, device, checkpoint=cfg.checkpoint_blocks)
    batch = cfg.batch_size
    if plain is None or plain.bytes(points, batch) <= COMFORTABLE_SHARE * free:
        return False, "", ""
    what = (f"a training step on the largest mesh ({points:,} points, batch {batch}) takes "
            f"about {format_bytes(plain.bytes(points, batch))}")
    ck = None if cfg.checkpoint_blocks else step_memory(probe, sample, device, checkpoint=True)
    checkpointing = option_name("checkpoint_blocks", source)
    fits = plain.bytes(points, batch) <= MEMORY_SHARE * free
    if ck is not None and ck.bytes(points, batch) <= (COMFORTABLE_SHARE if fits
                                                      else MEMORY_SHARE) * free:
        return True, (f"{what}, {format_bytes(free)} is free: the blocks' activations are "
                      f"recomputed in the backward pass ({checkpointing}), about "
                      f"{format_bytes(ck.bytes(points, batch))}"), ""
    if fits:
        return False, "", ""
    if ck is not None:
        what += f" ({format_bytes(ck.bytes(points, batch))} with {checkpointing})"
    return False, "", _memory_error(what, format_bytes(free), batch, source)


def _memory_error(what: str, free: str, batch: int, source: str) -> str:
    """Why a training step does not fit (``what`` it takes, ``free`` memory) and what
    would make it fit, in the words of ``source``."""
    fit = source == FIT
    smaller = f" a smaller {option_name('batch_size', source)}," if batch > 1 else ""
    width = 'model_config={"width": ...}' if fit else "--model-config width=..."
    return (f"{'fit()' if fit else 'train'}: {what} but {free} of memory is free; to fit:"
            f"{smaller} a narrower model ({width}), a machine with more memory, or meshes "
            f"coarsened for training (predicting on the fine ones afterwards)")


def run_training(request, cfg, model, train_samples, val_samples, chosen: str,
                 summary: str, begin, thread_check=None, **trainer_options) -> Training:
    """The end of training a run for a built model and its samples (mesh folders in
    :func:`meshops.fitting.train.train`, time series in :mod:`meshops.fitting.series`; ``cfg``
    with the model's full hyperparameters, as ``config.yaml`` records them; ``chosen``
    and ``summary``: what was chosen from the data, and the run in one line). A dry
    run ends here; otherwise ``begin()`` records the run's data and prepares its folder
    (returning the checkpoint metadata), ``config.yaml`` is written, the
    :class:`~meshops.training.Trainer` trains (``trainer_options``: the loss, ...;
    ``thread_check``: :func:`epochs_to_fit`'s, a callback too) and ``best.pt`` is
    left. Returns what was done: the history and the model kept."""
    training = Training(cfg, summary, choice=Choice(model.model_name, chosen),
                        dry_run=request.dry_run)
    if request.dry_run:
        return training
    main_rank = is_main_rank()
    out = Path(cfg.out)
    metadata = begin()
    _start_run(out, cfg.render(), chosen, summary, main_rank)
    trainer = _trainer(request.resume, cfg, model, train_samples, val_samples, metadata, main_rank,
                       trainer_options, thread_check)
    training.history = _fit(trainer, request)
    if trainer.dist.is_main:
        training.choice = _keep(trainer, training.history, model, metadata, out,
                                val_samples is None, chosen)
    return training


def _start_run(out: Path, resolved: str, chosen: str, summary: str, main_rank: bool) -> None:
    """The run's config.yaml written and what it trains said (main rank)."""
    from meshops.utils.atomic import atomic_write

    if main_rank:
        atomic_write(out / RUN_CONFIG, lambda tmp: Path(tmp).write_text(resolved))
        if chosen:
            log.info(f"defaults from the data: {chosen}")
        log.info(f"training {summary}; writing {out}/")


def _trainer(resume: bool, cfg, model, train_samples, val_samples, metadata: dict, main_rank: bool,
             options: dict, thread_check):
    """The :class:`~meshops.training.Trainer` of the run, with the loggers it asks for
    (``options``: the Trainer's other arguments; ``callbacks`` there replaces them) and
    the ``thread_check`` (if any)."""
    from meshops.training import Trainer
    from meshops.utils.progress import on_terminal

    out = Path(cfg.out)
    loggers = (trainer_options.callbacks(cfg, out, {**cfg.to_dict(),
                                                 "model_config": dict(model.config)})
               if main_rank else [])
    given = options.pop("callbacks", loggers)
    options = {"callbacks": [*given, *([thread_check] if thread_check else [])], **options}
    return Trainer(
        model, train_samples, val_samples, epochs=cfg.epochs, batch_size=cfg.batch_size,
        lr=cfg.lr, weight_decay=cfg.weight_decay, scheduler=cfg.schedule,
        grad_clip=cfg.grad_clip, seed=cfg.seed, device=cfg.device, out_dir=out,
        resume=resume, metadata=metadata, progress=on_terminal(), log=log,
        amp=cfg.amp or False, **options)


def _fit(trainer, request) -> list:
    """``trainer.fit()``, its failures as one line."""
    from meshops.training.loggers import LoggerError

    try:
        return trainer.fit()
    except FloatingPointError as e:
        raise UsageError(str(e)) from None
    except LoggerError as e:  # before the first epoch: nothing trained is lost
        flag = option_name("logger", request.source)
        raise UsageError(f"{option_name('logger', request.source, e.logger)}: {e}; repair or "
                         f"remove it, set MLFLOW_TRACKING_URI to another store, or choose "
                         f"another {flag}") from None
    except CheckpointError as e:  # a damaged, truncated or malicious RUN/last.pt
        raise UsageError(str(e)) from None
    except ValueError as e:
        if not request.resume:
            raise
        # e.g. RUN/last.pt was saved for another model config
        raise UsageError(str(e)) from None


def _keep(trainer, history: list, model, metadata: dict, out: Path, no_validation: bool,
          chosen: str) -> Choice:
    """The model the run keeps as best.pt (without validation data the last epoch's,
    saved here), said, or why there is none."""
    name = model.model_name
    if no_validation:
        # No validation data: best.pt is the final model, so that predict/evaluate
        # find it in the usual place.
        selected = "last epoch (no validation data)"
        model.save(out / RUN_CHECKPOINT, **metadata, epoch=trainer.epoch,
                   metric=None, val=None, selected=selected)
        log.info(f"no validation data: {out / RUN_CHECKPOINT} is the model after epoch "
                 f"{trainer.epoch}")
        return Choice(name, chosen, selected, epoch=trainer.epoch)
    best = trainer.best
    if history and best["epoch"] is None:
        last = history[-1]["val"] or {}
        why = (f"the model predicts non-finite values on {last['failed']} of "
               f"{last['n']} validation meshes" if last.get("failed") else
               f"{trainer.metric} is {last.get(trainer.metric)}")
        raise UsageError(f"no epoch had a finite validation error ({why}), so there is no "
                         f"best model: {out / RUN_CHECKPOINT} was not written; "
                         f"{out / 'last.pt'} holds the model after epoch {trainer.epoch}")
    if best["epoch"] is None:  # no epoch trained
        return Choice(name, chosen)
    log.info(f"best validation {trainer.metric} {best['value']:.4e} at epoch "
             f"{best['epoch']}: {out / RUN_CHECKPOINT}")
    return Choice(name, chosen, f"epoch {best['epoch']} of {trainer.epoch}: the lowest "
                  f"validation {trainer.metric}", trainer.metric, {name: best["value"]},
                  best["epoch"])
