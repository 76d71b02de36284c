"""The arrays of a family of stand-in samples, each on its own mesh of one cell type: the
samples' points, cells and point fields concatenated with their offsets (how the cache of
:mod:`._cache` stores them), and back to :class:`meshops.MeshData` samples."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from meshops.datasets.folder import add_inputs_targets
from meshops.mesh.io import mesh_from_arrays


def pack_meshes(done: Sequence[dict], cell: str, corners: int, names: Sequence[str],
                params: np.ndarray) -> dict:
    """One dict of arrays from per-sample dicts with ``points [N_s, 3]``, ``cell`` (``[M_s,
    corners]``) and the point fields ``names``: concatenated, with ``point_offsets`` and
    ``cell_offsets`` ``[S + 1]`` and the ``params [S, K]``."""
    empty = {"points": np.zeros((0, 3)), cell: np.zeros((0, corners), np.int32)}
    out = {k: np.concatenate([d[k] for d in done]) if done else empty.get(k, np.zeros(0))
           for k in ("points", cell, *names)}
    for key, what in (("point_offsets", "points"), ("cell_offsets", cell)):
        out[key] = np.cumsum([0] + [len(d[what]) for d in done]).astype(np.int64)
    return {**out, "params": params}


def unpack_meshes(arrays: dict, cell: str, inputs: Sequence[str], targets: Sequence[str],
                  dtype, first: int, source: Callable[[int], str]) -> list:
    """The samples of :func:`pack_meshes`'s arrays: ``MeshData`` with ``x``/``y`` from the
    fields ``inputs``/``targets``, ``params [1, K]``, ``sample_id = first + s``,
    ``standin=True`` and ``source(sample_id)``."""
    po, co = arrays["point_offsets"], arrays["cell_offsets"]
    out = []
    for s, prm in enumerate(arrays["params"]):
        sl = slice(po[s], po[s + 1])
        mesh = mesh_from_arrays(
            arrays["points"][sl], [(cell, arrays[cell][co[s]:co[s + 1]].astype(np.int64))],
            {k: arrays[k][sl] for k in (*inputs, *targets)}, source=source(first + s))
        out.append(add_inputs_targets(mesh, list(inputs), list(targets), dtype,
                                      sample_id=first + s, standin=True,
                                      params=torch.from_numpy(prm.copy())[None]))
    return out
