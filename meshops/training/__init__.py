"""Training utilities: losses, normalisers, datasets, the Trainer, torchrun/DDP."""

from meshops.normalizer import UnitGaussianNormalizer
from meshops.training import distributed
from meshops.training.dataset import assemble, fit_normalizers, make_loader, prepare_batch
from meshops.training.loss import RelativeLpLoss, lp_errors, relative_lp, summarize_errors
from meshops.training.seed import seed_everything
from meshops.training.trainer import Trainer, targets_of

__all__ = ["RelativeLpLoss", "Trainer", "UnitGaussianNormalizer", "assemble", "distributed",
           "fit_normalizers", "lp_errors", "make_loader", "prepare_batch", "relative_lp",
           "seed_everything", "summarize_errors", "targets_of"]
