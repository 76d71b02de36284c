"""Folders of mesh files as the commands read them.

Every use of the mesh-folder data set (:class:`MeshFolderDataset`,
:func:`list_mesh_files`) by the ``meshops`` command goes through this module, so
that the data set's home is named in one place (the two functions just below).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from meshops.errors import UsageError
from meshops.inference.predict import field_shape, format_shape
from meshops.runs.common import progress


def folder_dataset(root, inputs: Sequence[str], targets: Sequence[str], dtype, layout=None):
    """A :class:`MeshFolderDataset` of ``root``: one sample per mesh file (read as
    ``layout`` says, a :class:`meshops.datasets.layout.SampleLayout` of these inputs and targets:
    cell samples, parameters, boundary tags)."""
    from meshops.datasets.folder import MeshFolderDataset

    return MeshFolderDataset(root, inputs=inputs, targets=targets, dtype=dtype, layout=layout)


def mesh_files(paths: Sequence[str]) -> list[Path]:
    """Mesh files named directly or found in the named folders."""
    from meshops.datasets.folder import list_mesh_files

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
                desc: str = "reading", layout=None, fields: Sequence[str] | None = None
                ) -> tuple[list, list, dict, int]:
    """Read every mesh of a folder as a lean training sample.

    Returns ``(files, samples, field_shapes, pos_dim)``; the samples carry ``pos``,
    ``weight``, ``x``, ``y``, ``source`` and, with parameters, ``params``. ``layout``
    (:class:`meshops.datasets.layout.SampleLayout`) says how a file becomes a sample; it learns
    its location (points or cells) from the first file. Field shapes and the spatial
    dimension must agree across the files (the error names the first that
    disagrees). Input and target values must be finite (checked by the data set),
    and a mesh where a target field (of ``fields``, the specs ``u+v, p``; ``None``: all
    targets as one) is zero everywhere is refused: the relative L2 loss is undefined
    for it. (:func:`meshops.fitting.lazy.load_folder_cached` is the same through an
    on-disk cache, for folders larger than memory.)
    """
    ds = folder_dataset(root, inputs, targets, dtype, layout)
    samples, shapes, dim = [], None, None
    for i in progress(range(len(ds)), desc=desc, unit="mesh", leave=False):
        sample, sh, d = read_sample(ds, i, targets, fields)
        if shapes is None:
            shapes, dim = sh, d
        else:
            check_same_layout(ds.files[i], sh, d, shapes, dim, ds.files[0])
        samples.append(sample)
    return list(ds.files), samples, shapes, dim


def read_sample(ds, i: int, targets: Sequence[str], fields: Sequence[str] | None = None):
    """The lean training sample of file ``i`` of a :func:`folder_dataset` ``ds``, with
    the shapes of its input fields (those of its layout: tags' channels too) and
    targets, and its dimension: ``(sample, {field: shape}, pos_dim)``. A mesh where a
    target field of ``fields`` (``None``: all targets as one) is zero everywhere is
    refused (UsageError naming the file and the field)."""
    from meshops.mesh.data import MeshData

    s = ds[i]
    path = ds.files[i]
    sh = {k: field_shape(s.fields[k]) for k in list(ds.inputs) + list(targets)}
    if targets:
        _check_nonzero_fields(s, path, sh, targets, fields)
    sample = MeshData(pos=s.pos, weight=s.weight, x=s.x, y=s.y, source=str(path))
    if getattr(s, "params", None) is not None:
        sample.params = s.params
    return sample, sh, int(s.pos.shape[1])


def _check_nonzero_fields(s, path, sh: dict, targets: Sequence[str],
                          fields: Sequence[str] | None) -> None:
    """Refuse the sample ``s`` (``y [N, C]``, the ``targets`` stacked) when a target
    field is zero everywhere, with or without its quadrature weights: the loss is the
    mean of the fields' relative errors, and this one's is undefined."""
    import torch

    from meshops.datasets.fields import TargetFields
    from meshops.inference.predict import field_channels
    from meshops.training.loss import lp_norms, zero_target

    channels = {k: field_channels(sh[k]) for k in targets}
    groups = (TargetFields.from_specs(fields, channels) if fields else
              TargetFields.single(sum(channels.values()), ", ".join(targets)))
    y, w = s.y.to(torch.float64), s.weight.to(torch.float64)
    for name, part in groups.slices().items():
        zero = torch.zeros_like(y[:, part])
        if bool(zero_target(lp_norms(zero, y[:, part], w)[1])
                | zero_target(lp_norms(zero, y[:, part])[1])):
            hint = (f", or join {name} with the other components of its vector field "
                    f"(--targets u+v,p makes u+v one field)" if len(groups) > 1 else "")
            raise UsageError(f"{path}: the target field(s) {name} are zero everywhere (or at "
                             f"every point of positive weight); the relative L2 loss and "
                             f"error are undefined for this mesh: leave it out of the "
                             f"training data{hint}")


def check_same_layout(path, sh: dict, dim: int, shapes: dict, first_dim: int, first) -> None:
    """File ``path`` has the field shapes and dimension of the first file ``first``."""
    for k in shapes:
        if sh[k] != shapes[k]:
            raise UsageError(f"{path}: field {k!r} is {format_shape(sh[k])} but it is "
                           f"{format_shape(shapes[k])} in {Path(first).name}")
    if dim != first_dim:
        raise UsageError(f"{path}: the mesh is {dim}-D but {Path(first).name} is {first_dim}-D")


def training_samples(meta: dict, inputs: Sequence[str], targets: Sequence[str], layout=None):
    """A run's training samples (``meta["data"]``, files ``meta["split"]["train"]``)
    in float64, read as ``layout`` says (then ``inputs`` are its own), or ``(None, why
    not)``: also when the files differ from the fingerprint the run recorded
    (``meta["data_files"]`` and ``meta["param_files"]``, see :mod:`.run_folder`)."""
    import torch

    from meshops.errors import MeshError
    from meshops.runs.run_folder import changes, listing, param_changes

    root, train = meta.get("data"), (meta.get("split") or {}).get("train")
    if not root or not train:
        return None, "n/a: the checkpoint does not record its training files"
    if not Path(root).is_dir():
        return None, f"n/a: the training data {root} is not here"
    recorded = meta.get("data_files")
    if isinstance(recorded, dict):
        diff = changes(recorded, root, names=train, new_files=False)
        if isinstance(meta.get("param_files"), dict):
            diff += param_changes(meta["param_files"], root)
        if diff:
            return None, (f"n/a: the training data in {root} changed since the run was "
                          f"trained ({listing(diff)})")
    try:
        ds = folder_dataset(root, layout.inputs if layout else inputs, targets, torch.float64,
                            layout)
        index = {Path(f).name: i for i, f in enumerate(ds.files)}
        missing = [n for n in train if n not in index]
        if missing:
            return None, (f"n/a: {len(missing)} training file(s) are no longer in {root} "
                          f"(e.g. {missing[0]})")
        return [ds[index[n]] for n in train], ""
    except (MeshError, OSError, ValueError, KeyError) as e:
        return None, f"n/a: cannot read the training data {root} ({e})"
