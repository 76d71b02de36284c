"""Folders larger than memory: their samples read through the cache of
:mod:`meshops.datasets.cache`.

:func:`load_folder_cached` reads every mesh file once into an on-disk cache and gives a
:class:`~meshops.datasets.cache.CachedMeshDataset` of the samples
:func:`~meshops.datasets.samples.load_folder` would make, which DataLoader worker
processes read one sample at a time; :func:`take`, :func:`with_structures` and
:func:`fingerprints` treat both kinds of samples alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from meshops.datasets.folder import MeshFolderDataset
from meshops.datasets.samples import check_same_layout, read_sample


class FolderReader:
    """``read(path) -> (sample, info)`` for :meth:`MeshCache.dataset`: the sample that
    :func:`~meshops.datasets.samples.load_folder` makes of a file (the same checks), and its
    field shapes and dimension. Picklable: worker processes parse with it."""

    def __init__(self, root, inputs: Sequence[str], targets: Sequence[str], dtype,
                 layout=None, check: Callable | None = None) -> None:
        self.inputs, self.targets, self.check = list(inputs), list(targets), check
        self.ds = MeshFolderDataset(root, inputs=self.inputs, targets=self.targets,
                                    dtype=dtype, layout=layout)
        self.index = {str(p): i for i, p in enumerate(self.ds.files)}

    @property
    def files(self) -> list[Path]:
        return list(self.ds.files)

    def __call__(self, path) -> tuple:
        sample, shapes, dim = read_sample(self.ds, self.index[str(path)], self.targets,
                                          self.check)
        return sample, {"shapes": shapes, "dim": dim}


def load_folder_cached(root, inputs: Sequence[str], targets: Sequence[str], dtype,
                       desc: str = "reading", layout=None, check: Callable | None = None,
                       *, cache, workers: int = 0,
                       parts: Optional[Callable] = None) -> tuple[list, object, dict, int]:
    """:func:`~meshops.datasets.samples.load_folder` through the cache folder ``cache``:
    ``(files, samples, field_shapes, pos_dim)`` with ``samples`` a
    :class:`~meshops.datasets.cache.CachedMeshDataset` (nothing held in memory), building the
    entries that are missing in ``workers`` processes with a progress bar; in a
    data-parallel run (``parts(root)``: this process's :class:`~meshops.datasets.cache.Part`)
    only this process's part of the files."""
    from meshops.datasets.cache import MeshCache

    reader = FolderReader(root, inputs, targets, dtype, layout, check)
    # Every option that changes what read_sample makes of a file, or refuses, belongs
    # here: it is part of the key of each entry (a check by its repr, which names what
    # it refuses). So does the content of the folder's
    # parameter file, which gives the samples' values (an edit of it rebuilds every
    # entry).
    params = list(layout.params) if layout else []
    settings = {"reader": "meshops.datasets.samples.read_sample", "inputs": list(inputs),
                "targets": list(targets), "check": None if check is None else repr(check),
                "dtype": str(dtype).replace("torch.", ""),
                "params": params, "tags": list(layout.tags) if layout else [],
                "param_files": param_file_digests(root) if params else {}}
    ds = MeshCache(cache).dataset(reader.files, reader, settings, workers=workers, desc=desc,
                                  part=parts(root) if parts else None)
    files = ds.files
    shapes, dim = None, None
    for path, rec in zip(files, ds.records):
        sh, d = rec.info["shapes"], rec.info["dim"]
        if shapes is None:
            shapes, dim = sh, d
        else:
            check_same_layout(path, sh, d, shapes, dim, files[0])
    return files, ds, shapes, dim


def param_file_digests(root) -> dict[str, str]:
    """``{name: SHA-256}`` of the parameter files (params.csv, params.json) in ``root``."""
    from meshops.datasets.cache import file_digest
    from meshops.datasets.params import PARAM_FILES

    return {n: file_digest(Path(root) / n) for n in PARAM_FILES if (Path(root) / n).is_file()}


def take(samples, indices: Sequence[int]):
    """The samples ``indices`` of a list, or of a cached data set (still on disk)."""
    subset = getattr(samples, "subset", None)
    return subset(indices) if callable(subset) else [samples[i] for i in indices]


def with_structures(samples, model, workers: int):
    """Cached samples with ``model``'s mesh structures cached beside them (in-memory
    samples are left as they are: the Trainer builds theirs)."""
    add = getattr(samples, "with_structures", None)
    if samples is None or not callable(add):
        return samples
    make = getattr(model, "mesh_transform", None)
    return add(make() if callable(make) else None, workers=workers)


def fingerprints(samples) -> dict:
    """The provenance fingerprints a lazily read data set's cache took (none in memory)."""
    known = getattr(samples, "fingerprints", None)
    return known() if callable(known) else {}
