"""A folder of meshes read as lean training samples, in memory.

:func:`load_folder` reads every mesh of a folder (a :class:`MeshFolderDataset`) into
samples holding only what training needs (``pos``, ``weight``, ``x``, ``y``,
``source``, ``params``), with their field shapes and dimension checked to agree
across the files; :func:`mesh_files` lists the files named directly or in folders.
:mod:`~meshops.datasets.lazy` reads the same samples through an on-disk cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from meshops.datasets.fields import field_shape, format_shape
from meshops.datasets.folder import MeshFolderDataset, list_mesh_files
from meshops.errors import UsageError
from meshops.utils.progress import progress


def mesh_files(paths: Sequence[str]) -> list[Path]:
    """Mesh files named directly or found in the named folders."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = list_mesh_files(p)
            if not found:
                raise UsageError(f"{p}: no mesh files in this folder")
            out += found
        else:
            out.append(p)
    return out


def load_folder(root, inputs: Sequence[str], targets: Sequence[str], dtype,
                desc: str = "reading", layout=None, check: Callable | None = None
                ) -> tuple[list, list, dict, int]:
    """Read every mesh of a folder as a lean training sample.

    Returns ``(files, samples, field_shapes, pos_dim)``; the samples carry ``pos``,
    ``weight``, ``x``, ``y``, ``source`` and, with parameters, ``params``. ``layout``
    (:class:`meshops.datasets.layout.SampleLayout`) says how a file becomes a sample; it learns
    its location (points or cells) from the first file. Field shapes and the spatial
    dimension must agree across the files (the error names the first that
    disagrees). Input and target values must be finite (checked by the data set);
    ``check(sample, path, shapes)``, when given, may refuse a file's sample before it is
    kept (a fit refuses a target field that is zero everywhere,
    :class:`meshops.fitting.data.NonzeroTargets`).
    (:func:`meshops.datasets.lazy.load_folder_cached` is the same through an on-disk
    cache, for folders larger than memory.)
    """
    ds = MeshFolderDataset(root, inputs=inputs, targets=targets, dtype=dtype,
                           layout=layout)
    samples, shapes, dim = [], None, None
    for i in progress(range(len(ds)), desc=desc, unit="mesh", leave=False):
        sample, sh, d = read_sample(ds, i, targets, check)
        if shapes is None:
            shapes, dim = sh, d
        else:
            check_same_layout(ds.files[i], sh, d, shapes, dim, ds.files[0])
        samples.append(sample)
    return list(ds.files), samples, shapes, dim


def read_sample(ds, i: int, targets: Sequence[str], check: Callable | None = None):
    """The lean training sample of file ``i`` of a :class:`MeshFolderDataset` ``ds``,
    with the shapes of its input fields (those of its layout: tags' channels too) and
    targets, and its dimension: ``(sample, {field: shape}, pos_dim)``; with targets,
    ``check(sample, path, shapes)`` (when given) may refuse it."""
    from meshops.mesh.data import MeshData

    s = ds[i]
    path = ds.files[i]
    sh = {k: field_shape(s.fields[k]) for k in list(ds.inputs) + list(targets)}
    if targets and check is not None:
        check(s, path, sh)
    sample = MeshData(pos=s.pos, weight=s.weight, x=s.x, y=s.y, source=str(path))
    if getattr(s, "params", None) is not None:
        sample.params = s.params
    return sample, sh, int(s.pos.shape[1])


def check_same_layout(path, sh: dict, dim: int, shapes: dict, first_dim: int, first) -> None:
    """File ``path`` has the field shapes and dimension of the first file ``first``."""
    for k in shapes:
        if sh[k] != shapes[k]:
            raise UsageError(f"{path}: field {k!r} is {format_shape(sh[k])} but it is "
                           f"{format_shape(shapes[k])} in {Path(first).name}")
    if dim != first_dim:
        raise UsageError(f"{path}: the mesh is {dim}-D but {Path(first).name} is {first_dim}-D")
