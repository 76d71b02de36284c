"""`MeshData`: a discretised function on a mesh, batched the PyG way."""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch
from torch_geometric.data import Batch, Data

from meshops.errors import MeshError
from meshops.search.graph import cells_to_face


class MissingFieldError(MeshError, KeyError):
    """A point field that a mesh does not have (a ``KeyError`` and a ``MeshError``)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


class _Fields(dict):
    """The ``fields`` dict of one mesh, whose missing-key error names the mesh.

    PyG batches a dict attribute by looking every name of the first mesh up in the
    others, so a mesh without one of them used to end the batching in a bare
    ``KeyError: 'f'``; this lookup is where the clearer message is made.
    """

    def __init__(self, fields=(), owner: Optional["MeshData"] = None) -> None:
        super().__init__(fields)
        self._owner = None if owner is None else weakref.ref(owner)

    def __missing__(self, key):
        owner = self._owner() if self._owner is not None else None
        source = getattr(owner, "source", None) if owner is not None else None
        mesh = f"mesh {str(source)!r}" if source is not None else "a mesh"
        raise MissingFieldError(
            f"{mesh} has no point field {key!r} (its fields: {sorted(self)}); meshes "
            f"batched together need the same field names")

    def __reduce__(self):
        # The weak reference to the owner does not pickle; the owner's next access
        # to ``fields`` attaches it again.
        return _Fields, (dict(self),)


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
            Meshes batched together need the same field names; otherwise batching
            raises :class:`MissingFieldError` naming the mesh and the field.
        cells: ``list[tuple[str, LongTensor[M, k]]]`` in meshio's cell-type names,
            kept so that predictions can be written back onto the same mesh. On a
            batch, the cells of all its meshes with indices into the batch's
            ``pos`` (offset like PyG offsets ``edge_index``), one block per cell
            type; ``batch.get_example(i)`` / ``to_data_list()`` give every mesh its
            own cells back with its own indices.
        face: Triangles ``[3, F]`` (PyG's layout) of the triangle and quad cells,
            quads split into two triangles (:func:`meshops.search.cells_to_face`);
            computed from ``cells`` unless set explicitly (``face = None`` removes
            it from this object, as ``FaceToEdge`` does), None without 2-D cells.
            :class:`torch_geometric.transforms.FaceToEdge` reads it;
            :func:`meshops.cells_to_edge_index` gives the cells' own edges instead
            (no quad diagonals; volume cells too).
        cell_data: ``dict[str, list[Tensor]]`` of cell data (one array per cell
            block), kept for write-back.
        field_data: ``dict[str, numpy array]`` of the file's field data (VTK
            ``FieldData``: per-sample parameters; Gmsh: ``{physical name: [tag, dim]}``),
            ``{}`` when the file has none. File metadata, not batched: it stays with
            this object and its copies (:mod:`meshops.datasets.params`,
            :mod:`meshops.mesh.boundary`).
        source: Path of the file the mesh was read from, or ``None``.

    Example:
        >>> mesh = meshops.read_mesh("examples/meshes/annulus.vtu")
        >>> mesh.integrate(mesh.fields["u"])          # integral of u over the annulus
        tensor(0.7372, dtype=torch.float64)
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

    def _stored(self, key: str) -> Any:
        # An AttributeError from a property getter makes Python fall back to
        # Data.__getattr__, which says the attribute is missing, as for any other.
        if key not in self._store:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{key}'")
        return self._store[key]

    @property
    def field_data(self) -> dict:
        # Kept outside PyG's store: files disagree on their field data (Gmsh names),
        # which a batch of their meshes would have to reconcile.
        return self.__dict__.get("_field_data", {})

    @field_data.setter
    def field_data(self, value) -> None:
        self.__dict__["_field_data"] = dict(value or {})

    @property
    def fields(self) -> dict:
        fields = self._stored("fields")
        if type(fields) is dict:  # PyG's separate() and .to() give plain dicts back
            fields = self._store["fields"] = _Fields(fields, self)
        elif isinstance(fields, _Fields) and fields._owner is None:  # unpickled
            fields._owner = weakref.ref(self)
        return fields

    @fields.setter
    def fields(self, value) -> None:
        self._store["fields"] = None if value is None else _Fields(value, self)

    @property
    def cells(self) -> list:
        cells = self._stored("cells")
        if isinstance(self, Batch) and _per_mesh(cells):
            if "ptr" not in self._store:
                # (an AttributeError here would make Python fall back to the raw list)
                raise MeshError("MeshData batch without 'ptr': cannot offset its cells")
            return _offset_cells(cells, self._store["ptr"])
        return cells

    @cells.setter
    def cells(self, value) -> None:
        self._store["cells"] = value

    @property
    def face(self) -> Optional[torch.Tensor]:
        if "face" in self._store:  # set explicitly
            return self._store["face"]
        if self.__dict__.get("_face_removed"):
            return None
        cells = getattr(self, "cells", None)
        return cells_to_face(cells) if cells else None

    @face.setter
    def face(self, value) -> None:
        # PyG's store drops None values, so "removed" (what FaceToEdge does with
        # remove_faces=True) is remembered beside it; a batch computes its own face.
        self.__dict__["_face_removed"] = value is None
        self._store["face"] = value

    @property
    def num_faces(self) -> Optional[int]:
        face = self.face
        return int(face.shape[1]) if isinstance(face, torch.Tensor) else None

    def apply(self, func, *args: str):
        # PyG's apply (behind .to(), .cpu(), ...) rebuilds dicts as plain dicts;
        # wrap ``fields`` again so that batching still names a missing field.
        super().apply(func, *args)
        if "fields" in self._store:
            self.fields  # noqa: B018 (the getter re-wraps)
        return self

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


def _per_mesh(cells) -> bool:
    """Whether a batch's stored ``cells`` is PyG's list of every mesh's cell list.

    PyG's collate passes lists of ``(type, tensor)`` pairs through untouched (no
    ``__inc__`` is asked for them), one list per mesh; a cell list set on the batch
    itself has ``(type, tensor)`` pairs at the top instead.
    """
    return all(not (len(entry) and isinstance(entry[0], str)) for entry in cells)


def _offset_cells(per_mesh, ptr: torch.Tensor) -> list:
    """One cell list for a batch: every mesh's indices offset by its first point."""
    offsets = ptr.tolist()
    blocks: dict[str, list[torch.Tensor]] = {}
    for b, cells in enumerate(per_mesh):
        for ctype, conn in cells:
            blocks.setdefault(str(ctype), []).append(torch.as_tensor(conn) + offsets[b])
    return [(ctype, torch.cat(conns, dim=0)) for ctype, conns in blocks.items()]
