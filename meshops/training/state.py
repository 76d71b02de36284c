"""The resumable state of a training run: what ``last.pt`` holds and how it is checked.

A ``last.pt`` is a model checkpoint (:meth:`~meshops.models.NeuralOperator.checkpoint_state`,
so :meth:`~meshops.models.NeuralOperator.from_checkpoint` loads it) with one more entry,
``training``: the optimiser, scheduler and grad-scaler states, the completed and
planned epochs, the seed, every rank's random-generator snapshot
(:func:`~meshops.training.seed.get_rng_state`), the history and the best validation
value so far. The :class:`~meshops.training.Trainer` writes it after every epoch and
reads it back to resume; what is saved, and what a loaded one must satisfy, is decided
here.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch

from meshops.errors import CheckpointError
from meshops.utils.checkpoint import (
    check_finite,
    check_model_keys,
    check_normalizer_scales,
    first_line,
    read_checkpoint,
)

# Exceptions that torch's load_state_dict and the RNG setters raise on a state that
# does not fit: turned into a CheckpointError naming the file.
_LOAD_ERRORS = (KeyError, TypeError, ValueError, RuntimeError, IndexError)


def training_entry(*, epoch: int, epochs: int, seed: int, world_size: int,
                   optimizer: torch.optim.Optimizer, scheduler: Any, scaler: Any,
                   rng: list, history: list, best: dict) -> dict[str, Any]:
    """The ``training`` entry of ``last.pt`` (checked by :func:`check_training_entry`).

    The optimiser's and scheduler's classes are recorded by name, so that a run is not
    resumed with another kind of optimiser whose state happens to load.
    """
    return {
        "epoch": epoch, "epochs": epochs, "seed": seed, "world_size": world_size,
        "optimizer": optimizer.state_dict(),
        "optimizer_class": type(optimizer).__name__,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scheduler_class": type(scheduler).__name__ if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng, "history": history, "best": best,
    }


def read_training_state(path: Path) -> dict:
    """The checkpoint at ``path`` (a ``last.pt``), checked as a training state.

    The same checks as :meth:`NeuralOperator.from_checkpoint` (archive CRCs, plain
    pickle, finite weights), and a complete training entry with finite optimiser
    moments: a damaged last.pt must stop the run, not continue it from garbage.

    Raises:
        CheckpointError: naming ``path`` and what is wrong.
    """
    # (here, not at the top: importing meshops.training need not import every model)
    from meshops.models.base import CHECKPOINT_FORMAT

    state = read_checkpoint(path)
    if "training" not in state:
        raise CheckpointError(f"{path}: not a meshops training state (no 'training')")
    check_model_keys(state, path, CHECKPOINT_FORMAT)
    check_training_entry(state["training"], path)
    check_finite(state["state_dict"], path)
    check_normalizer_scales(state["state_dict"], path)
    check_finite(state["training"]["optimizer"], path, "training.optimizer")
    return state


def check_training_entry(tr: Any, path: Path) -> dict:
    """Keys and types of the ``training`` entry of ``last.pt`` (see :func:`training_entry`).

    Raises:
        CheckpointError: naming ``path`` and the missing or wrong key.
    """
    if not isinstance(tr, dict):
        raise CheckpointError(f"{path}: 'training' is a {type(tr).__name__}, not a dict")
    kinds = {"epoch": int, "epochs": int, "seed": int, "world_size": int, "optimizer": dict,
             "rng": list, "history": list, "best": dict}
    for key, kind in kinds.items():
        if key not in tr:
            raise CheckpointError(f"{path}: incomplete training state: no 'training.{key}'")
        if not isinstance(tr[key], kind) or isinstance(tr[key], bool):
            raise CheckpointError(f"{path}: training.{key} is a {type(tr[key]).__name__}, "
                                  f"expected {kind.__name__}")
    for key in ("scheduler", "scaler"):
        if tr.get(key) is not None and not isinstance(tr[key], dict):
            raise CheckpointError(f"{path}: training.{key} is a {type(tr[key]).__name__}")
    # (absent in states written before they were recorded)
    for key in ("optimizer_class", "scheduler_class"):
        if tr.get(key) is not None and not isinstance(tr[key], str):
            raise CheckpointError(f"{path}: training.{key} is a {type(tr[key]).__name__}")
    if not 0 <= tr["epoch"] <= tr["epochs"] or tr["world_size"] < 1:
        raise CheckpointError(f"{path}: training state says epoch {tr['epoch']} of "
                              f"{tr['epochs']} on {tr['world_size']} process(es)")
    if len(tr["rng"]) != tr["world_size"] or len(tr["history"]) != tr["epoch"]:
        raise CheckpointError(f"{path}: training state of {tr['epoch']} epoch(s) on "
                              f"{tr['world_size']} process(es) holds {len(tr['history'])} "
                              f"history entries and {len(tr['rng'])} generator states")
    return tr


def check_resume_epochs(path: Path, training: dict, epochs: int, scheduled: bool) -> None:
    """Refuse to resume the run of ``path`` for another number of epochs.

    A learning-rate schedule (cosine, one-cycle, a callable) is laid out over the
    epochs the run was started with: resuming it for more epochs would run the
    cosine past its end, where the rate climbs back up (one-cycle stops with an
    error), and for fewer it would stop before the rate has decayed. Neither is a
    run of ``epochs`` epochs, so it is refused; the same ``epochs`` continue the
    exact schedule. Without a schedule (a constant rate, before and now) nothing
    depends on the count and the run is simply extended or stopped earlier.

    Args:
        path: The ``last.pt`` (named in the error).
        training: Its ``training`` entry (see :func:`read_training_state`).
        epochs: The number of epochs asked for now.
        scheduled: Whether the resumed run has a learning-rate schedule.

    Raises:
        ValueError: when the counts differ and either run has a schedule.
    """
    saved, had_schedule = training["epochs"], training.get("scheduler") is not None
    if saved == epochs or not (scheduled or had_schedule):
        return
    why = ("its learning-rate schedule ends there" if had_schedule else
           "without a learning-rate schedule, and one cannot start in its middle")
    raise ValueError(
        f"{path}: the run was started for {saved} epochs ({training['epoch']} done) "
        f"{'and ' if had_schedule else ''}{why}, so it cannot be resumed for {epochs} "
        f"epochs; resume it with {saved} epochs, or train {epochs} epochs in a new run")


@contextlib.contextmanager
def checkpoint_errors(path: Path, what: str) -> Iterator[None]:
    """Turn the errors of loading a state that does not fit into a CheckpointError."""
    try:
        yield
    except _LOAD_ERRORS as e:
        raise CheckpointError(f"{path}: {what} ({type(e).__name__}: {first_line(e)})") from None


def load_optimizer_states(path: Path, training: dict, optimizer: torch.optim.Optimizer,
                          scheduler: Any, scaler: Any) -> None:
    """Load the optimiser, scheduler and grad-scaler states of ``training``.

    Raises:
        ValueError: the run was saved with another optimiser or scheduler class (its
            state could load into this one and silently mean something else).
        CheckpointError: a state that does not fit (other parameters, a damaged entry).
    """
    for key, obj in (("optimizer", optimizer), ("scheduler", scheduler)):
        saved = training.get(f"{key}_class")
        if saved is not None and obj is not None and saved != type(obj).__name__:
            raise ValueError(f"{path}: the run was saved with {key} {saved}, cannot resume "
                             f"it with {type(obj).__name__}")
    with checkpoint_errors(path, "the optimizer/scheduler state does not fit this run"):
        optimizer.load_state_dict(training["optimizer"])
        if scheduler is not None and training["scheduler"] is not None:
            scheduler.load_state_dict(training["scheduler"])
        if scaler is not None and training["scaler"] is not None:
            scaler.load_state_dict(training["scaler"])


def rank_rng_state(path: Path, training: dict, rank: int, world_size: int
                   ) -> dict[str, Any] | None:
    """This rank's random-generator snapshot to restore, or ``None`` (with a warning)
    when the run was saved on another number of processes: the caller then re-seeds."""
    if training["world_size"] == world_size:
        return training["rng"][rank]
    warnings.warn(f"{path}: saved on {training['world_size']} processes, resuming on "
                  f"{world_size}; random streams are re-seeded", UserWarning, stacklevel=5)
    return None
