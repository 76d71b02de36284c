"""Input checks shared by the search functions.

Every check raises :class:`meshops.errors.MeshError` with a message that starts with
the calling function and names the offending argument, so that a failure deep inside
a model still points at the input that caused it.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Optional, Sequence

import torch
from torch import Tensor

from meshops.errors import MeshError

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def check_points(t: object, name: str, fn: str) -> Tensor:
    """Check that ``t`` is a finite floating ``[N, d]`` tensor with ``d >= 1``."""
    if not isinstance(t, Tensor):
        raise MeshError(f"{fn}: {name} must be a torch.Tensor of shape [N, d], "
                        f"got {type(t).__name__}")
    if t.dim() != 2:
        raise MeshError(f"{fn}: {name} must be a 2-D tensor [N, d], got shape {tuple(t.shape)}")
    if t.shape[1] < 1:
        raise MeshError(f"{fn}: {name} must have at least one coordinate column, "
                        f"got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        # Integer coordinates are refused rather than cast: a silent cast to float32
        # would lose exactness above 2**24 and hide a probable mix-up of arguments.
        raise MeshError(f"{fn}: {name} must have a floating dtype, got {t.dtype}")
    finite = torch.isfinite(t).all(dim=1)
    if t.shape[0] and not bool(finite.all()):
        row = int((~finite).nonzero()[0, 0])
        raise MeshError(f"{fn}: {name} contains NaN or inf coordinates (first at row {row})")
    return t


def check_same_dim(x: Tensor, y: Tensor, fn: str) -> None:
    """Check that ``x`` and ``y`` live in the same space and on the same device."""
    if x.shape[1] != y.shape[1]:
        raise MeshError(f"{fn}: x and y must have the same number of coordinates, "
                        f"got x with d={x.shape[1]} and y with d={y.shape[1]}")
    if x.device != y.device:
        raise MeshError(f"{fn}: x and y must be on the same device, "
                        f"got x on {x.device} and y on {y.device}")


def check_batch(batch: Optional[object], n: int, name: str, fn: str,
                device: torch.device) -> Optional[Tensor]:
    """Check a PyG batch vector: integer, ``[n]``, non-negative and sorted.

    Returns:
        The batch vector as int64 on ``device``, or None when ``batch`` is None.
    """
    if batch is None:
        return None
    if not isinstance(batch, Tensor):
        raise MeshError(f"{fn}: {name} must be a LongTensor [N] or None, "
                        f"got {type(batch).__name__}")
    if batch.dim() != 1 or batch.dtype not in _INT_DTYPES:
        raise MeshError(f"{fn}: {name} must be a 1-D integer tensor, "
                        f"got dtype {batch.dtype} and shape {tuple(batch.shape)}")
    if batch.shape[0] != n:
        raise MeshError(f"{fn}: {name} has length {batch.shape[0]} but there are {n} points")
    if batch.device != device:
        raise MeshError(f"{fn}: {name} is on {batch.device} but the points are on {device}")
    batch = batch.long()
    if n:
        if int(batch[0]) < 0:
            raise MeshError(f"{fn}: {name} must be non-negative, got {int(batch[0])}")
        # Samples are read as contiguous slices (PyG's ptr layout); an unsorted vector
        # would silently mix samples, so it is refused.
        down = batch[1:] < batch[:-1]
        if bool(down.any()):
            i = int(down.nonzero()[0, 0]) + 1
            raise MeshError(f"{fn}: {name} must be sorted (PyG batch vector), but "
                            f"{name}[{i}]={int(batch[i])} < {name}[{i - 1}]={int(batch[i - 1])}")
    return batch


def num_samples(*batches: Optional[Tensor]) -> int:
    """Number of samples ``B`` spanned by the batch vectors (1 when all are None)."""
    b = 1
    for t in batches:
        if t is not None and t.numel():
            b = max(b, int(t[-1]) + 1)
    return b


def sample_ptr(batch: Optional[Tensor], n: int, b: int) -> list[int]:
    """CSR pointer ``[B + 1]`` (Python ints) of the contiguous sample slices."""
    if batch is None:
        return [0, n] + [n] * (b - 1)
    counts = torch.bincount(batch, minlength=b).cpu()
    return [0] + torch.cumsum(counts, 0).tolist()


def check_int(value: object, name: str, fn: str, *, minimum: int) -> int:
    """Check that ``value`` is an integer ``>= minimum`` (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise MeshError(f"{fn}: {name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise MeshError(f"{fn}: {name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_real(value: object, name: str, fn: str) -> float:
    """Check that ``value`` is a finite real number (bool refused)."""
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise MeshError(f"{fn}: {name} must be a finite number, got {value!r}")
    return float(value)


def per_sample_ints(value: object, name: str, fn: str, b: int) -> Sequence[int]:
    """Broadcast an int, or check a length-``B`` sequence / 1-D tensor of ints."""
    if isinstance(value, Tensor):
        if value.dim() == 0:
            value = value.item()
        elif value.dim() == 1 and not value.is_floating_point():
            value = value.tolist()
        else:
            raise MeshError(f"{fn}: {name} must be an int or a 1-D integer tensor with one "
                            f"entry per sample, got shape {tuple(value.shape)} {value.dtype}")
    if isinstance(value, Integral) and not isinstance(value, bool):
        return [int(value)] * b
    if isinstance(value, (list, tuple)):
        if len(value) != b:
            raise MeshError(f"{fn}: {name} has {len(value)} entries but there are {b} samples")
        for v in value:
            if isinstance(v, bool) or not isinstance(v, Integral):
                raise MeshError(f"{fn}: {name} must contain integers, got {v!r}")
        return [int(v) for v in value]
    raise MeshError(f"{fn}: {name} must be an int or one int per sample, got {value!r}")
