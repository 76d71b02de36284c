"""Reading a model's input: :func:`read_inputs` unpacks and validates a (batched)
:class:`~meshops.MeshData` into a :class:`MeshInputs`: the input features and the two
point sets the layers take, the input mesh (``points``) and the output points
(``queries``), as trusted :class:`~meshops.nn.points.Points`, cast to the model's
dtype. It is the one place where a model's raw tensors are checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from meshops.mesh.digest import MESH_ID, same_digest
from meshops.nn.points import Points, batch_points
from meshops.utils.checks import check_pos, checking

__all__ = ["MeshInputs", "read_inputs"]

@dataclass
class MeshInputs:
    """A batch of discretised functions, validated and cast to the model's dtype.

    Attributes:
        x: ``[N, C]`` input features (``C = 0`` for geometry-only problems).
        points: the input mesh: ``pos [N, d]``, quadrature ``weight [N]``, ``batch [N]``
            (None for one sample), the number of samples and (when read with
            ``dense=True``) the dense layout.
        queries: the output points: ``query_pos [M, d]`` and their batch vector, or
            ``points`` itself when the data carried no ``query_pos``.
        has_query: whether the data carried ``query_pos``.
        pos, weight, batch, query_pos, query_batch, num_graphs: the tensors and the
            sample count of ``points`` and ``queries``, by the names of the data's
            fields (plain attributes, set once).
    """

    x: Tensor
    points: Points
    queries: Points
    has_query: bool
    pos: Tensor = field(init=False)
    weight: Tensor = field(init=False)
    batch: Optional[Tensor] = field(init=False)
    query_pos: Tensor = field(init=False)
    query_batch: Optional[Tensor] = field(init=False)
    num_graphs: int = field(init=False)

    def __post_init__(self) -> None:
        self.pos, self.weight, self.batch = self.points.pos, self.points.weight, self.points.batch
        self.query_pos, self.query_batch = self.queries.pos, self.queries.batch
        self.num_graphs = self.points.num_graphs


def read_inputs(data, in_channels: int, pos_dim: int, dtype: torch.dtype,
                device: Optional[torch.device] = None, dense: bool = True) -> MeshInputs:
    """Unpack ``data`` (a :class:`~meshops.MeshData` or a PyG batch of them).

    Reads ``x [N, in_channels]`` (may be absent or ``[N, 0]`` when ``in_channels == 0``),
    ``pos [N, pos_dim]``, ``weight [N]``, ``batch [N]`` (absent for one sample) and the
    optional ``query_pos [M, pos_dim]`` with ``query_batch [M]`` (or PyG's
    ``query_pos_batch`` from ``follow_batch=["query_pos"]``). Floating tensors are cast
    to ``dtype``. ``dense``: build the dense layout of the point sets (the global
    layers need it; the local and patched ones work on the flat batch).

    The checks that read tensor values (finite positions and weights, sorted batch
    vectors, query samples with input points) run when
    :func:`meshops.utils.checks.checking` says so: eager calls check, a compiled forward
    trusts its inputs (each such check is a host synchronisation and a
    ``torch.compile`` graph break). The sample count then comes from a PyG batch's
    ``num_graphs``; when every sample carries the same :data:`MESH_ID` (one fixed mesh,
    stored by the models' ``mesh_transform()``), the ``B`` samples hold ``N / B``
    points each, and the dense layout reads nothing back.

    Raises:
        ValueError: missing or misshaped fields, negative or non-finite weights, NaN/inf
            positions, unsorted batch vectors, query points of a sample with no input
            points, or several samples with query points but no ``query_batch``.
    """
    pos = _read_pos(data, pos_dim, dtype, device)
    device = pos.device
    x = _read_x(data, in_channels, pos)
    weight = _read_weight(data, pos.shape[0], dtype, device)
    batch = getattr(data, "batch", None)
    batch = None if batch is None else batch.to(device)
    num_graphs = _num_graphs(data, batch)
    n = pos.shape[0]
    points = batch_points(pos, weight, batch, dense=dense, num_graphs=num_graphs,
                          max_points=_max_points(n, batch, num_graphs, data), prefix="data.")
    if getattr(data, "query_pos", None) is None:
        return MeshInputs(x, points, points, has_query=False)
    query_pos, query_batch = _read_queries(data, pos_dim, dtype, device, points.batch,
                                           num_graphs)
    m = query_pos.shape[0]
    queries = batch_points(query_pos, None, query_batch, dense=dense, num_graphs=num_graphs,
                           max_points=_max_points(m, query_batch, num_graphs, data),
                           prefix="data.query_")
    _check_queried_samples(points, queries)
    return MeshInputs(x, points, queries, has_query=True)


def _read_pos(data, pos_dim: int, dtype: torch.dtype, device) -> Tensor:
    pos = getattr(data, "pos", None)
    if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.shape[1] != pos_dim:
        shape = tuple(pos.shape) if isinstance(pos, Tensor) else None
        raise ValueError(f"data.pos must be [N, {pos_dim}] (pos_dim={pos_dim}), got {shape}")
    if pos.shape[0] == 0:
        raise ValueError("data has no points (data.pos is empty)")
    pos = pos.to(device=pos.device if device is None else device, dtype=dtype)
    return check_pos(pos, "data.pos", finite=True)


def _read_x(data, in_channels: int, pos: Tensor) -> Tensor:
    x = getattr(data, "x", None)
    n = pos.shape[0]
    if x is None:
        if in_channels:
            raise ValueError(f"data.x is missing; the model expects {in_channels} input channels")
        return pos.new_zeros(n, 0)
    if x.dim() == 1 and in_channels == 1:
        x = x[:, None]
    if x.dim() != 2 or x.shape[0] != n or x.shape[1] != in_channels:
        raise ValueError(f"data.x must be [N={n}, in_channels={in_channels}], "
                         f"got {tuple(x.shape)}")
    return x.to(device=pos.device, dtype=pos.dtype)


def _read_weight(data, n: int, dtype: torch.dtype, device) -> Tensor:
    weight = getattr(data, "weight", None)
    if weight is None:
        raise ValueError("data.weight (quadrature weights [N]) is missing; see "
                         "meshops.quadrature_weights / meshops.point_cloud_weights")
    if weight.dim() == 2 and weight.shape[1] == 1:
        weight = weight[:, 0]
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(f"data.weight must be [N={n}], got {tuple(weight.shape)}")
    return weight.to(device=device, dtype=dtype)


def _num_graphs(data, batch: Optional[Tensor]) -> int:
    """Samples of the batch: a PyG batch's ``num_graphs`` while compiling (no read of
    the batch vector), else read from it (checked by :func:`batch_points` first)."""
    if batch is None:
        return 1
    if not checking() and isinstance(getattr(data, "num_graphs", None), int):
        return data.num_graphs
    if not isinstance(batch, Tensor) or batch.dim() != 1 or not batch.numel():
        return 1   # batch_points names the problem
    return int(batch.max()) + 1


def _read_queries(data, pos_dim: int, dtype: torch.dtype, device, batch: Optional[Tensor],
                  num_graphs: int) -> tuple[Tensor, Optional[Tensor]]:
    """``query_pos`` and its batch vector, consistent with the input batch."""
    query_pos = data.query_pos
    if query_pos.dim() != 2 or query_pos.shape[1] != pos_dim:
        raise ValueError(f"data.query_pos must be [M, {pos_dim}], got {tuple(query_pos.shape)}")
    query_pos = check_pos(query_pos.to(device=device, dtype=dtype), "data.query_pos",
                          finite=True)
    m = query_pos.shape[0]
    query_batch = getattr(data, "query_batch", None)
    if query_batch is None:
        query_batch = getattr(data, "query_pos_batch", None)
    if query_batch is None:
        if num_graphs > 1:
            raise ValueError("data has several samples and query_pos but no query_batch "
                             "(batch with meshops.training.dataset's loader, or set "
                             "data.query_batch)")
        return query_pos, (None if batch is None
                           else torch.zeros(m, dtype=torch.long, device=device))
    query_batch = query_batch.to(device)
    if checking() and m and isinstance(query_batch, Tensor) and query_batch.numel() \
            and int(query_batch.max()) >= num_graphs:
        if batch is None:
            raise ValueError("data.query_batch has several samples but data.batch is absent")
        raise ValueError(f"data.query_batch refers to sample {int(query_batch.max())} but the "
                         f"inputs have {num_graphs} sample(s)")
    return query_pos, (None if batch is None else query_batch)


def _check_queried_samples(points: Points, queries: Points) -> None:
    """Every sample with query points needs input points of positive weight (when
    :func:`meshops.utils.checks.checking`)."""
    if not checking() or points.batch is None or not queries.num_points:
        return
    has_src = torch.zeros(points.num_graphs, dtype=torch.bool, device=points.pos.device)
    has_src[points.batch[points.weight > 0]] = True
    if not bool(has_src[queries.batch].all()):
        bad = int(queries.batch[~has_src[queries.batch]][0])
        raise ValueError(f"sample {bad} has query points but no input point of positive weight")


def _max_points(n: int, batch: Optional[Tensor], num_graphs: int, data) -> Optional[int]:
    """The most points of a sample, where known without reading the batch vector: one
    sample; while compiling, samples that all carry one mesh digest hold ``n / B``
    points each.  None: the layout reads it (eager calls always, so that their results
    do not depend on this; a compiled forward on samples of several meshes breaks its
    graph there and stays right)."""
    if batch is None or num_graphs == 1:
        return n
    if checking() or n % num_graphs or not same_digest(data, MESH_ID, num_graphs):
        return None
    return n // num_graphs
