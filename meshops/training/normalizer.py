"""Old home of :class:`~meshops.normalizer.UnitGaussianNormalizer`, kept importable.

The normaliser moved to :mod:`meshops.normalizer` (it belongs with the data, and
:mod:`meshops.models` must not import :mod:`meshops.training`). This name stays so
that user code and pickles that name ``meshops.training.normalizer`` still load.
"""

from meshops.normalizer import UnitGaussianNormalizer

__all__ = ["UnitGaussianNormalizer"]
