"""Reading a model's input: :func:`read_inputs` unpacks and validates a (batched)
:class:`~meshops.MeshData` into a :class:`MeshInputs` (features, positions, quadrature
weights, batch vectors, query points), cast to the model's dtype."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from meshops.nn.base import batch_points

__all__ = ["MESH_ID", "MeshInputs", "layer_inputs", "mesh_digest", "read_inputs",
           "sample_mesh_digest", "sample_ptr"]

#: Attribute of a sample holding :func:`mesh_digest` of its mesh (set by the models'
#: ``mesh_transform()``); a batch carries the list of its samples' digests.
MESH_ID = "mesh_id"


@dataclass
class MeshInputs:
    """A batch of discretised functions, validated and cast to the model's dtype.

    Attributes:
        x: ``[N, C]`` input features (``C = 0`` for geometry-only problems).
        pos: ``[N, d]`` positions.
        weight: ``[N]`` quadrature weights.
        batch: ``[N]`` sorted sample index, or None (one sample).
        query_pos: ``[M, d]`` output points (``pos`` itself when none were given).
        query_batch: ``[M]`` sample index of the output points, or None (one sample).
        has_query: whether the data carried ``query_pos``.
        num_graphs: number of samples ``B``.
        max_points, max_query: the most input / query points of a sample where known
            without reading a tensor value (one sample; while compiling, a batch whose
            points divide evenly among its samples, taken as samples of one size: a
            fixed mesh), else None.
    """

    x: Tensor
    pos: Tensor
    weight: Tensor
    batch: Optional[Tensor]
    query_pos: Tensor
    query_batch: Optional[Tensor]
    has_query: bool
    num_graphs: int
    max_points: Optional[int] = None
    max_query: Optional[int] = None

    def lifted(self) -> Tensor:
        """``[x, pos]`` (the input function concatenated with the identity), ``[N, C + d]``."""
        return torch.cat([self.x, self.pos], dim=-1)


def _check_batch_vector(b: Tensor, n: int, name: str, check_values: bool = True) -> Tensor:
    if not isinstance(b, Tensor) or b.dim() != 1 or b.shape[0] != n:
        shape = tuple(b.shape) if isinstance(b, Tensor) else type(b).__name__
        raise ValueError(f"data.{name} must be a [{n}] vector of sample indices, got {shape}")
    if b.is_floating_point() or b.dtype == torch.bool:
        raise ValueError(f"data.{name} must be an integer vector, got {b.dtype}")
    b = b.long()
    if check_values and n and (int(b[0]) < 0 or bool((b[1:] < b[:-1]).any())):
        raise ValueError(f"data.{name} must be sorted and non-negative (a PyG batch vector)")
    return b


def read_inputs(data, in_channels: int, pos_dim: int, dtype: torch.dtype,
                device: Optional[torch.device] = None, check_values: bool = True) -> MeshInputs:
    """Unpack ``data`` (a :class:`~meshops.MeshData` or a PyG batch of them).

    Reads ``x [N, in_channels]`` (may be absent or ``[N, 0]`` when ``in_channels == 0``),
    ``pos [N, pos_dim]``, ``weight [N]``, ``batch [N]`` (absent for one sample) and the
    optional ``query_pos [M, pos_dim]`` with ``query_batch [M]`` (or PyG's
    ``query_pos_batch`` from ``follow_batch=["query_pos"]``). Floating tensors are cast
    to ``dtype``.

    Raises:
        ValueError: missing or misshaped fields, negative or non-finite weights, NaN/inf
            positions, unsorted batch vectors, query points of a sample with no input
            points, or several samples with query points but no ``query_batch``.

    ``check_values=False`` skips the checks that read tensor values (finite positions
    and weights, sorted batch vectors, query samples with input points), each a host
    synchronisation and a ``torch.compile`` graph break; the models pass it while
    compiling (their eager calls check). The sample count then comes from a PyG
    batch's ``num_graphs``; when every sample carries the same :data:`MESH_ID` (one
    fixed mesh, stored by the models' ``mesh_transform()``), the ``B`` samples hold
    ``N / B`` points each (``max_points``, with which the layers' dense layout reads
    nothing back); otherwise the sizes are read from the batch vector.
    """
    pos = getattr(data, "pos", None)
    if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.shape[1] != pos_dim:
        shape = tuple(pos.shape) if isinstance(pos, Tensor) else None
        raise ValueError(f"data.pos must be [N, {pos_dim}] (pos_dim={pos_dim}), got {shape}")
    device = pos.device if device is None else device
    n = pos.shape[0]
    if n == 0:
        raise ValueError("data has no points (data.pos is empty)")
    pos = pos.to(device=device, dtype=dtype)
    if check_values and not bool(torch.isfinite(pos).all()):
        raise ValueError("data.pos contains NaN or inf")

    x = getattr(data, "x", None)
    if x is None:
        if in_channels:
            raise ValueError(f"data.x is missing; the model expects {in_channels} input channels")
        x = pos.new_zeros(n, 0)
    else:
        if x.dim() == 1 and in_channels == 1:
            x = x[:, None]
        if x.dim() != 2 or x.shape[0] != n or x.shape[1] != in_channels:
            raise ValueError(f"data.x must be [N={n}, in_channels={in_channels}], "
                             f"got {tuple(x.shape)}")
        x = x.to(device=device, dtype=dtype)

    weight = getattr(data, "weight", None)
    if weight is None:
        raise ValueError("data.weight (quadrature weights [N]) is missing; see "
                         "meshops.quadrature_weights / meshops.point_cloud_weights")
    if weight.dim() == 2 and weight.shape[1] == 1:
        weight = weight[:, 0]
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(f"data.weight must be [N={n}], got {tuple(weight.shape)}")
    weight = weight.to(device=device, dtype=dtype)
    if check_values and not bool((torch.isfinite(weight) & (weight >= 0)).all()):
        raise ValueError("data.weight must be finite and non-negative")

    batch = getattr(data, "batch", None)
    if batch is not None:
        batch = _check_batch_vector(batch.to(device), n, "batch", check_values)
    if batch is None:
        num_graphs = 1
    elif not check_values and isinstance(getattr(data, "num_graphs", None), int):
        num_graphs = data.num_graphs  # a PyG batch's count, no read of the batch vector
    else:
        num_graphs = int(batch[-1]) + 1

    query_pos = getattr(data, "query_pos", None)
    has_query = query_pos is not None
    query_batch = None
    if has_query:
        if query_pos.dim() != 2 or query_pos.shape[1] != pos_dim:
            raise ValueError(f"data.query_pos must be [M, {pos_dim}], got {tuple(query_pos.shape)}")
        query_pos = query_pos.to(device=device, dtype=dtype)
        if check_values and not bool(torch.isfinite(query_pos).all()):
            raise ValueError("data.query_pos contains NaN or inf")
        m = query_pos.shape[0]
        query_batch = getattr(data, "query_batch", None)
        if query_batch is None:
            query_batch = getattr(data, "query_pos_batch", None)
        if query_batch is not None:
            query_batch = _check_batch_vector(query_batch.to(device), m, "query_batch",
                                              check_values)
            if check_values and m and int(query_batch[-1]) >= num_graphs:
                raise ValueError(f"data.query_batch refers to sample {int(query_batch[-1])} but "
                                 f"the inputs have {num_graphs} sample(s)")
        elif num_graphs > 1:
            raise ValueError("data has several samples and query_pos but no query_batch "
                             "(batch with meshops.training.dataset's loader, or set "
                             "data.query_batch)")
        if batch is None and query_batch is not None:
            if check_values and m and int(query_batch.max()) > 0:
                raise ValueError("data.query_batch has several samples but data.batch is absent")
            query_batch = None
        elif batch is not None and query_batch is None:
            query_batch = torch.zeros(m, dtype=torch.long, device=device)
    else:
        query_pos, query_batch = pos, batch
    if check_values and batch is not None and has_query and query_pos.shape[0]:
        # every sample with query points needs input points of positive weight
        has_src = torch.zeros(num_graphs, dtype=torch.bool, device=device)
        has_src[batch[weight > 0]] = True
        if not bool(has_src[query_batch].all()):
            bad = int(query_batch[~has_src[query_batch]][0])
            raise ValueError(f"sample {bad} has query points but no input point of positive weight")
    return MeshInputs(x=x, pos=pos, weight=weight, batch=batch, query_pos=query_pos,
                      query_batch=query_batch, has_query=has_query, num_graphs=num_graphs,
                      max_points=_max_points(n, batch, num_graphs, check_values, data),
                      max_query=_max_points(query_pos.shape[0], query_batch, num_graphs,
                                            check_values, data))


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


def _max_points(n: int, batch: Optional[Tensor], num_graphs: int, check_values: bool,
                data) -> Optional[int]:
    """The most points of a sample, where known without reading the batch vector: one
    sample; unchecked (compiled), samples that all carry one mesh digest hold ``n / B``
    points each.  None: the layers read it (eager calls always, so that their results do
    not depend on this; a compiled forward on samples of several meshes breaks its
    graph there and stays right)."""
    if batch is None or num_graphs == 1:
        return n
    if check_values or n % num_graphs or not same_digest(data, MESH_ID, num_graphs):
        return None
    return n // num_graphs


def mesh_digest(*tensors: Tensor) -> str:
    """A digest of the shapes, dtypes and values of ``tensors`` (e.g. a sample's ``pos``,
    ``weight`` and ``query_pos``): equal meshes, equal digests."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)} {t.dtype};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def layer_inputs(pos: Any, weight: Optional[Tensor], batch: Any, num_points: Any,
                 num_graphs: int, trusted: bool, dense: bool = True, max_points: Any = None
                 ) -> tuple:
    """``(pos, weight, batch)`` for a layer: as given (the layer checks them), or with
    ``trusted`` (a compiled forward) the :class:`~meshops.nn.base.Points` the layer
    trusts, built from the sizes the model knows (``num_graphs``, ``max_points``) so
    that nothing is read back from the device."""
    if not trusted:
        return pos, weight, batch
    points = batch_points(pos, weight, batch, num_points, dense=dense, num_graphs=num_graphs,
                          max_points=max_points)
    return points, None, None


def sample_ptr(batch: Optional[Tensor], n: int, num_graphs: int) -> list[int]:
    """``ptr`` (start offsets, length ``B + 1``) of a sorted batch vector."""
    if batch is None:
        return [0, n]
    counts = torch.bincount(batch, minlength=num_graphs)
    return [0] + torch.cumsum(counts, 0).tolist()


def sample_mesh_digest(data) -> str:
    """:func:`mesh_digest` of one sample's mesh: ``pos``, ``weight`` and, when present,
    ``query_pos`` (what fixes the sizes of its point sets)."""
    parts = [data.pos, data.weight]
    if getattr(data, "query_pos", None) is not None:
        parts.append(data.query_pos)
    return mesh_digest(*parts)
