"""Time series of fields on one mesh: reading them (:func:`read_series`,
:func:`list_series`) and writing them for ParaView (:func:`write_series`).

A series is one of

* a **folder of numbered files**, one mesh file per time step (``u_0000.vtu``,
  ``u_0001.vtu``, ...; any meshio format; the numbers may go in steps of more than
  one, ``u_0000``, ``u_0010``, ...). The time of a step is its ``TimeValue`` field
  data when every file has one (ParaView writes it), else its number;
* a **ParaView collection** ``name.pvd`` whose ``DataSet`` entries name one file per
  time step (``timestep`` attribute = the time);
* an **XDMF time series** ``name.xdmf`` (a temporal collection, as meshio's
  ``TimeSeriesWriter``, FEniCS and many solvers write it; HDF5 data needs ``h5py``).

Every step must be on the mesh of the first step (same points and cells), the times
must increase strictly, and no step may be missing or appear twice; otherwise one
:class:`SeriesError` names the file and the time step. The first step's mesh gets every
check of :func:`meshops.read_mesh`; the later ones are compared with it.

Scalar parameters of a series (``params [1, K]``, the library's contract for
per-sample parameter vectors) are read as :mod:`meshops.datasets.params` reads them for a mesh
file: from the field data of the series' first file, or from a ``params.csv`` (or
``params.json``) in the folder that holds the series, keyed by the series' name (the
folder's name, or the ``.pvd``/``.xdmf`` file's name)::

    file,kappa,amplitude
    traj_000,0.5,2.0
    run_b.pvd,0.7,1.5

Shapes:
    ``TimeSeries.fields[name]``: ``[T, N]`` or ``[T, N, c]``; ``times [T]``;
    ``params [1, K]``
"""

from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from meshops.datasets.folder import DEFAULT_SUFFIXES, check_finite_fields, list_mesh_files
from meshops.datasets.params import read_param_table, sample_params
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.io import WEIGHT_FIELD, mesh_from_arrays, read_meshio

__all__ = ["SeriesError", "TimeSeries", "list_series", "read_series", "read_series_folder",
           "read_state", "series_name", "write_series"]
# ParaView's field-data name for the time of a dataset.
TIME_VALUE = "TimeValue"
_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<num>\d+)$")


class SeriesError(MeshError):
    """A time series that cannot be used as one: a missing or duplicated step, times
    that do not increase, steps on different meshes, a missing field or parameter.
    The message names the file and the time step."""


@dataclass
class TimeSeries:
    """The steps of one time series on one mesh.

    Attributes:
        name: The series' name (its folder's name, or the file name without suffix).
        source: The folder, ``.pvd`` or ``.xdmf`` it was read from.
        mesh: The first step's mesh (``pos [N, d]``, ``weight [N]``, ``cells``), checked
            like :func:`meshops.read_mesh`; its ``fields`` are the first step's.
        times: ``[T]`` float64, strictly increasing.
        steps: ``[T]`` the file each step came from (``"data/s01/u_0003.vtu"``; the
            ``.xdmf`` file for all steps of one), for messages.
        fields: point field name -> ``[T, N]`` or ``[T, N, c]`` (float64 for floating
            fields).
        params: ``[1, K]`` float64 parameter vector, or None.
        param_names: The names of ``params``' columns.
    """

    name: str
    source: Path
    mesh: MeshData
    times: Tensor
    steps: list[str]
    fields: dict[str, Tensor]
    params: Tensor | None = None
    param_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.times.shape[0])

    def label(self, k: int) -> str:
        """``"<file> (time step k, t=...)"``: step ``k`` as messages name it."""
        return f"{self.steps[k]} (time step {k}, t={float(self.times[k]):g})"

    def channels(self, names: Sequence[str], dtype: torch.dtype = torch.float64) -> Tensor:
        """The fields ``names`` of every step concatenated along channels.

        Shapes:
            -> ``[T, N, C]`` (a ``[T, N]`` field is one channel, ``[T, N, c]`` is ``c``)
        """
        t, n = len(self), int(self.mesh.pos.shape[0])
        cols = [self.fields[k].reshape(t, n, -1).to(dtype) for k in names]
        return torch.cat(cols, 2) if cols else torch.zeros(t, n, 0, dtype=dtype)


# --------------------------------------------------------------------- locating
def series_name(path: str | os.PathLike) -> str:
    """A series' name: its folder's name, or its file's name without the suffix."""
    path = Path(path)
    return path.name if path.is_dir() else path.stem


def _suffix(name: str) -> str:
    low = name.lower()
    return next(s for s in DEFAULT_SUFFIXES if low.endswith(s))


def list_series(root: str | os.PathLike) -> list[Path]:
    """The series in a folder, in natural name order: its ``.pvd`` and ``.xdmf``/``.xmf``
    files and its subfolders (but not the folder ``X/`` beside ``X.pvd``, which holds
    that collection's files). A folder that holds numbered mesh files and no series is
    itself one series.

    Raises:
        SeriesError: no such folder, no series in it, or series beside loose mesh files.
    """
    from meshops.datasets.folder import natural_key

    root = Path(root)
    if not root.is_dir():
        if root.is_file() and root.suffix.lower() in (".pvd", ".xdmf", ".xmf"):
            return [root]
        raise SeriesError(f"{root}: no such folder of time series")
    entries = [p for p in root.iterdir() if not p.name.startswith(".")]
    pvd_stems = {p.stem for p in entries if p.is_file() and p.suffix.lower() == ".pvd"}
    found = [p for p in entries
             if (p.is_file() and p.suffix.lower() in (".pvd", ".xdmf", ".xmf"))
             or (p.is_dir() and p.name not in pvd_stems)]
    loose = [p for p in list_mesh_files(root) if p.suffix.lower() not in (".xdmf", ".xmf")]
    if found and loose:
        raise SeriesError(f"{root}: holds both time series ({found[0].name}, ...) and loose "
                          f"mesh files ({loose[0].name}, ...); put each series in its own "
                          f"folder, .pvd or .xdmf file")
    if not found:
        if loose:
            return [root]
        raise SeriesError(f"{root}: no time series in this folder (looked for subfolders "
                          f"of numbered mesh files, .pvd and .xdmf files)")
    return sorted(found, key=lambda p: natural_key(p.name))


def _numbered_steps(folder: Path) -> list[tuple[Path, float]]:
    """``(file, number)`` of a folder of numbered mesh files, in order; refuses gaps,
    duplicates and files of several series."""
    files = [p for p in list_mesh_files(folder)]
    if not files:
        raise SeriesError(f"{folder}: no mesh files in this series folder")
    groups: dict[str, list[tuple[int, Path]]] = {}
    for f in files:
        stem = f.name[:-len(_suffix(f.name))]
        m = _NUMBERED.match(stem)
        if m is None:
            raise SeriesError(f"{f}: no time step number at the end of the file name; a "
                              f"series folder holds numbered files such as u_0000.vtu, "
                              f"u_0001.vtu, ...")
        groups.setdefault(m["prefix"], []).append((int(m["num"]), f))
    if len(groups) > 1:
        names = ", ".join(f"{p}*" for p in sorted(groups))
        raise SeriesError(f"{folder}: holds the files of several series ({names}); put one "
                          f"series in a folder")
    (steps,) = groups.values()
    steps.sort(key=lambda s: (s[0], s[1].name))
    for (a, fa), (b, fb) in zip(steps, steps[1:]):
        if a == b:
            raise SeriesError(f"{folder}: time step {a} appears twice ({fa.name} and "
                              f"{fb.name})")
    if len(steps) < 2:
        raise SeriesError(f"{folder}: a time series needs at least two time steps, found "
                          f"{len(steps)} ({steps[0][1].name})")
    nums = [n for n, _ in steps]
    stride = min(b - a for a, b in zip(nums, nums[1:]))
    for (a, fa), (b, fb) in zip(steps, steps[1:]):
        if b - a != stride:
            raise SeriesError(f"{folder}: time step {a + stride} is missing (the files go "
                              f"from {fa.name} to {fb.name}; the other steps are {stride} "
                              f"apart)")
    return [(f, float(n)) for n, f in steps]


def _pvd_steps(pvd: Path) -> list[tuple[Path, float]]:
    """``(file, time)`` of the entries of a ParaView collection, in file order."""
    try:
        root = ET.parse(pvd).getroot()
    except (ET.ParseError, OSError) as e:
        raise SeriesError(f"{pvd}: cannot read the ParaView collection ({e})") from None
    coll = root.find("Collection")
    if root.tag != "VTKFile" or root.get("type") != "Collection" or coll is None:
        raise SeriesError(f"{pvd}: not a ParaView collection (a VTKFile of type "
                          f"\"Collection\" with a <Collection> element)")
    steps: list[tuple[Path, float]] = []
    for i, ds in enumerate(coll.findall("DataSet")):
        file, t = ds.get("file"), ds.get("timestep")
        if file is None:
            raise SeriesError(f"{pvd}: DataSet entry {i} has no file attribute")
        if t is None:
            raise SeriesError(f"{pvd}: DataSet entry {i} ({file}) has no timestep attribute")
        try:
            t = float(t)
        except ValueError:
            raise SeriesError(f"{pvd}: DataSet entry {i} ({file}) has timestep {t!r}, not a "
                              f"number") from None
        if not math.isfinite(t):
            raise SeriesError(f"{pvd}: DataSet entry {i} ({file}) has timestep {t}")
        if steps and t == steps[-1][1]:
            parts = {e.get("part", "0") for e in coll.findall("DataSet")}
            what = ("several parts per time step (a multi-block collection) are not "
                    "supported" if len(parts) > 1 else "a duplicated time step")
            previous = coll.findall("DataSet")[i - 1].get("file")
            raise SeriesError(f"{pvd}: time {t:g} appears twice (DataSet entries {i - 1} and "
                              f"{i}: {previous} and {file}): {what}")
        if steps and t < steps[-1][1]:
            raise SeriesError(f"{pvd}: DataSet entry {i} ({file}) has time {t:g} after "
                              f"{steps[-1][1]:g}: the times must increase")
        path = (pvd.parent / file)
        if not path.is_file():
            raise SeriesError(f"{pvd}: time step {i} (t={t:g}): file {path} not found")
        steps.append((path, t))
    if len(steps) < 2:
        raise SeriesError(f"{pvd}: a time series needs at least two time steps, found "
                          f"{len(steps)}")
    return steps


# ------------------------------------------------------------------------ reading
def _same_mesh(ref: "meshio.Mesh", other: "meshio.Mesh") -> str | None:  # noqa: F821
    """Why ``other``'s points or cells are not ``ref``'s (None when they are)."""
    p0, p1 = np.asarray(ref.points, np.float64), np.asarray(other.points, np.float64)
    if p0.shape != p1.shape:
        return f"{p1.shape[0]} points but the first step has {p0.shape[0]}"
    scale = max(float(np.abs(p0).max(initial=0.0)), 1.0)
    moved = np.abs(p0 - p1).max(axis=1, initial=0.0) > 1e-12 * scale
    if moved.any():
        i = int(np.flatnonzero(moved)[0])
        return (f"point {i} is at {p1[i].tolist()} but at {p0[i].tolist()} in the first step "
                f"({int(moved.sum())} points differ)")
    c0 = [(b.type, np.asarray(b.data)) for b in ref.cells]
    c1 = [(b.type, np.asarray(b.data)) for b in other.cells]
    if [(t, c.shape) for t, c in c0] != [(t, c.shape) for t, c in c1] or not all(
            np.array_equal(a, b) for (_, a), (_, b) in zip(c0, c1)):
        count = lambda cs: ", ".join(f"{c.shape[0]} {t}" for t, c in cs)  # noqa: E731
        return f"other cells ({count(c1)}) than the first step ({count(c0)})"
    return None


def _scalar_field_data(m, name: str):
    v = (getattr(m, "field_data", None) or {}).get(name)
    if v is None:
        return None
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    return float(v[0]) if v.size == 1 else None


def _read_file_steps(source: Path, steps: list[tuple[Path, float]], numbered: bool):
    """Each step's point data, times and labels, the first step's raw mesh and file."""
    raws = []
    for k, (f, _) in enumerate(steps):
        m = read_meshio(f)
        if raws:
            why = _same_mesh(raws[0], m)
            if why is not None:
                raise SeriesError(f"{f} (time step {k}, t={steps[k][1]:g}): not on the mesh "
                                  f"of the first step {steps[0][0].name}: {why}")
        raws.append(m)
    times = [t for _, t in steps]
    if numbered:  # ParaView's TimeValue, when every file has one, is the time
        values = [_scalar_field_data(m, TIME_VALUE) for m in raws]
        given = [v is not None for v in values]
        if any(given) and not all(given):
            k = given.index(False)
            raise SeriesError(f"{steps[k][0]} (time step {k}): no {TIME_VALUE} field data "
                              f"but {steps[given.index(True)][0].name} has one")
        if all(given):
            times = values
            for k in range(1, len(times)):
                if not times[k] > times[k - 1]:
                    raise SeriesError(
                        f"{steps[k][0]} (time step {k}): {TIME_VALUE} {times[k]:g} does not "
                        f"increase after {times[k - 1]:g} ({steps[k - 1][0].name})")
    return ([dict(m.point_data) for m in raws], times, [str(f) for f, _ in steps], raws[0],
            str(steps[0][0]))


def _read_xdmf_steps(path: Path):
    """Each step's point data, times and labels of an XDMF time series, its mesh and
    the name of its first step."""
    import meshio

    try:
        with meshio.xdmf.TimeSeriesReader(path) as reader:
            points, cells = reader.read_points_cells()
            mesh = meshio.Mesh(points, cells)
            data, times = [], []
            for k in range(reader.num_steps):
                # A step grid with its own geometry or topology (not an xi:include of
                # the shared mesh) is a step on another mesh, which meshio's reader
                # would silently ignore.
                for child in reader.collection[k]:
                    if child.tag not in ("Geometry", "Topology"):
                        continue
                    arr = np.asarray(reader._read_data_item(list(child)[0]))
                    refs = [np.asarray(points)] if child.tag == "Geometry" else \
                        [np.asarray(b.data) for b in mesh.cells]
                    if not any(arr.shape == r.shape and np.array_equal(arr, r) for r in refs):
                        raise SeriesError(f"{path} (time step {k}): this step has another "
                                          f"{child.tag.lower()} than the first step; steps "
                                          f"on different meshes are not supported")
                t, point_data, _ = reader.read_data(k)
                data.append(point_data)
                times.append(float(t))
    except SeriesError:
        raise
    except ImportError as e:
        raise SeriesError(f"{path}: its data is stored in HDF5; reading it needs h5py "
                          f"(pip install h5py) ({e})") from None
    except (meshio.ReadError, KeyError, ValueError, OSError, ET.ParseError) as e:
        raise SeriesError(f"{path}: cannot read as an XDMF time series (a temporal "
                          f"collection of grids) ({type(e).__name__}: {e})") from None
    labels = [str(path)] * len(times)
    first = str(path)
    if len(times) < 2:
        raise SeriesError(f"{path}: a time series needs at least two time steps, found "
                          f"{len(times)}")
    for k in range(1, len(times)):
        if times[k] == times[k - 1]:
            raise SeriesError(f"{path} (time step {k}): time {times[k]:g} appears twice "
                              f"(steps {k - 1} and {k})")
        if times[k] < times[k - 1]:
            raise SeriesError(f"{path} (time step {k}): time {times[k]:g} comes after "
                              f"{times[k - 1]:g}: the times must increase")
    return data, times, labels, mesh, first


def _read_steps(path: Path) -> tuple:
    """``(point data per step, times, step labels, the first step's meshio mesh, its
    file)`` of a folder of numbered files, a ``.pvd`` or an ``.xdmf``."""
    if path.is_dir():
        return _read_file_steps(path, _numbered_steps(path), True)
    if path.suffix.lower() == ".pvd" and path.is_file():
        return _read_file_steps(path, _pvd_steps(path), False)
    if path.suffix.lower() in (".xdmf", ".xmf") and path.is_file():
        return _read_xdmf_steps(path)
    if not path.exists():
        raise SeriesError(f"{path}: no such time series")
    raise SeriesError(f"{path}: not a time series (a folder of numbered mesh files, a "
                      f".pvd or an .xdmf file)")


def _check_step(pd: Mapping, names: Sequence[str], n: int, label: str) -> None:
    """One step has every field of ``names``, with ``n`` finite values each."""
    for name in names:
        if name not in pd:
            avail = ", ".join(sorted(x for x in pd if x != WEIGHT_FIELD)) or "none"
            raise SeriesError(f"{label}: point field {name!r} not found; available: {avail}")
        if len(pd[name]) != n:
            raise SeriesError(f"{label}: point field {name!r} has {len(pd[name])} values "
                              f"but the mesh has {n} points")
    try:
        check_finite_fields(pd, names, label)
    except MeshError as e:
        raise SeriesError(str(e)) from None


def read_series(path: str | os.PathLike, fields: Sequence[str] | None = None,
                params: Sequence[str] = (), params_table=None) -> TimeSeries:
    """Read one time series (a folder of numbered files, a ``.pvd`` or an ``.xdmf``).

    Args:
        path: The series.
        fields: Point fields to keep (default: those of the first step); every step
            must have them, with finite values.
        params: Parameter names to read: from the first file's field data or the
            parameter table of the series' folder (see the module docstring).
        params_table: That table (:func:`meshops.datasets.params.read_param_table`), when the
            caller has read it already.

    Returns:
        A :class:`TimeSeries`.

    Raises:
        SeriesError: (a :class:`~meshops.MeshError`) a missing, duplicated or
            out-of-order time step, a step on another mesh, a missing or non-finite
            field or parameter; the message names the file and the time step. The
            first step's mesh is checked as by :func:`meshops.read_mesh`.

    Example:
        >>> s = read_series("heat/train/traj_000", fields=["u"], params=["mu0", "mu1"])
        >>> s.fields["u"].shape, s.times[:3], s.params
        (torch.Size([100, 441]), tensor([0., 1., 2.]), tensor([[5.5378, 1.5724]]))
    """
    path = Path(path)
    data, times, labels, raw, first = _read_steps(path)
    mesh = mesh_from_arrays(raw.points, raw.cells, data[0], source=first)
    n = int(mesh.pos.shape[0])
    names = list(fields) if fields is not None else \
        [k for k in data[0] if k != WEIGHT_FIELD]
    series = TimeSeries(name=series_name(path), source=path, mesh=mesh,
                        times=torch.tensor(times, dtype=torch.float64), steps=labels,
                        fields={})
    for k, pd in enumerate(data):
        _check_step(pd, names, n, series.label(k))
    for name in names:
        arr = np.stack([np.asarray(pd[name]) for pd in data])
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float64)
        series.fields[name] = torch.from_numpy(np.ascontiguousarray(arr))
    if params:
        _attach_params(series, list(params), params_table, raw)
    return series


def read_series_folder(root: str | os.PathLike, fields: Sequence[str],
                       params: Sequence[str] = (), names: Sequence[str] | None = None,
                       desc: str = "reading series") -> list[TimeSeries]:
    """Every series of a folder (:func:`list_series`), with the parameter table of the
    folder, a progress bar, and the same field shapes and dimension in all of them.

    Args:
        root: The folder (or one series).
        fields: Point fields to read (every step needs them).
        params: Parameter names (see :func:`read_series`).
        names: Read only the series of these names (e.g. a run's training split);
            one that is not there is an error.
        desc: The progress bar's label.

    Raises:
        SeriesError: see :func:`read_series`; a field whose shape, or a mesh whose
            dimension, differs from the first series' (both series named).
    """
    from meshops.utils.progress import progress

    paths = list_series(root)
    if names is not None:
        by_name = {series_name(p): p for p in paths}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise SeriesError(f"{root}: series {missing[0]!r} not found ({len(missing)} of "
                              f"{len(names)} missing)")
        paths = [by_name[n] for n in names]
    table = read_param_table(Path(root)) if params and Path(root).is_dir() else None
    out: list[TimeSeries] = []
    for p in progress(paths, desc=desc, unit="series", leave=False):
        s = read_series(p, fields, params, table)
        if out:
            ref = out[0]
            for name in fields:
                a, b = tuple(ref.fields[name].shape[2:]), tuple(s.fields[name].shape[2:])
                if a != b:
                    raise SeriesError(f"{p}: field {name!r} has {_per_point(b)} but "
                                      f"{_per_point(a)} in {ref.source}")
            if s.mesh.pos.shape[1] != ref.mesh.pos.shape[1]:
                raise SeriesError(f"{p}: the mesh is {s.mesh.pos.shape[1]}-D but "
                                  f"{ref.source} is {ref.mesh.pos.shape[1]}-D")
        out.append(s)
    return out


def _per_point(shape: tuple) -> str:
    return "one value per point" if not shape else f"{'x'.join(map(str, shape))} per point"


def read_state(path: str | os.PathLike, fields: Sequence[str], params: Sequence[str] = (),
               params_table=None) -> TimeSeries:
    """One mesh file as a series of one step: an initial state to roll out from. Its
    time is its ``TimeValue`` field data, else 0; its parameters come from its field
    data or the parameter table beside it (keyed by the file's name).

    Raises:
        SeriesError: a missing field or parameter (the file is named); the mesh is
            checked as by :func:`meshops.read_mesh`.
    """
    path = Path(path)
    raw = read_meshio(path)
    mesh = mesh_from_arrays(raw.points, raw.cells, raw.point_data, source=str(path))
    t = _scalar_field_data(raw, TIME_VALUE)
    series = TimeSeries(name=path.stem, source=path, mesh=mesh,
                        times=torch.tensor([0.0 if t is None else t], dtype=torch.float64),
                        steps=[str(path)], fields={})
    for name in fields:
        if name not in mesh.fields:
            avail = ", ".join(sorted(k for k in mesh.fields if k != WEIGHT_FIELD)) or "none"
            raise SeriesError(f"{path}: point field {name!r} not found; available: {avail}")
    try:
        check_finite_fields(mesh.fields, fields, series.label(0))
    except MeshError as e:
        raise SeriesError(str(e)) from None
    series.fields = {k: mesh.fields[k].to(torch.float64)[None] if mesh.fields[k].is_floating_point()
                     else mesh.fields[k][None] for k in fields}
    if params:
        _attach_params(series, list(params), params_table, raw)
    return series


def _attach_params(series: TimeSeries, names: list[str], table, raw) -> None:
    """Set ``series.params [1, K]`` (:func:`meshops.datasets.params.sample_params`: the first
    file's field data ``raw.field_data``, or the table of the series' folder, keyed by
    the series' name)."""
    if table is None:
        table = read_param_table(series.source.parent)
    try:
        series.params = sample_params(names, series.source, raw.field_data, table)
    except MeshError as e:
        raise SeriesError(str(e)) from None
    series.param_names = list(names)


# ------------------------------------------------------------------------ writing
def write_series(path: str | os.PathLike, mesh: MeshData, steps: Sequence[Mapping],
                 times: Sequence[float]) -> Path:
    """Write a time series for ParaView: ``path`` (``name.pvd``) and one ``.vtu`` per
    step in the folder ``name/`` beside it, completely or not at all.

    The steps are written into a temporary folder first; only then is an existing
    ``name.pvd`` removed, the folder put in place of ``name/`` and the new ``name.pvd``
    written (atomically). So ``name.pvd`` never lists a file that is missing or
    belongs to another write; a writer killed half-way leaves the old series (or, in
    the short moment of the swap, none), and its temporary folder is removed by the
    next write there.

    Args:
        path: The ``.pvd`` file.
        mesh: The mesh (``pos``, ``cells``; its own fields are not written).
        steps: One mapping of point fields (``[N]`` or ``[N, c]``) per step.
        times: The time of each step, strictly increasing.

    Returns:
        ``path``.
    """
    from meshops.mesh.io import write_mesh
    from meshops.utils.atomic import atomic_folder, atomic_write

    path = Path(path)
    if path.suffix.lower() != ".pvd":
        raise SeriesError(f"{path}: a series is written as a .pvd collection")
    times = [float(t) for t in times]
    if len(times) != len(steps):
        raise SeriesError(f"{path}: {len(steps)} steps but {len(times)} times")
    for k in range(1, len(times)):
        if not times[k] > times[k - 1]:
            raise SeriesError(f"{path}: time step {k} has time {times[k]:g} after "
                              f"{times[k - 1]:g}: the times must increase")
    folder = path.with_suffix("")
    width = max(4, len(str(max(len(steps) - 1, 0))))
    names = [f"{folder.name}_{k:0{width}d}.vtu" for k in range(len(steps))]
    bare = MeshData(pos=mesh.pos, weight=mesh.weight, cells=getattr(mesh, "cells", None),
                    fields={})

    def write_steps(tmp: str) -> None:
        for name, data in zip(names, steps):
            write_mesh(Path(tmp) / name, bare, point_data=dict(data))

    atomic_folder(folder, write_steps, before_replace=lambda: path.unlink(missing_ok=True))
    root = ET.Element("VTKFile", type="Collection", version="0.1", byte_order="LittleEndian")
    coll = ET.SubElement(root, "Collection")
    for t, name in zip(times, names):
        ET.SubElement(coll, "DataSet", timestep=repr(t), group="", part="0",
                      file=f"{folder.name}/{name}")
    ET.indent(root)
    atomic_write(path, lambda tmp: ET.ElementTree(root).write(tmp, xml_declaration=True,
                                                               encoding="utf-8"))
    return path
