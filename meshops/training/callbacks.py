"""The :class:`~meshops.training.Trainer`'s hooks: subclass :class:`Callback`, pass
``Trainer(callbacks=[...])``. The Trainer's own checkpoints (:class:`Checkpoints`) and
its line per epoch (:class:`EpochLog`) are callbacks too; they run before the ones
passed in.

Three moments, in this order::

    on_fit_start(trainer)            once per fit(), after normalisers and resumed state
    on_epoch_end(trainer, entry)     after every epoch, once its checkpoints are written
    on_fit_end(trainer)              once, also when training stops early or fails

``entry`` is the epoch's history record (``epoch``, ``train_loss``, ``val_l2``,
``val``, ``lr``, ``time_s``; see :meth:`Trainer.fit`). Every rank calls the hooks,
so a callback that writes files or talks to a server does so on the main rank only
(``trainer.dist.is_main``), as :class:`~meshops.training.loggers.TensorBoardLogger`
and :class:`~meshops.training.loggers.MLflowLogger` do. A hook that raises stops
the training (``on_fit_end`` still runs). A checkpoint every ``k`` epochs, for
example::

    class EveryK(Callback):
        def __init__(self, k, folder):
            self.k, self.folder = k, Path(folder)

        def on_epoch_end(self, trainer, entry):
            if trainer.dist.is_main and entry["epoch"] % self.k == 0:
                trainer.model.save(self.folder / f"epoch{entry['epoch']}.pt",
                                   epoch=entry["epoch"])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from meshops.training import distributed, state
from meshops.training.seed import get_rng_state
from meshops.utils.atomic import atomic_write

if TYPE_CHECKING:  # for the annotations only
    from meshops.training.trainer import Trainer

__all__ = ["BEST", "Callback", "Checkpoints", "EpochLog", "HISTORY", "LAST", "call"]

LAST = "last.pt"
BEST = "best.pt"
HISTORY = "history.json"


class Callback:
    """Base class of the Trainer's hooks; every method does nothing by default."""

    def on_fit_start(self, trainer: "Trainer") -> None:
        """Before the first epoch of :meth:`~meshops.training.Trainer.fit`."""

    def on_epoch_end(self, trainer: "Trainer", entry: dict[str, Any]) -> None:
        """After an epoch, its validation and its checkpoints."""

    def on_fit_end(self, trainer: "Trainer") -> None:
        """After the last epoch (or an early stop, or an error)."""


def call(callbacks: Iterable[Callback], hook: str, *args: Any) -> None:
    """Call ``hook`` on every callback, in order."""
    for cb in callbacks:
        getattr(cb, hook)(*args)


def improved(trainer: "Trainer", entry: dict[str, Any]) -> bool:
    """Whether the epoch of ``entry`` is the best validated one so far."""
    return entry["val"] is not None and trainer.best["epoch"] == entry["epoch"]


class Checkpoints(Callback):
    """The Trainer's files in ``out_dir``, written atomically after every epoch:
    ``best.pt`` when the validation error improved (:meth:`NeuralOperator.save` with the
    ``metadata``, ``epoch``, ``metric`` and the validation metrics), ``history.json`` and
    ``last.pt`` (the model and the full training state,
    :mod:`meshops.training.state`). Every rank takes part in ``last.pt`` (its random
    generator states are gathered); the main rank writes."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)

    def on_epoch_end(self, trainer: "Trainer", entry: dict[str, Any]) -> None:
        if trainer.dist.is_main:
            if improved(trainer, entry):
                trainer.model.save(self.out_dir / BEST, **{
                    **trainer.metadata, "epoch": entry["epoch"], "metric": trainer.metric,
                    "val": entry["val"]})
            atomic_write(self.out_dir / HISTORY, lambda tmp: Path(tmp).write_text(
                json.dumps(trainer.history, indent=1)))
        self.save_state(trainer)

    def save_state(self, trainer: "Trainer") -> None:
        """``last.pt``: the model's checkpoint with the training state."""
        rng = distributed.all_gather_objects(get_rng_state(), trainer.dist)
        if not trainer.dist.is_main:
            return
        training = state.training_entry(
            epoch=trainer.epoch, epochs=trainer.epochs, seed=trainer.seed,
            world_size=trainer.dist.world_size if trainer.dist.active else 1,
            optimizer=trainer.optimizer, scheduler=trainer.scheduler, scaler=trainer.scaler,
            rng=rng, history=trainer.history, best=trainer.best)
        saved = dict(trainer.model.checkpoint_state(**trainer.metadata, epoch=trainer.epoch),
                     training=training)
        atomic_write(self.out_dir / LAST, lambda tmp: torch.save(saved, tmp))


class EpochLog(Callback):
    """The Trainer's line per epoch (``log``: a ``str -> None`` callable; the main rank's
    only): training loss, the validation errors, the learning rate, the time."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log

    def on_epoch_end(self, trainer: "Trainer", entry: dict[str, Any]) -> None:
        val = entry["val"]
        msg = f"epoch {entry['epoch']}/{trainer.epochs}  train {entry['train_loss']:.4e}"
        if val is not None:
            msg += (f"  val l2 {val['l2_mean']:.4e} (median {val['l2_median']:.4e}, "
                    f"max {val['l2_max']:.4e}; unweighted {val['l2_unweighted_mean']:.4e})")
            fields = val.get("fields") or {}
            if fields:
                msg += " [" + ", ".join(f"{f} {v['l2_mean']:.4e}" for f, v in fields.items()) \
                    + "]"
            if val.get("failed"):
                msg += f"  non-finite prediction on {val['failed']} of {val['n']}"
        msg += (f"  lr {entry['lr']:.2e}  {entry['time_s']:.1f}s"
                + ("  *best*" if improved(trainer, entry) else ""))
        self.log(msg)
