"""Train/test index arithmetic of the Geo-FNO benchmarks.

The published splits are

* Elasticity: train ``[:1000]``, test ``[-200:]`` (the last 200 of 2000 samples),
* NACA airfoil: train ``[:1000]``, test ``[1000:1200]``,

i.e. a training block at the front and a test block either at the end of the file
(``test_at_end=True``) or right after the training block. The sizes are parameters
so that small files (tests, subsets) can use the same code path.
"""

from __future__ import annotations

from meshops.errors import MeshError

SPLITS = ("train", "test", "all")


def split_indices(num_samples: int, split: str, n_train: int, n_test: int,
                  test_at_end: bool) -> range:
    """Sample indices (positions in the files) of a split.

    Args:
        num_samples: Number of samples in the files.
        split: ``"train"``, ``"test"`` or ``"all"``.
        n_train: Size of the training block ``[:n_train]``.
        n_test: Size of the test block.
        test_at_end: Test block is ``[-n_test:]`` (Elasticity) instead of
            ``[n_train:n_train + n_test]`` (NACA).

    Returns:
        A ``range`` of sample indices.

    Raises:
        MeshError: unknown split, negative sizes, a block that needs more samples than
            the files hold, or (for ``test_at_end``) train and test blocks that overlap.

    Example:
        >>> split_indices(2000, "test", 1000, 200, test_at_end=True)
        range(1800, 2000)
        >>> split_indices(1200, "test", 1000, 200, test_at_end=False)
        range(1000, 1200)
    """
    if split not in SPLITS:
        raise MeshError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if n_train < 0 or n_test < 0:
        raise MeshError(f"n_train and n_test must be >= 0, got {n_train} and {n_test}")
    if split == "all":
        return range(num_samples)
    if test_at_end:
        train, test = range(0, n_train), range(num_samples - n_test, num_samples)
        test_desc = f"[-{n_test}:]"
    else:
        train, test = range(0, n_train), range(n_train, n_train + n_test)
        test_desc = f"[{n_train}:{n_train + n_test}]"
    need = n_train if split == "train" else (n_test if test_at_end else n_train + n_test)
    if need > num_samples:
        desc = f"[:{n_train}]" if split == "train" else test_desc
        raise MeshError(f"split {split!r} = samples {desc} needs {need} samples but the files "
                        f"hold {num_samples}; pass smaller n_train=/n_test=")
    if test_at_end and split in ("train", "test") and n_train + n_test > num_samples:
        raise MeshError(f"train [:{n_train}] and test [-{n_test}:] overlap in {num_samples} "
                        "samples; pass smaller n_train=/n_test=")
    return train if split == "train" else test
