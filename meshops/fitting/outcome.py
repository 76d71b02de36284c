"""What fitting a run gives back (:func:`meshops.fitting.train.train`): its options,
history and choice of model as one :class:`Training`; :func:`meshops.fit` returns the
trained :class:`~meshops.runs.run.Run`, which holds the ``history`` and ``choice``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshops.fitting.config import TrainConfig
from meshops.runs.choice import Choice


@dataclass
class Training:
    """What a training run did (:func:`meshops.fitting.train.train`).

    Attributes:
        config: The options, those chosen from the data included, and the model's full
            hyperparameters in ``model_config``: what ``RUN/config.yaml`` holds
            (``config.render()``) and ``--dry-run`` prints.
        summary: One line on the model, the data and the fields (``""`` where the run
            says none).
        history: The Trainer's records, one per epoch (``epoch``, ``train_loss``,
            ``val_l2``, ``val``, ``lr``, ``time_s``: :meth:`meshops.training.Trainer.fit`);
            empty for a fitted model (reduced or trajectory basis) and a dry run.
        choice: The model kept, why, and its validation figures.
        dry_run: Nothing was trained or written.
    """

    config: TrainConfig
    summary: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    choice: Choice | None = None
    dry_run: bool = False
