"""Reading a benchmark data folder as plain arrays (numpy and meshio only).

Both the benchmark and the peers' runner (in its own virtual environment, without
meshops) read the same ``.vtu`` files through this module, so every model sees
the same data. A data set folder is what
:func:`data_adapters.parametric.write_parametric_folders` writes: ``train/`` and
``test/`` with one mesh per sample and ``dataset.json``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from benchmarks.accuracy.metric import lumped_mass_weights


@dataclass
class Sample:
    """One mesh file as arrays.

    Attributes:
        given_params: ``[K]`` the parameters of ``params.json`` beside the file, if any.
        name: File name.
        points: ``[N, d]`` node coordinates: ``d = 2`` for a plane mesh (a zero ``z``
            dropped), 3 for tetrahedra or a surface in space.
        cells: The P1 simplices: triangles ``[M, 3]`` (quads split in two) or, where the
            file has any, its tetrahedra ``[M, 4]``.
        inputs: ``[N, K]`` the input fields (the parameters, constant per sample).
        targets: ``[N, C]`` the target fields, concatenated in order.
        weight: ``[N]`` P1 lumped-mass weights (:func:`lumped_mass_weights`).
    """

    name: str
    points: np.ndarray
    cells: np.ndarray
    inputs: np.ndarray
    targets: np.ndarray
    weight: np.ndarray
    given_params: np.ndarray | None = None

    @property
    def params(self) -> np.ndarray:
        """``[K]``: the sample's parameters from the folder's ``params.json`` (a family of
        geometries: its shape parameters), else the inputs' mean over the nodes (the
        parameters of a parametric set)."""
        return self.inputs.mean(0) if self.given_params is None else self.given_params


def natural_key(name: str):
    """Sort key ``sample_2 < sample_10`` (the order ``meshops`` lists a folder in)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def list_files(folder) -> list[str]:
    """The ``.vtu`` file names of ``folder`` in natural order."""
    return sorted((p.name for p in Path(folder).glob("*.vtu")), key=natural_key)


def _field(mesh, name: str, path: Path) -> np.ndarray:
    if name not in mesh.point_data:
        raise KeyError(f"{path}: no point field {name!r}; available: {sorted(mesh.point_data)}")
    v = np.asarray(mesh.point_data[name], np.float64)
    return v.reshape(len(mesh.points), -1)


def read_sample(path, inputs: Sequence[str], targets: Sequence[str],
                extra: Sequence[str] = ()) -> Sample:
    """Read one ``.vtu`` file. ``extra`` fields (e.g. ``u_pred``) are read as targets
    would be and returned in ``targets`` after them, in order."""
    import meshio

    path = Path(path)
    mesh = meshio.read(path)
    cells = _simplices(mesh, path)
    points = np.asarray(mesh.points, np.float64)
    flat = cells.shape[1] == 3 and points.shape[1] == 3 and not np.any(points[:, 2])
    points = points[:, :2] if flat or points.shape[1] == 2 else points[:, :3]
    cols = [_field(mesh, k, path) for k in inputs]
    outs = [_field(mesh, k, path) for k in list(targets) + list(extra)]
    return Sample(path.name, points, cells,
                  np.concatenate(cols, 1) if cols else np.zeros((len(points), 0)),
                  np.concatenate(outs, 1), lumped_mass_weights(points, cells))


def _simplices(mesh, path: Path) -> np.ndarray:
    """The tetrahedra of a meshio mesh if it has any (its boundary triangles left
    out), else its triangles, quads (a structured grid) as two triangles each: the cells
    of the P1 weights and interpolation."""
    tets = [c.data for c in mesh.cells if c.type == "tetra"]
    tri = [c.data for c in mesh.cells if c.type == "triangle"]
    tri += [np.asarray(c.data)[:, idx] for c in mesh.cells if c.type == "quad"
            for idx in ([0, 1, 2], [0, 2, 3])]
    if not tets and not tri:
        raise ValueError(f"{path}: no tetra, triangle or quad cells")
    return np.concatenate(tets or tri).astype(np.int64)


def read_split(root, split: str, inputs: Sequence[str], targets: Sequence[str],
               names: Sequence[str] | None = None) -> list[Sample]:
    """The samples of ``root/split`` (all ``.vtu`` files in natural order, or ``names``)."""
    folder = Path(root) / split
    names = list_files(folder) if names is None else list(names)
    if not names:
        raise FileNotFoundError(f"{folder}: no .vtu files")
    sidecar = folder / "params.json"
    params = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    out = []
    for n in names:
        s = read_sample(folder / n, inputs, targets)
        if n in params:  # sorted by name: the order is the same for every sample
            s.given_params = np.asarray([params[n][k] for k in sorted(params[n])], np.float64)
        out.append(s)
    return out


def description(root) -> dict:
    """``root/dataset.json``: inputs, targets, file names per split, description."""
    return json.loads((Path(root) / "dataset.json").read_text())


def same_mesh(samples: Sequence[Sample]) -> bool:
    """Whether all samples share one mesh (same points and cells)."""
    a = samples[0]
    return all(s.points.shape == a.points.shape and s.cells.shape == a.cells.shape
               and np.array_equal(s.points, a.points) and np.array_equal(s.cells, a.cells)
               for s in samples[1:])
