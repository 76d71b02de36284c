"""The training engine: the Trainer, losses, optimisers, callbacks, torchrun/DDP.

A :class:`Trainer` with hooks fits a model to samples: losses per target field
(:mod:`~meshops.training.loss`), optimisers and schedules (:mod:`~meshops.training.optim`),
the baselines every model is compared with (:mod:`~meshops.training.baselines`:
predictors that need no training, scored with the Trainer's metric), experiment
loggers, rollout samples of time series (:mod:`~meshops.training.rollout`), the memory
of a step and torchrun/DDP. It is usable alone, on samples of your own; fitting a run
from a folder of meshes, with its options chosen from the data, is
:mod:`meshops.fitting`.

Imports :mod:`meshops.models`, :mod:`meshops.inference` (a model's tensors, plots),
:mod:`meshops.datasets` and below; never the job (:mod:`meshops.runs`,
:mod:`meshops.fitting`) or the command line.
"""

from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.training import distributed
from meshops.training.dataset import assemble, fit_normalizers, make_loader, prepare_batch
from meshops.training.loss import RelativeLpLoss, lp_errors, relative_lp, summarize_errors
from meshops.training.seed import seed_everything
from meshops.training.trainer import Trainer, targets_of

__all__ = ["RelativeLpLoss", "Trainer", "UnitGaussianNormalizer", "assemble", "distributed",
           "fit_normalizers", "lp_errors", "make_loader", "prepare_batch", "relative_lp",
           "seed_everything", "summarize_errors", "targets_of"]
