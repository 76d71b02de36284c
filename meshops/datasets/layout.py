"""How a mesh file becomes a sample: :class:`SampleLayout`.

One object says where a sample lives and what it carries besides its fields, and is
used alike by training (:class:`meshops.MeshFolderDataset`), ``meshops predict`` and
``meshops evaluate``, so that a file is read the same way everywhere:

* **where**: at the mesh's points, or at the centroids of its cells with the cells'
  measures as weights (:mod:`meshops.mesh.cells`); decided by where the targets are stored
  (point data or cell data) and recorded in the run;
* **fields**: the input and target fields; point-data inputs of a cell sample are
  transferred to the cells (cell averages, exact for linear fields); cell-data inputs
  of a point sample are refused, as is a selected name that is both a point field and
  a cell field of the file;
* **boundary tags**: input channels ``tag:<tag>`` and ``tag:normal``
  (:mod:`meshops.mesh.boundary`), appended to the inputs;
* **geometry features**: inputs named ``geo:distance`` and ``geo:direction`` are not read
  from the file but computed from its mesh (:mod:`meshops.mesh.geometry`: the distance to
  the domain's boundary and the direction to it);
* **parameters**: ``params [1, K]`` from the file's ``field_data`` or its folder's
  ``params.csv`` / ``params.json`` (:mod:`meshops.datasets.params`); a
  :class:`~meshops.MeshData` that carries its own ``params`` (built in Python) keeps
  them, and when its file's ``field_data`` or table gives other values, its own win,
  with a warning naming both.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import torch

from meshops.datasets.params import PARAM_FILES, read_param_table, sample_params
from meshops.errors import CheckpointError, MeshError
from meshops.mesh.boundary import TAG_PREFIX, tag_channels, tag_field_names
from meshops.mesh.cells import cell_field, cell_points, cells_to_blocks, point_to_cells
from meshops.mesh.data import MeshData
from meshops.mesh.geometry import GEOMETRY_FIELDS, GEOMETRY_PREFIX, geometry_channels
from meshops.mesh.io import WEIGHT_FIELD

__all__ = ["LOCATIONS", "SampleLayout"]

#: Where a sample's values live.
LOCATIONS = ("points", "cells")


def _list(value, what: str) -> list[str]:
    if isinstance(value, str):
        raise MeshError(f"{what} is a list of names, e.g. ['{value}'], not a single string")
    return [str(v) for v in (value or ())]


class SampleLayout:
    """Where the samples of a data set live and what they carry (see the module).

    Args:
        inputs: Input field names (point or cell data).
        targets: Target field names, all point data or all cell data.
        params: Parameter names (``params [1, K]`` on each sample).
        tags: Boundary tags whose channels are appended to the inputs.
        location: ``"points"`` or ``"cells"``; ``None`` (default) takes it from the
            first file's targets, after which every file must agree.

    Attributes:
        input_fields: ``inputs`` and then the tag channels' names: what ``x`` holds.

    Example:
        >>> layout = SampleLayout(["f"], ["p"], params=["alpha"], tags=["wall"])
        >>> sample = layout.view(meshops.read_mesh("case.vtu"), "case.vtu")
        >>> sample.fields.keys(), sample.params.shape     # f, p, tag:wall, tag:normal; [1, 1]
    """

    def __init__(self, inputs: Sequence[str] = (), targets: Sequence[str] = (),
                 params: Sequence[str] = (), tags: Sequence[str] = (),
                 location: str | None = None) -> None:
        self.inputs = _list(inputs, "inputs")
        self.targets = _list(targets, "targets")
        self.params = _list(params, "params")
        self.tags = _list(tags, "tags")
        if location not in (None,) + LOCATIONS:
            raise MeshError(f"location must be 'points' or 'cells', got {location!r}")
        self.location = location
        self._first: str | None = None  # the file the location was taken from
        self._tables: dict = {}  # folder -> (its parameter files' identity, table)
        clash = [n for n in self.inputs + self.targets if n.startswith(TAG_PREFIX)]
        if clash:
            raise MeshError(f"field {clash[0]!r}: names starting with {TAG_PREFIX!r} are the "
                            f"channels of boundary tags (--tags); rename the field")
        bad = [n for n in self.inputs if n.startswith(GEOMETRY_PREFIX)
               and n not in GEOMETRY_FIELDS]
        if bad:
            raise MeshError(f"input {bad[0]!r}: the geometry features are "
                            f"{', '.join(GEOMETRY_FIELDS)}")
        geo = [n for n in self.targets if n.startswith(GEOMETRY_PREFIX)]
        if geo:
            raise MeshError(f"target {geo[0]!r}: names starting with {GEOMETRY_PREFIX!r} are "
                            f"geometry features computed from the mesh, inputs only")
        for what, names in (("params", self.params), ("tags", self.tags)):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise MeshError(f"{what}: {dup} given more than once")

    @property
    def input_fields(self) -> list[str]:
        return self.inputs + tag_field_names(self.tags)

    @classmethod
    def from_run(cls, meta: dict, inputs: Sequence[str], targets: Sequence[str], model,
                 ckpt) -> "SampleLayout":
        """The layout a run was trained with, from its checkpoint's metadata
        (``inputs`` with the tag channels, as :class:`~meshops.RunSpec` has them).

        Raises:
            CheckpointError: metadata that disagrees with itself or with the model (a
                parameter count other than the model's ``param_channels``).
        """
        tags, params = meta.get("tags") or [], meta.get("params") or []
        location = meta.get("location", "points")
        for key, v in (("tags", tags), ("params", params)):
            if not isinstance(v, list) or not all(isinstance(n, str) and n for n in v):
                raise CheckpointError(f"{ckpt}: inconsistent metadata: {key} is {v!r}, not a "
                                      f"list of names")
        if location not in LOCATIONS:
            raise CheckpointError(f"{ckpt}: inconsistent metadata: location is {location!r}")
        k = getattr(model, "param_channels", None)  # a reduced basis: no such config key
        if not isinstance(k, int):
            k = int((getattr(model, "config", None) or {}).get("param_channels", 0) or 0)
        if k != len(params):
            raise CheckpointError(f"{ckpt}: inconsistent metadata: the model takes {k} "
                                  f"parameters but the run records {len(params)} ({params})")
        names = tag_field_names(tags)
        if names and list(inputs)[-len(names):] != names:
            raise CheckpointError(f"{ckpt}: inconsistent metadata: the inputs {list(inputs)} do "
                                  f"not end with the channels of the tags {tags}")
        return cls(list(inputs)[:len(inputs) - len(names)], targets, params, tags, location)

    # ---------------------------------------------------------------- reading
    def _table(self, folder: Path):
        """The parameter table of ``folder``, read again whenever its file changes."""
        folder = folder.resolve()
        stamp = _identity(folder)
        kept = self._tables.get(folder)
        if kept is None or kept[0] != stamp:
            self._tables[folder] = (stamp, read_param_table(folder))
        return self._tables[folder][1]

    def _where(self, mesh, name: str, path) -> str:
        """``"points"`` or ``"cells"``: where ``name`` is stored in ``mesh``."""
        in_points = name in (getattr(mesh, "fields", None) or {})
        in_cells = name in (getattr(mesh, "cell_data", None) or {})
        if in_points and in_cells:
            raise MeshError(f"{path}: {name!r} is both a point field and a cell field; rename "
                            f"one of them (which one is meant cannot be told)")
        if not (in_points or in_cells):
            pts = sorted(k for k in (getattr(mesh, "fields", None) or {}) if k != WEIGHT_FIELD)
            cells = sorted(getattr(mesh, "cell_data", None) or {})
            role = "target" if name in self.targets else "input"
            raise MeshError(f"{path}: {role} field {name!r} not found; available point fields: "
                            f"{', '.join(pts) or 'none'}; cell fields: "
                            f"{', '.join(cells) or 'none'}")
        return "points" if in_points else "cells"

    def _resolve_location(self, mesh, path, need_targets: bool) -> str:
        if self.location is not None and not need_targets:
            return self.location
        found = {t: self._where(mesh, t, path) for t in self.targets}
        kinds = sorted(set(found.values()))
        if len(kinds) > 1:
            cell = next(t for t, k in found.items() if k == "cells")
            point = next(t for t, k in found.items() if k == "points")
            raise MeshError(f"{path}: target {cell!r} is cell data but target {point!r} is point "
                            f"data; the targets of a sample live in one place")
        where = kinds[0] if kinds else "points"
        if self.location is None:
            self.location, self._first = where, str(path)
        elif where != self.location:
            first = f" in {self._first}" if self._first else " in the run's training data"
            raise MeshError(f"{path}: the targets {', '.join(self.targets)} are {where[:-1]} "
                            f"data here but {self.location[:-1]} data{first}; the samples of a "
                            f"data set live in one place")
        return self.location

    def view(self, mesh, path, need_targets: bool = True):
        """The sample of one mesh file: a new :class:`~meshops.MeshData` (``mesh`` is not
        changed) with ``fields`` holding the inputs, the targets (when
        ``need_targets``) and the tag channels at the layout's location, ``params [1, K]``
        when parameters are asked for, and ``source``.

        For a cell sample ``pos`` are the cell centroids and ``weight`` the cell
        measures; the mesh's own cells are not carried (write predictions back with
        :meth:`prediction_data`).

        Raises:
            MeshError: naming ``path``: a missing field (listing the point and cell
                fields), a name that is both a point and a cell field, targets in two
                places or elsewhere than in the first file, a cell-data input of a point
                sample, bad cell data, an unknown or bad tag, a missing or bad parameter.
        """
        path = Path(path)
        location = self._resolve_location(mesh, path, need_targets)
        mesh = self._with_geometry(mesh, path)
        names = self.inputs + (self.targets if need_targets else [])
        where = {n: self._where(mesh, n, path) for n in names}
        if location == "points":
            cells_in = [n for n in names if where[n] == "cells"]
            if cells_in:
                raise MeshError(
                    f"{path}: input {cells_in[0]!r} is cell data but the targets are point "
                    f"data: a per-cell value has no value at a vertex shared by cells; give "
                    f"the targets as cell data too, or the input as point data")
            sample = copy.copy(mesh)
            sample.fields = dict(mesh.fields)
            sample.fields.update(tag_channels(mesh, self.tags, "points", source=str(path)))
        else:
            cp = cell_points(mesh, str(path))
            fields = {n: (cell_field(mesh, n, cp, str(path)) if where[n] == "cells"
                          else point_to_cells(mesh.fields[n], cp, n, str(path)))
                      for n in names}
            fields.update(tag_channels(mesh, self.tags, "cells", cp.num_cells, str(path)))
            sample = MeshData(pos=torch.from_numpy(cp.centroid), weight=torch.from_numpy(
                cp.measure), fields=fields, source=getattr(mesh, "source", None) or str(path))
            sample.field_data = mesh.field_data
        if self.params:
            sample.params = self._params(mesh, path)
        return sample

    def _params(self, mesh, path: Path) -> torch.Tensor:
        """``params [1, K]`` of ``mesh``: its own ``params`` when it carries them (checked:
        K finite values), else from its file's ``field_data`` or its folder's table; a
        file that gives other values than the mesh's own is warned of, the mesh's win."""
        import warnings

        own = getattr(mesh, "params", None)
        if own is None:
            return sample_params(self.params, path, mesh.field_data, self._table(path.parent))
        own = torch.as_tensor(own, dtype=torch.float64).reshape(1, -1)
        if own.shape[1] != len(self.params) or not torch.isfinite(own).all():
            raise MeshError(f"{path}: MeshData.params holds {own.reshape(-1).tolist()}; the run "
                            f"takes {len(self.params)} finite parameter(s) "
                            f"({', '.join(self.params)})")
        if not path.is_file():  # built in Python: no file of its own to compare with
            return own
        try:
            recorded = sample_params(self.params, path, mesh.field_data,
                                     self._table(path.parent))
        except MeshError:  # the file does not give them: nothing to compare
            return own
        if not torch.equal(recorded, own):
            warnings.warn(f"{path}: MeshData.params {own.reshape(-1).tolist()} differ from "
                          f"the file's parameters {recorded.reshape(-1).tolist()} "
                          f"({', '.join(self.params)}); using MeshData.params", stacklevel=2)
        return own

    def _with_geometry(self, mesh, path):
        """``mesh`` with the geometry features among the inputs as point fields (a shallow
        copy; ``mesh`` itself unchanged), or ``mesh`` when none is asked for."""
        wanted = [n for n in self.inputs if n in GEOMETRY_FIELDS]
        if not wanted:
            return mesh
        have = [n for n in wanted if n in (getattr(mesh, "fields", None) or {})
                or n in (getattr(mesh, "cell_data", None) or {})]
        if have:
            raise MeshError(f"{path}: the file has a field {have[0]!r}, the name of a geometry "
                            f"feature meshops computes; rename the field")
        try:
            channels = geometry_channels(mesh)
        except MeshError as e:
            raise MeshError(f"{path}: {e}") from None
        out = copy.copy(mesh)
        out.fields = dict(mesh.fields)
        dtype = next((v.dtype for v in mesh.fields.values() if v.is_floating_point()),
                     mesh.pos.dtype)
        out.fields.update({n: channels[n].to(dtype) for n in wanted})
        return out

    def prediction_data(self, mesh, predictions: dict) -> tuple[dict, dict]:
        """``(point_data, cell_data)`` to write ``predictions`` (``{name: values}`` at the
        layout's location) onto ``mesh``: point data for a point sample; for a cell
        sample cell data, one array per cell block, NaN on blocks of lower dimension."""
        if self.location != "cells":
            return dict(predictions), {}
        cp = cell_points(mesh)
        return {}, {k: cells_to_blocks(v, cp) for k, v in predictions.items()}


def _identity(folder: Path) -> tuple:
    """What tells one state of ``folder``'s parameter files from another: each one's
    name, inode, size and modification time (``None`` for a missing one)."""
    out = []
    for name in PARAM_FILES:
        try:
            st = (folder / name).stat()
        except OSError:
            out.append(None)
            continue
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)
