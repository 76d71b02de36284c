"""Digests of meshes: how a batch knows, without reading its tensors, that its samples
share one mesh (a compiled forward then knows their sizes) or one latent mesh.

The models' ``mesh_transform()`` stores :func:`sample_mesh_digest` of each sample under
:data:`MESH_ID`; PyG's loaders collect the samples' strings into a list, which
:func:`same_digest` compares (plain strings: no tensor read, and guarded on by
``torch.compile``).
"""

from __future__ import annotations

import hashlib
from typing import Optional

import torch
from torch import Tensor

__all__ = ["MESH_ID", "mesh_digest", "same_digest", "sample_mesh_digest"]

#: Attribute of a sample holding :func:`mesh_digest` of its mesh (set by the models'
#: ``mesh_transform()``); a batch carries the list of its samples' digests.
MESH_ID = "mesh_id"


def mesh_digest(*tensors: Tensor) -> str:
    """A digest of the shapes, dtypes and values of ``tensors`` (e.g. a sample's ``pos``,
    ``weight`` and ``query_pos``): equal meshes, equal digests."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)} {t.dtype};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def sample_mesh_digest(data) -> str:
    """:func:`mesh_digest` of one sample's mesh: ``pos``, ``weight`` and, when present,
    ``query_pos`` (what fixes the sizes of its point sets)."""
    parts = [data.pos, data.weight]
    if getattr(data, "query_pos", None) is not None:
        parts.append(data.query_pos)
    return mesh_digest(*parts)


def same_digest(data, name: str, num_graphs: int) -> Optional[bool]:
    """Whether the ``num_graphs`` samples of ``data`` carry one and the same digest in
    attribute ``name`` (plain strings: compared without reading a tensor, and guarded on
    by torch.compile); None where the digests are missing or not one per sample."""
    ids = getattr(data, name, None)
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, (list, tuple)) or len(ids) != num_graphs:
        return None
    return all(i == ids[0] for i in ids)
