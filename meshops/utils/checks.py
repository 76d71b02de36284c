"""The input checks of the whole library, one function per kind of input.

Positions (:func:`check_pos`), PyG batch vectors (:func:`check_batch`), quadrature
weights (:func:`check_weight`), lengths and scalars: the search functions, the layers'
:func:`~meshops.nn.batch_points` and the models' :func:`~meshops.models.inputs.read_inputs`
all check through these, so one kind of bad input gets one message wherever it enters.
Every failure raises :class:`meshops.errors.MeshError` (a ``ValueError``) naming the
argument, prefixed with the calling function where one is given (``where``), so that a
failure deep inside a model still points at the input that caused it.

A check that reads tensor values is a host synchronisation and, under
:func:`torch.compile`, a graph break. :func:`checking` is the one place that decides
whether such checks run: always in eager calls, never while ``torch.compile`` traces
(a compiled forward trusts the values of its inputs; eager calls check them).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Optional, Sequence

import torch
from torch import Tensor

from meshops.errors import MeshError

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def checking() -> bool:
    """Whether the library reads tensor values on the host (value checks, branches on
    data): always in eager mode, never while ``torch.compile`` traces."""
    return not torch.compiler.is_compiling()


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def check_pos(t: object, name: str = "pos", where: str = "", n: Optional[int] = None,
              finite: bool = False) -> Tensor:
    """Check that ``t`` is a floating ``[N, d]`` tensor with ``d >= 1`` (``N = n`` when
    given) and, with ``finite`` (when :func:`checking`), that its values are finite."""
    p = _prefix(where)
    if not isinstance(t, Tensor):
        raise MeshError(f"{p}{name} must be a torch.Tensor of shape [N, d], "
                        f"got {type(t).__name__}")
    if t.dim() != 2:
        raise MeshError(f"{p}{name} must be a 2-D tensor [N, d], got shape {tuple(t.shape)}")
    if t.shape[1] < 1:
        raise MeshError(f"{p}{name} must have at least one coordinate column, "
                        f"got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        # Integer coordinates are refused rather than cast: a silent cast to float32
        # would lose exactness above 2**24 and hide a probable mix-up of arguments.
        raise MeshError(f"{p}{name} must have a floating dtype, got {t.dtype}")
    if n is not None:
        check_length(t, n, name, where)
    if finite and t.shape[0] and checking():
        ok = torch.isfinite(t).all(dim=1)
        if not bool(ok.all()):
            row = int((~ok).nonzero()[0, 0])
            raise MeshError(f"{p}{name} contains NaN or inf coordinates (first at row {row})")
    return t


def check_same_dim(x: Tensor, y: Tensor, where: str) -> None:
    """Check that ``x`` and ``y`` live in the same space and on the same device."""
    if x.shape[1] != y.shape[1]:
        raise MeshError(f"{where}: x and y must have the same number of coordinates, "
                        f"got x with d={x.shape[1]} and y with d={y.shape[1]}")
    if x.device != y.device:
        raise MeshError(f"{where}: x and y must be on the same device, "
                        f"got x on {x.device} and y on {y.device}")


def check_length(t: Optional[Tensor], n: int, name: str, where: str = "") -> None:
    """``t`` (if given) must have ``n`` rows."""
    if t is not None and t.shape[0] != n:
        raise MeshError(f"{_prefix(where)}{name} has {t.shape[0]} rows, expected {n}")


def check_batch(batch: Optional[object], n: int, name: str = "batch", where: str = "",
                device: Optional[torch.device] = None) -> Optional[Tensor]:
    """The one check of a PyG batch vector: an integer ``[n]`` tensor (on ``device``
    when given), non-negative and sorted (the values when :func:`checking`).

    Samples are read as contiguous slices (PyG's ``ptr`` layout); an unsorted vector
    would silently mix samples, so it is refused.

    Returns:
        The batch vector as int64 (the same tensor when it is int64 already), or None
        when ``batch`` is None.
    """
    if batch is None:
        return None
    p = _prefix(where)
    if not isinstance(batch, Tensor):
        raise MeshError(f"{p}{name} must be a LongTensor [N] or None, "
                        f"got {type(batch).__name__}")
    if batch.dim() != 1 or batch.dtype not in _INT_DTYPES:
        raise MeshError(f"{p}{name} must be a 1-D integer tensor of sample indices, "
                        f"got dtype {batch.dtype} and shape {tuple(batch.shape)}")
    if batch.shape[0] != n:
        raise MeshError(f"{p}{name} has length {batch.shape[0]} but there are {n} points")
    if device is not None and batch.device != device:
        raise MeshError(f"{p}{name} is on {batch.device} but the points are on {device}")
    batch = batch.long()
    if n and checking():
        if int(batch[0]) < 0:
            raise MeshError(f"{p}{name} must be non-negative, got {int(batch[0])}")
        down = batch[1:] < batch[:-1]
        if bool(down.any()):
            i = int(down.nonzero()[0, 0]) + 1
            raise MeshError(f"{p}{name} must be sorted (PyG batch vector), but "
                            f"{name}[{i}]={int(batch[i])} < {name}[{i - 1}]={int(batch[i - 1])}")
    return batch


def check_weight(weight: object, n: int, name: str = "weight", where: str = "") -> Tensor:
    """Quadrature weights: a ``[n]`` tensor, finite and non-negative (the values when
    :func:`checking`); the message names the first offending entry."""
    p = _prefix(where)
    if not isinstance(weight, Tensor):
        raise MeshError(f"{p}{name} must be a tensor of quadrature weights, "
                        f"got {type(weight)}")
    if weight.dim() != 1 or weight.shape[0] != n:
        raise MeshError(f"{p}{name} has shape {tuple(weight.shape)} but the source has "
                        f"{n} points (expected [{n}])")
    # One fused reduction on the hot path; the index is only looked up on failure.
    if checking() and not bool(torch.isfinite(weight).all() & (weight >= 0).all()):
        bad = ~(torch.isfinite(weight) & (weight >= 0))
        i = int(bad.nonzero()[0])
        raise MeshError(f"{p}{name} must be finite and non-negative; entry {i} is "
                        f"{weight[i].item()}")
    return weight


def num_samples(*batches: Optional[Tensor]) -> int:
    """Number of samples ``B`` spanned by sorted batch vectors (1 when all are None)."""
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


def check_int(value: object, name: str, where: str, *, minimum: int) -> int:
    """Check that ``value`` is an integer ``>= minimum`` (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise MeshError(f"{where}: {name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise MeshError(f"{where}: {name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_real(value: object, name: str, where: str) -> float:
    """Check that ``value`` is a finite real number (bool refused)."""
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise MeshError(f"{where}: {name} must be a finite number, got {value!r}")
    return float(value)


def per_sample_ints(value: object, name: str, where: str, b: int) -> Sequence[int]:
    """Broadcast an int, or check a length-``B`` sequence / 1-D tensor of ints."""
    if isinstance(value, Tensor):
        if value.dim() == 0:
            value = value.item()
        elif value.dim() == 1 and not value.is_floating_point():
            value = value.tolist()
        else:
            raise MeshError(f"{where}: {name} must be an int or a 1-D integer tensor with one "
                            f"entry per sample, got shape {tuple(value.shape)} {value.dtype}")
    if isinstance(value, Integral) and not isinstance(value, bool):
        return [int(value)] * b
    if isinstance(value, (list, tuple)):
        if len(value) != b:
            raise MeshError(f"{where}: {name} has {len(value)} entries but there are "
                            f"{b} samples")
        for v in value:
            if isinstance(v, bool) or not isinstance(v, Integral):
                raise MeshError(f"{where}: {name} must contain integers, got {v!r}")
        return [int(v) for v in value]
    raise MeshError(f"{where}: {name} must be an int or one int per sample, got {value!r}")
