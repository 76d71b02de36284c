"""Training utilities: losses, normalisers, the Trainer."""

from meshops.training.loss import RelativeLpLoss, relative_lp
from meshops.training.normalizer import UnitGaussianNormalizer

__all__ = ["RelativeLpLoss", "relative_lp", "UnitGaussianNormalizer"]
