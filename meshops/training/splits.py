"""A deterministic train/validation split of training samples."""

from __future__ import annotations

import numpy as np


def validation_split(n: int, fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Indices ``(train, val)`` of ``n`` training samples, ``val`` a random
    ``fraction`` of them (at least one when ``fraction > 0``) drawn from ``seed``.

    The validation samples pick the checkpoint (``best.pt``), so the test samples
    never take part in training or selection.

    Args:
        n: Number of training samples.
        fraction: Share held out for validation, in ``[0, 1)``; ``0`` holds none out.
        seed: Seed of the permutation (same seed, same split).

    Returns:
        Two sorted, disjoint index lists covering ``range(n)``.

    Raises:
        ValueError: ``fraction`` outside ``[0, 1)``, or too few samples to keep at
            least one for training.

    Example:
        >>> validation_split(10, 0.2, seed=0)[1]
        [4, 6]
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction}")
    if not fraction:
        return list(range(n)), []
    n_val = max(1, int(round(fraction * n)))
    if n - n_val < 1:
        raise ValueError(f"{n} sample(s) cannot be split into training and validation sets "
                         f"(validation fraction {fraction})")
    perm = np.random.default_rng(seed).permutation(n)
    return sorted(int(i) for i in perm[n_val:]), sorted(int(i) for i in perm[:n_val])
