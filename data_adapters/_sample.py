"""Conventions shared by every adapter's samples (private helpers).

Every sample an adapter returns is a :class:`meshops.MeshData` with

* ``pos [N, d]``, ``weight [N]`` (quadrature weights),
* ``fields``: the point fields by name, each ``[N]`` or ``[N, c]``,
* ``x [N, C_in]``: the input channels concatenated (``[N, 0]`` for geometry-only
  problems such as the Geo-FNO benchmarks, where the input is ``pos``),
* ``y [N, C_out]``: the target channels concatenated,
* ``source``: where the sample came from,

and every floating-point tensor (``pos``, ``weight``, ``fields``, ``x``, ``y``,
``params``) in one ``dtype`` (float32 by default; pass ``torch.float64`` for the data
as stored).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from meshops.data import MeshData
from meshops.errors import MeshError
from meshops.training.dataset import check_finite_fields

_FLOAT_ATTRS = ("pos", "weight", "x", "y", "params")


def as_dtype(dtype) -> torch.dtype:
    """Accept ``torch.float32``/``torch.float64`` or the strings ``"float32"``/``"float64"``."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise MeshError(f"dtype must be a floating torch dtype (e.g. torch.float32), got {dtype!r}")
    return dtype


def channels(fields: Mapping[str, torch.Tensor], names: Sequence[str], n: int,
             dtype: torch.dtype) -> torch.Tensor:
    """Concatenate fields ``[N]`` / ``[N, c]`` / ``[N, ...]`` into ``[N, C]``.

    Returns ``[N, 0]`` when ``names`` is empty.
    """
    cols = []
    for name in names:
        v = fields[name]
        v = v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
        cols.append(v.reshape(n, -1).to(dtype))
    return torch.cat(cols, dim=1) if cols else torch.zeros((n, 0), dtype=dtype)


def finish(mesh: MeshData, inputs: Sequence[str], targets: Sequence[str],
           dtype: torch.dtype, **attrs) -> MeshData:
    """Add ``x``/``y`` from the named fields and extra attributes ``attrs``, and cast
    every floating tensor (``pos``, ``weight``, ``x``, ``y``, ``params``, ``fields``,
    floating ``attrs``) to ``dtype``.

    Raises:
        MeshError: an input or target field holds a NaN or infinite value (the
            message names the sample's ``source``, the field and the first point;
            see :func:`meshops.training.dataset.check_finite_fields`).
    """
    n = int(mesh.pos.shape[0])
    fields = getattr(mesh, "fields", None) or {}
    source = getattr(mesh, "source", None) or "sample"
    check_finite_fields(fields, inputs, source, "input", dtype)
    check_finite_fields(fields, targets, source, "target", dtype)
    mesh.x = channels(fields, inputs, n, dtype)
    mesh.y = channels(fields, targets, n, dtype)
    for k, v in attrs.items():
        setattr(mesh, k, v)
    for k in _FLOAT_ATTRS + tuple(attrs):
        v = getattr(mesh, k, None)
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            setattr(mesh, k, v.to(dtype))
    if fields:
        mesh.fields = {k: v.to(dtype) if v.is_floating_point() else v
                       for k, v in fields.items()}
    return mesh
