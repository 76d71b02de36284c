"""Training utilities: losses, normalisers, datasets, the Trainer, torchrun/DDP.

A :class:`Trainer` with hooks fits a model to samples: losses per target field
(:mod:`~meshops.training.loss`), defaults chosen from the data
(:mod:`~meshops.training.defaults`), the baselines every run is compared with
(:mod:`~meshops.training.baselines`), fitting a reduced basis or a trajectory basis
with its regression chosen on validation (:mod:`~meshops.training.fit_reduced`,
:mod:`~meshops.training.fit_trajectory`), rollouts of time series and
torchrun/DDP.

Imports :mod:`meshops.models`, :mod:`meshops.inference` (a model's tensors, plots),
:mod:`meshops.datasets` and below; never the whole job (:mod:`meshops.runs`) or the
command line.
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
