"""Data sets of meshes: a folder of mesh files, one file per sample.

:class:`MeshFolderDataset` reads one mesh file per sample, inputs and targets in the
point data (any format meshio reads: .vtu, .vtk, .msh, .xdmf, ...), and
:func:`export_to_folder` writes any samples to such a folder (to look at them in
ParaView, or to train on them with ``meshops train --data DIR``).

Every sample is a :class:`meshops.MeshData` with

* ``pos [N, d]``, ``weight [N]`` (quadrature weights),
* ``fields``: the point fields by name, each ``[N]`` or ``[N, c]``,
* ``x [N, C_in]``: the input channels concatenated (``[N, 0]`` for geometry-only
  problems, where the input is ``pos``),
* ``y [N, C_out]``: the target channels concatenated,
* ``source``: where the sample came from,
* ``params [1, K]`` with ``--params``: the parameter vector, always float64 (a
  timestamp-like 1.7e9 + 100 a would be quantised in float32; models standardise it
  in float64 before their own dtype),

and every other floating-point tensor in one ``dtype`` (float32 by default). The benchmark
readers of the separate ``data_adapters`` package build their samples with
:func:`add_inputs_targets` too, so examples can switch between them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import meshio
import numpy as np
import torch
from torch import Tensor

from meshops.datasets.layout import SampleLayout
from meshops.datasets.params import write_param_table
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.io import read_mesh, write_mesh

__all__ = ["DEFAULT_SUFFIXES", "MeshFolderDataset", "add_inputs_targets", "as_float_dtype",
           "check_finite_fields", "export_to_folder", "list_mesh_files", "stack_channels"]

# Cast to the samples' dtype; ``params`` stay float64 (see the module docstring).
_FLOAT_ATTRS = ("pos", "weight", "x", "y")


def check_finite_fields(fields, names: Sequence[str], source, role: str = "",
                        dtype: torch.dtype | None = None) -> None:
    """Refuse point fields with a NaN or infinite value, naming the first one.

    One vectorised pass per field; the index is only looked up on failure. A NaN
    in an input spreads through every global attention layer to the whole
    prediction, and one in a target makes the loss NaN: both are caught here, where
    the file is still known.

    Args:
        fields: Mapping of field name to ``[N]`` / ``[N, ...]`` tensors or arrays.
        names: The fields to check (non-floating fields are skipped).
        source: The file (or sample) named in the message.
        role: ``"input"``, ``"target"`` or ``""``, for the message.
        dtype: The floating dtype the values will be cast to: a value finite in the
            file but beyond that dtype's range (1e300 in float32) would become
            ``inf`` there, and is refused too.

    Raises:
        MeshError: ``"<source>: input field 'f' has a non-finite value (nan) at point
            17"`` (with the component of a vector field, and the count), or ``"...
            has a value (1e+300) at point 3 beyond the range of torch.float32"``.
    """
    for name in names:
        v = fields[name]
        v = v if isinstance(v, Tensor) else torch.as_tensor(v)
        if not (v.is_floating_point() or v.is_complex()):
            continue
        flat = v.reshape(v.shape[0], -1) if v.dim() else v.reshape(1, 1)
        finite = torch.isfinite(flat)
        overflow = False
        if bool(finite.all()):
            _check_not_below_range(flat, dtype, source, role, name)
            if dtype is None or not v.is_floating_point() or \
                    torch.finfo(dtype).max >= torch.finfo(v.dtype).max:
                continue
            finite = torch.isfinite(flat.to(dtype))
            if bool(finite.all()):
                continue
            overflow = True
        bad = (~finite).nonzero()
        i, c = int(bad[0, 0]), int(bad[0, 1])
        comp = f", component {c}" if flat.shape[1] > 1 else ""
        kind = f"values beyond {dtype}'s range" if overflow else "non-finite values"
        more = f" ({bad.shape[0]} {kind} in this field)" if bad.shape[0] > 1 else ""
        what = f"{role} field" if role else "field"
        if overflow:
            raise MeshError(f"{source}: {what} {name!r} has a value ({flat[i, c].item():g}) "
                            f"at point {i}{comp} beyond the range of {dtype} (largest "
                            f"{torch.finfo(dtype).max:g}){more}; rescale the field, or work "
                            f"in float64 (meshops train --dtype float64)")
        raise MeshError(f"{source}: {what} {name!r} has a non-finite value "
                        f"({flat[i, c].item()}) at point {i}{comp}{more}")


def _check_not_below_range(flat: Tensor, dtype, source, role: str, name: str) -> None:
    """A field that is not zero but whose every value is below the normal range of
    ``dtype`` (1e-40 in float32) would arrive as zeros and denormals with a few bits
    left: refused, naming the way out, rather than trained on as noise."""
    if dtype is None or not flat.is_floating_point() or not flat.numel():
        return
    tiny = torch.finfo(dtype).tiny
    if torch.finfo(flat.dtype).tiny >= tiny:
        return
    top = float(flat.abs().max())
    if 0 < top < tiny:
        what = f"{role} field" if role else "field"
        raise MeshError(f"{source}: {what} {name!r} is at most {top:g} in magnitude, below "
                        f"the normal range of {dtype} (smallest {tiny:g}): its values would "
                        f"be lost; rescale the field, or work in float64 (meshops train "
                        f"--dtype float64)")


def as_float_dtype(dtype) -> torch.dtype:
    """A floating torch dtype from a dtype or its name (``"float32"``, ``"float64"``, ...).

    Raises:
        MeshError: anything but float32, float64, float16 or bfloat16.
    """
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise MeshError(f"dtype must be a floating torch dtype (e.g. torch.float32), got {dtype!r}")
    return dtype


def stack_channels(fields: Mapping[str, torch.Tensor], names: Sequence[str], n: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """Concatenate the fields ``names`` in that order into one ``[N, C]`` tensor.

    Returns ``[N, 0]`` when ``names`` is empty.

    Shapes:
        each field ``[N]``, ``[N, c]`` or ``[N, ...]`` -> ``[N, C]`` (``C`` the sum of
        the fields' channel counts)
    """
    cols = []
    for name in names:
        v = fields[name]
        v = v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
        cols.append(v.reshape(n, -1).to(dtype))
    return torch.cat(cols, dim=1) if cols else torch.zeros((n, 0), dtype=dtype)


def add_inputs_targets(mesh: MeshData, inputs: Sequence[str], targets: Sequence[str],
                       dtype: torch.dtype, **attrs) -> MeshData:
    """Give ``mesh`` (in place) the sample layout of the module docstring.

    Sets ``x``/``y`` from the named point fields (:func:`stack_channels`) and the
    extra attributes ``attrs``, and casts every floating tensor (``pos``, ``weight``,
    ``x``, ``y``, ``fields``, floating ``attrs``) to ``dtype``, but ``params`` to
    float64 (see the module docstring). Unlike
    :func:`meshops.training.assemble` it changes ``mesh`` itself and allows empty
    ``targets`` (inference data).

    Raises:
        MeshError: an input or target field holds a NaN or infinite value (the
            message names the sample's ``source``, the field and the first point;
            see :func:`check_finite_fields`).
    """
    n = int(mesh.pos.shape[0])
    fields = getattr(mesh, "fields", None) or {}
    source = getattr(mesh, "source", None) or "sample"
    check_finite_fields(fields, inputs, source, "input", dtype)
    check_finite_fields(fields, targets, source, "target", dtype)
    mesh.x = stack_channels(fields, inputs, n, dtype)
    mesh.y = stack_channels(fields, targets, n, dtype)
    for k, v in attrs.items():
        setattr(mesh, k, v)
    for k in _FLOAT_ATTRS + tuple(attrs) + ("params",):
        v = getattr(mesh, k, None)
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            setattr(mesh, k, v.to(torch.float64 if k == "params" else dtype))
    if fields:
        mesh.fields = {k: v.to(dtype) if v.is_floating_point() else v
                       for k, v in fields.items()}
    return mesh


# Suffixes meshio reads, minus those that are not sample files on their own
# (.ele pairs with .node; .xml is DOLFIN's with side files) or not meshes (.svg, .wkt).
_EXCLUDED = {".ele", ".xml", ".svg", ".wkt"}
DEFAULT_SUFFIXES = tuple(sorted((set(meshio.extension_to_filetypes) - _EXCLUDED),
                                key=lambda s: (-len(s), s)))


def natural_key(name: str):
    """Sort key of a file name with its runs of digits as numbers (``s2`` before ``s10``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def list_mesh_files(root, suffixes: Sequence[str] | None = None) -> list[Path]:
    """Mesh files directly in ``root`` (not in subfolders), sorted by name.

    Names are compared in natural order (``sample_2`` before ``sample_10``; with
    zero-padded numbers, as :func:`export_to_folder` writes them, this is the plain
    alphabetical order). Hidden files (``.name``, e.g. the temporary files of an
    interrupted atomic write) are skipped.

    Args:
        root: Folder.
        suffixes: File suffixes to take (case-insensitive, with the dot); default all
            meshio formats except companion files (.ele, .xml) and .svg/.wkt.
    """
    root = Path(root)
    suffixes = tuple(s.lower() for s in (suffixes or DEFAULT_SUFFIXES))
    files = [p for p in root.iterdir()
             if p.is_file() and not p.name.startswith(".")
             and p.name.lower().endswith(suffixes)]
    return sorted(files, key=lambda p: natural_key(p.name))


class MeshFolderDataset(torch.utils.data.Dataset):
    """One mesh file per sample, with input and target arrays in the point data.

    Item ``k`` (file ``files[k]``) is the :class:`meshops.MeshData` that
    :func:`meshops.mesh.io.read_mesh` gives (``pos``, ``weight`` from the cells or the
    stored point-cloud weights, ``fields``, ``cells``, ``source``) plus

    * ``x [N, C_in]``: the ``inputs`` point fields concatenated in the given order
      (a ``[N]`` field is one channel, ``[N, c]`` is ``c``); ``[N, 0]`` when ``inputs``
      is empty (geometry-only problems: the input is ``pos``),
    * ``y [N, C_out]``: the ``targets``, likewise,

    with every floating tensor in ``dtype``. Every file must give the same channel
    counts as the first.

    Args:
        root: The folder.
        inputs: Point-field names for ``x`` (may be empty).
        targets: Point-field names for ``y`` (may be empty, e.g. for inference).
        dtype: ``torch.float32`` (default) or ``torch.float64``.
        suffixes: File suffixes to take (see :func:`list_mesh_files`).
        cache: Keep parsed samples in memory (each file is read once).
        params: Parameter names: each sample gets ``params [1, K]`` from its file's
            ``field_data`` or the folder's ``params.csv`` / ``params.json``
            (:mod:`meshops.datasets.params`).
        tags: Boundary tags: their channels (:func:`meshops.mesh.boundary.tag_channels`)
            follow the ``inputs`` in ``x``.
        layout: A :class:`meshops.datasets.layout.SampleLayout` with these inputs and targets,
            instead of ``params`` and ``tags`` (e.g. a run's, with its location).

    Targets stored as cell data make cell samples: one point per cell at its
    centroid with the cell's measure as weight (:mod:`meshops.mesh.cells`); the location
    is taken from the first file (``layout.location``) and every file must agree.

    Raises:
        MeshError: a missing or empty folder; a file that cannot be read or is broken
            (see :func:`meshops.mesh.io.read_mesh`, which also rejects fields whose length
            is not N); a missing field (the message lists the available ones);
            channel counts that differ from the first file's; a NaN or infinite
            value in an input or target field (the message names the file, the
            field and the first such point). The first file is checked at
            construction, the others when they are read.

    Shapes:
        item: pos ``[N, d]``, weight ``[N]``, x ``[N, C_in]``, y ``[N, C_out]``

    Example:
        >>> export_to_folder([meshops.read_mesh("examples/meshes/annulus.vtu")], "annuli")
        [PosixPath('annuli/sample_0000.vtu')]
        >>> ds = MeshFolderDataset("annuli", inputs=[], targets=["u"])
        >>> ds[0].x.shape, ds[0].y.shape
        (torch.Size([520, 0]), torch.Size([520, 1]))
    """

    def __init__(self, root, inputs: Sequence[str] = (), targets: Sequence[str] = (),
                 dtype=torch.float32, suffixes: Sequence[str] | None = None,
                 cache: bool = False, params: Sequence[str] = (), tags: Sequence[str] = (),
                 layout=None) -> None:
        self.root = Path(root)
        if isinstance(inputs, str) or isinstance(targets, str):
            raise MeshError("inputs and targets are lists of field names, e.g. ['T'], "
                            "not a single string")
        if layout is None:
            layout = SampleLayout(inputs, targets, params, tags)
        elif (layout.inputs, layout.targets) != (list(inputs), list(targets)) or params or tags:
            raise MeshError("MeshFolderDataset: give params and tags in the layout, whose "
                            "inputs and targets must be these")
        self.layout = layout
        # x holds the inputs and then the tags' channels
        self.inputs, self.targets = layout.input_fields, list(targets)
        self.dtype = as_float_dtype(dtype)
        if not self.root.is_dir():
            raise MeshError(f"{self.root}: no such folder")
        self.files = list_mesh_files(self.root, suffixes)
        if not self.files:
            shown = ", ".join(suffixes or (".vtu", ".vtk", ".msh", ".xdmf", "..."))
            raise MeshError(f"{self.root}: no mesh files in this folder (looked for {shown})")
        self.cache = cache
        self._cache: dict[int, MeshData] = {}
        self._channels: tuple[int, int] | None = None
        self[0]  # fail early on a missing field or a broken first file

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, k: int) -> MeshData:
        if not -len(self) <= k < len(self):
            raise IndexError(f"index {k} out of range for {len(self)} files")
        k = k % len(self)
        if k in self._cache:
            return self._cache[k]
        path = self.files[k]
        # (refuses missing fields, naming the point and cell fields there are)
        mesh = self.layout.view(read_mesh(path), path)
        # (also refuses NaN/inf values)
        mesh = add_inputs_targets(mesh, self.inputs, self.targets, self.dtype)
        counts = (int(mesh.x.shape[1]), int(mesh.y.shape[1]))
        if self._channels is None:
            self._channels = counts
        elif counts != self._channels:
            raise MeshError(f"{path}: inputs/targets have {counts[0]}/{counts[1]} channels but "
                            f"{self.files[0].name} has {self._channels[0]}/{self._channels[1]}")
        if self.cache:
            self._cache[k] = mesh
        return mesh

    @property
    def num_channels(self) -> tuple[int, int]:
        """``(C_in, C_out)`` of the samples (from the first file)."""
        return self._channels


def _earlier_export(root: Path, prefix: str, fmt: str, overwrite: bool) -> list[Path]:
    """The files of an earlier export in ``root`` (``PREFIX_<k>.FMT``), refused unless
    ``overwrite``."""
    if root.exists() and not root.is_dir():
        raise MeshError(f"{root}: exists and is not a folder")
    pattern = re.compile(rf"^{re.escape(prefix)}_\d+{re.escape(fmt)}$")
    old = [p for p in root.iterdir() if pattern.match(p.name)] if root.is_dir() else []
    if old and not overwrite:
        raise MeshError(f"{root}: already holds {len(old)} exported files such as {old[0].name}; "
                        "pass overwrite=True to replace them or choose another folder")
    return old


def _check_params(samples, param_names: Sequence[str]) -> None:
    """Every sample has ``params [1, len(param_names)]``."""
    for k in range(len(samples)):
        p = getattr(samples[k], "params", None)
        if p is None or tuple(p.shape) != (1, len(param_names)):
            shape = "none" if p is None else list(p.shape)
            raise MeshError(f"export_to_folder: sample {k} has params {shape}, not [1, "
                            f"{len(param_names)}] for the names {list(param_names)}")


def export_to_folder(samples: Iterable[MeshData], root, fmt: str = ".vtu",
                     prefix: str = "sample", overwrite: bool = False,
                     param_names: Sequence[str] | None = None) -> list[Path]:
    """Write samples (of any adapter) to a folder that :class:`MeshFolderDataset` reads.

    Sample ``k`` goes to ``root/{prefix}_{k:0Wd}{fmt}`` (``W`` digits, at least 4),
    written atomically by :func:`meshops.mesh.io.write_mesh` with its ``fields`` as point
    data (a sample without ``fields`` gets its ``x``/``y`` written as ``"x"``/``"y"``).
    Point clouds (no cells) are written as vertex cells with their quadrature
    weights, so they read back with the same weights. With ``param_names``, every
    sample's ``params [1, K]`` is written to ``root/params.csv`` under these names
    (:mod:`meshops.datasets.params`: read back with ``MeshFolderDataset(..., params=...)`` or
    ``meshops train --params``). Other per-sample attributes that are not point data
    (``cl``, ``grid_shape``, ...) are not written.

    Args:
        samples: ``MeshData`` samples (a list or a data set).
        root: Output folder (created if needed).
        fmt: File suffix, e.g. ``".vtu"``, ``".vtk"``, ``".xdmf"``, ``".msh"``.
        prefix: File name prefix.
        overwrite: Replace files of an earlier export (``{prefix}_<digits>{fmt}``).
            Without it, a folder that already holds such files is an error, so that
            two exports are never mixed into one data set.
        param_names: Names of the samples' ``params`` columns (``K`` of them).

    Returns:
        The written paths, in sample order.

    Example:
        >>> from data_adapters import make_elasticity_standin    # any adapter's samples
        >>> paths = export_to_folder(make_elasticity_standin(8), "elasticity_vtu")
        >>> len(MeshFolderDataset("elasticity_vtu", inputs=[], targets=["sigma"]))
        8
    """
    root = Path(root)
    samples = samples if hasattr(samples, "__len__") else list(samples)
    if not fmt.startswith("."):
        fmt = "." + fmt
    old = _earlier_export(root, prefix, fmt, overwrite)
    if param_names is not None:
        _check_params(samples, param_names)
    width = max(4, len(str(max(len(samples) - 1, 0))))
    written = []
    for k in range(len(samples)):
        s = samples[k]
        if not isinstance(s, MeshData):
            raise MeshError(f"export_to_folder: sample {k} is a {type(s).__name__}, "
                            "not a MeshData")
        extra = None
        if not (getattr(s, "fields", None) or {}):
            extra = {name: getattr(s, name) for name in ("x", "y")
                     if getattr(s, name, None) is not None and getattr(s, name).shape[1] > 0}
        written.append(write_mesh(root / f"{prefix}_{k:0{width}d}{fmt}", s, point_data=extra))
    if param_names is not None:
        write_param_table(root, list(param_names), {
            path.name: samples[k].params.reshape(-1).tolist() for k, path in enumerate(written)})
    for p in old:  # stale files of an earlier, longer export
        if p not in written:
            p.unlink()
    return written
