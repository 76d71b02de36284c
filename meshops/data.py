"""`MeshData`: a discretised function on a mesh, batched the PyG way."""

from __future__ import annotations

from typing import Any

import torch
from torch_geometric.data import Data


class MeshData(Data):
    """Sample points, quadrature weights and point fields of one mesh.

    A function on a mesh is the triple ``(pos, fields, weight)`` where ``weight`` is
    a quadrature rule: ``sum_i weight[i] * f(pos[i]) ~ integral of f over the
    domain``. Subclasses :class:`torch_geometric.data.Data`, so lists of
    ``MeshData`` of different sizes batch with :class:`torch_geometric.loader.DataLoader`
    (``batch`` / ``ptr`` vectors).

    Attributes:
        pos: Point coordinates ``[N, d]``, ``d`` in 1, 2, 3 (float64 when read from a
            file, so that a round trip is bit-for-bit).
        weight: Nodal quadrature weights ``[N]`` (see :func:`meshops.quadrature_weights`).
        fields: ``dict[str, Tensor]`` of point data, each ``[N]`` or ``[N, c]``.
        cells: ``list[tuple[str, LongTensor[M, k]]]`` in meshio's cell-type names,
            kept so that predictions can be written back onto the same mesh.
        cell_data: ``dict[str, list[Tensor]]`` of cell data (one array per cell
            block), kept for write-back.
        source: Path of the file the mesh was read from, or ``None``.

    Example:
        >>> mesh = meshops.read_mesh("plate.vtu")
        >>> mesh.integrate(mesh.fields["T"])          # integral of T over the domain
    """

    def __init__(self, pos=None, weight=None, fields=None, cells=None, cell_data=None,
                 source=None, **kwargs: Any) -> None:
        super().__init__(pos=pos, weight=weight, **kwargs)
        # Stored only when given, so that PyG's internal copies (which call
        # __init__ without arguments) do not grow empty attributes.
        if fields is not None:
            self.fields = dict(fields)
        if cells is not None:
            self.cells = list(cells)
        if cell_data is not None:
            self.cell_data = dict(cell_data)
        if source is not None:
            self.source = source

    @property
    def dim(self) -> int:
        """Spatial dimension ``d`` of ``pos``."""
        return int(self.pos.shape[1])

    @property
    def field_names(self) -> list[str]:
        """Names of the point fields, in file order."""
        return list(getattr(self, "fields", None) or {})

    @property
    def measure(self) -> float:
        """Total measure of the domain (length, area or volume): ``weight.sum()``."""
        return float(self.weight.sum())

    def integrate(self, values: torch.Tensor) -> torch.Tensor:
        """Quadrature of point values ``[N]`` or ``[N, c]`` over the domain.

        Returns a scalar, ``[c]``, or, for a batch, ``[B]`` / ``[B, c]``.
        """
        if values.shape[0] != self.pos.shape[0]:
            raise ValueError(
                f"values has {values.shape[0]} rows but the mesh has {self.pos.shape[0]} points")
        w = self.weight.to(values.dtype)
        weighted = values * (w if values.dim() == 1 else w[:, None])
        batch = getattr(self, "batch", None)
        if batch is None:
            return weighted.sum(0)
        out = weighted.new_zeros((int(self.num_graphs),) + tuple(values.shape[1:]))
        return out.index_add_(0, batch, weighted)

    def cell_counts(self) -> dict[str, int]:
        """Number of cells per cell type."""
        counts: dict[str, int] = {}
        for ctype, conn in getattr(self, "cells", None) or []:
            counts[ctype] = counts.get(ctype, 0) + int(conn.shape[0])
        return counts
