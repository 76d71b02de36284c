"""The :class:`~meshops.training.Trainer`'s hooks: subclass :class:`Callback`, pass
``Trainer(callbacks=[...])``.

Three moments, in this order::

    on_fit_start(trainer)            once per fit(), after normalisers and resumed state
    on_epoch_end(trainer, entry)     after every epoch, once its checkpoints are written
    on_fit_end(trainer)              once, also when training stops early or fails

``entry`` is the epoch's history record (``epoch``, ``train_loss``, ``val_l2``,
``val``, ``lr``, ``time_s``; see :meth:`Trainer.fit`). Every rank calls the hooks,
so a callback that writes files or talks to a server does so on the main rank only
(``trainer.dist.is_main``), as :class:`~meshops.training.experiment.TensorBoardLogger`
and :class:`~meshops.training.experiment.MLflowLogger` do. A hook that raises stops
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

from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from meshops.training.trainer import Trainer

__all__ = ["Callback", "call"]


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
