"""Farthest point sampling, batch-aware, by ratio or by count."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from meshops.errors import MeshError
from meshops.search.backends import get_backend, resolve_backend
from meshops.utils.checks import (
    check_batch,
    check_pos,
    check_real,
    num_samples,
    per_sample_ints,
    sample_ptr,
)

#: Products ``ratio * n`` within this relative distance of an integer count as that
#: integer, so that e.g. ``0.1 * 30`` (3.0000000000000004 in float64) gives 3 samples,
#: not 4 - the count torch_cluster's float32 arithmetic gives.
_RATIO_RTOL = 1e-9


def ratio_count(ratio: float, n: int) -> int:
    """Samples drawn from ``n`` points at ``ratio``: ``ceil(ratio * n)`` (robustly)."""
    c = ratio * n
    return math.ceil(c - _RATIO_RTOL * c)


def fps(pos: Tensor, batch: Optional[Tensor] = None, ratio: Optional[float] = None,
        num: Union[int, Sequence[int], Tensor, None] = None, *,
        start: Union[int, Sequence[int], Tensor, None] = None, random_start: bool = False,
        backend: Optional[str] = None) -> Tensor:
    """Farthest point sampling: greedy max-min subsets of every sample.

    From the start point, each step adds the point farthest from those already
    chosen. Backends ``"torch"`` and ``"torch_cluster"`` run the exact greedy loop;
    ``"fpsample"`` (CPU default) runs QuickFPS, which returns the same sequence up to
    float32 rounding (near-equal distances may be taken in the other order).
    With the ``"fpsample"`` and ``"torch"`` backends the returned indices are distinct
    even when a sample has fewer distinct points than requested (duplicates are then
    taken, lowest index first); torch_cluster may repeat an index in that case.

    Args:
        pos: Points.
        batch: Sorted sample index (PyG batch vector), or None for one sample.
        ratio: Fraction in ``(0, 1]``; each sample of ``n`` points gives
            ``ceil(ratio * n)`` points, as torch_cluster (products within 1e-9 of an
            integer are rounded to it first).
        num: Number of points per sample: an int, or one int per sample. Exactly one of
            ``ratio`` and ``num`` must be given.
        start: Start point per sample, as a *local* index within the sample: an int
            for all samples or one per sample. Default 0.
        random_start: Draw each start uniformly with torch's global RNG (so
            ``torch.manual_seed`` reproduces it). Exclusive with ``start``.
        backend: ``"fpsample"``, ``"torch"``, ``"torch_cluster"`` or None for
            :func:`~meshops.search.default_backend` ``("fps", pos.device)``
            (fpsample is skipped for ``d > 8``).

    Returns:
        LongTensor of global indices into ``pos``, the samples concatenated in batch
        order, each in selection order (its first entry is its start point).

    Raises:
        MeshError: Bad ``pos`` or ``batch`` (see :func:`knn`); neither or both of
            ``ratio``/``num``; ``ratio`` outside ``(0, 1]``; ``num < 1`` or larger than
            the points of a sample; ``start`` out of range, or given together with
            ``random_start``; an unknown or unavailable backend.

    Shapes:
        - pos: ``[N, d]``
        - batch: ``[N]``
        - output: ``[S]``, ``S = sum_b ceil(ratio * n_b)`` or ``sum_b num_b``
    """
    fn = "fps"
    check_pos(pos, "pos", fn, finite=True)
    batch = check_batch(batch, pos.shape[0], "batch", fn, pos.device)
    b = num_samples(batch)
    ptr = sample_ptr(batch, pos.shape[0], b)
    sizes = [ptr[i + 1] - ptr[i] for i in range(b)]

    counts = _counts(ratio, num, sizes, fn)
    starts = _starts(start, random_start, sizes, counts, fn)
    name = resolve_backend("fps", backend, pos.device, fn, dim=pos.shape[1])
    return get_backend(name).fps(pos, ptr, counts, starts)


def _counts(ratio, num, sizes: list, fn: str) -> list[int]:
    """The points to sample from each sample (of ``sizes`` points): from ``ratio`` or
    ``num``, exactly one given, checked."""
    if (ratio is None) == (num is None):
        raise MeshError(f"{fn}: give exactly one of ratio and num, got "
                        f"ratio={ratio!r} and num={num!r}")
    if ratio is not None:
        ratio = check_real(ratio, "ratio", fn)
        if not 0.0 < ratio <= 1.0:
            raise MeshError(f"{fn}: ratio must be in (0, 1], got {ratio}")
        counts = [ratio_count(ratio, n) for n in sizes]
    else:
        counts = list(per_sample_ints(num, "num", fn, len(sizes)))
        for i, (c, n) in enumerate(zip(counts, sizes)):
            if c < 1:
                raise MeshError(f"{fn}: num must be >= 1, got {c} for sample {i}")
            if c > n:
                raise MeshError(f"{fn}: num={c} exceeds the number of points in "
                                f"sample {i} ({n})")
    return counts


def _starts(start, random_start: bool, sizes: list, counts: list, fn: str) -> list[int]:
    """Each sample's local start index: 0, ``start`` (checked), or drawn."""
    if random_start:
        if start is not None:
            raise MeshError(f"{fn}: give start or random_start=True, not both")
        starts = [int(torch.randint(n, ())) if n else 0 for n in sizes]
    elif start is None:
        starts = [0] * len(sizes)
    else:
        starts = list(per_sample_ints(start, "start", fn, len(sizes)))
        for i, (s, n, c) in enumerate(zip(starts, sizes, counts)):
            if c and not 0 <= s < n:
                raise MeshError(f"{fn}: start={s} is out of range for sample {i} "
                                f"with {n} points (local indices 0..{n - 1})")
    return starts
