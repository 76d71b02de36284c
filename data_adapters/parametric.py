"""Parametric data sets as mesh folders: what a user brings to ``meshops train``.

A *parametric set* is a family of solutions indexed by a few scalar parameters,
with a train/test split. :func:`write_parametric_folders` writes it as

* ``ROOT/train/`` and ``ROOT/test/``: one ``.vtu`` file per sample, named by the
  sample's index in the source (``sample_0123.vtu``), with the mesh's cells, each
  parameter as a **constant point field** (how ``meshops train --inputs`` takes
  parameters today) and the target fields;
* ``params.json`` in each of the two folders: the same parameters as a sidecar keyed
  by file name, ``{"sample_0123.vtu": {"mu0": 1.5, ...}, ...}`` (the form a
  ``--params NAMES`` option reads);
* ``ROOT/dataset.json``: what the set is (name, source, description), its parameter
  and target names, the file names of each split and how the split was drawn.

The folder is written completely or not at all (built in a temporary sibling folder
and renamed into place), and :func:`prepare_parametric_folders` reuses a folder whose
``dataset.json`` describes the same set.

Example::

    from data_adapters.fem_npz import navier_stokes_set
    from data_adapters.parametric import write_parametric_folders
    write_parametric_folders(navier_stokes_set(), "dev/navier_stokes")
    # meshops train --data dev/navier_stokes/train --inputs mu0 --targets vx,vy,p
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from meshops.datasets.folder import add_inputs_targets
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays, write_mesh

#: Sidecar of parameters beside the mesh files of a folder.
PARAMS_FILE = "params.json"
#: Description of a written set, at its root.
DATASET_FILE = "dataset.json"
#: Version of the folder layout (a folder of another version is rewritten).
LAYOUT_VERSION = 1


@dataclass
class ParametricSet:
    """Samples of a parametric family with their split.

    Attributes:
        name: Short name (``"navier_stokes"``).
        samples: ``MeshData`` with ``pos``, ``cells``, ``fields`` (each parameter as a
            constant field ``[N]`` and the targets) and ``params [1, K]``.
        param_names: The ``K`` parameter names, in the order of ``params``.
        targets: Target field names.
        train, test: Indices into ``samples``.
        ids: Each sample's index in its source (used in the file names); default
            ``range(len(samples))``.
        description: One paragraph: the problem, where the data come from, the split.
        info: More JSON-able facts written to ``dataset.json`` (source file, seed, ...).
        inputs: The input fields when they are not the parameters (a family of
            geometries: e.g. the distance to a body); the parameters then go to the
            ``params.json`` sidecars only (the nearest-sample baseline reads them).
        fields: The target fields (``["u+v", "p"]``, :mod:`meshops.training.fields`);
            default every target its own.
        extra: More splits of other samples, ``{name: samples}`` (e.g. ``"test_fine"``:
            the test shapes on finer meshes), written as ``ROOT/<name>/``.
    """

    name: str
    samples: list
    param_names: list[str]
    targets: list[str]
    train: list[int]
    test: list[int]
    description: str = ""
    ids: list[int] | None = None
    info: dict = field(default_factory=dict)
    inputs: list[str] | None = None
    fields: list[str] | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.ids is None:
            self.ids = list(range(len(self.samples)))
        if len(self.ids) != len(self.samples):
            raise MeshError(f"{self.name}: {len(self.ids)} ids for {len(self.samples)} samples")
        both = set(self.train) & set(self.test)
        if both:
            raise MeshError(f"{self.name}: samples {sorted(both)[:5]} are in both train and test")
        bad = [i for i in list(self.train) + list(self.test) if not 0 <= i < len(self.samples)]
        if bad:
            raise MeshError(f"{self.name}: split index {bad[0]} out of range "
                            f"(0..{len(self.samples) - 1})")

    def file_name(self, k: int) -> str:
        """File name of sample ``k``: ``sample_<id>.vtu`` (at least 4 digits)."""
        width = max(4, len(str(max(self.ids, default=0))))
        return f"sample_{self.ids[k]:0{width}d}.vtu"

    def describe(self) -> dict:
        """The JSON written to ``dataset.json`` (also the key for reuse)."""
        out = {"layout_version": LAYOUT_VERSION, "name": self.name,
               "description": self.description, "inputs": self.input_names,
               "params": list(self.param_names), "targets": list(self.targets),
               "fields": list(self.fields or self.targets),
               "train": [self.file_name(k) for k in self.train],
               "test": [self.file_name(k) for k in self.test],
               "info": json.loads(json.dumps(self.info))}
        for name, samples in self.extra.items():
            out[name] = [self.extra_file_name(s) for s in samples]
        out["extra_splits"] = list(self.extra)
        return out

    @property
    def input_names(self) -> list[str]:
        return list(self.param_names if self.inputs is None else self.inputs)

    def extra_file_name(self, sample) -> str:
        """File name of a sample of an ``extra`` split: that of the sample of the same
        ``sample_id`` (the same shape), so the two can be paired."""
        width = max(4, len(str(max(self.ids, default=0))))
        return f"sample_{int(sample.sample_id):0{width}d}.vtu"


def permutation_split(num: int, n_train: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """The suggested split of the shared data: ``perm = default_rng(seed).permutation(num)``,
    train ``perm[:n_train]``, test ``perm[n_train:]``.

    Example:
        >>> train, test = permutation_split(500, 400)
        >>> len(train), len(test), sorted(train + test) == list(range(500))
        (400, 100, True)
    """
    if not 0 < n_train < num:
        raise MeshError(f"n_train must be in 1..{num - 1} for {num} samples, got {n_train}")
    perm = np.random.default_rng(seed).permutation(num)
    return [int(i) for i in perm[:n_train]], [int(i) for i in perm[n_train:]]


def constant_fields(n: int, names: Sequence[str], values: Sequence[float]) -> dict:
    """``{name: np.full(n, value)}``: parameters as constant point fields."""
    if len(names) != len(values):
        raise MeshError(f"{len(names)} parameter names for {len(values)} values")
    return {k: np.full(n, float(v)) for k, v in zip(names, values)}


def parametric_sample(points, triangles, names: Sequence[str], values: Sequence[float],
                      targets: dict, source: str, dtype, sample_id: int, cell_data=None,
                      **attrs) -> MeshData:
    """One sample of a parametric set on a triangle mesh: the parameters ``values`` as
    constant point fields ``names`` (the inputs ``x``) and in ``params [1, K]``, the
    ``targets`` (``{name: [N] array}``) as fields and ``y``; ``attrs`` (e.g.
    ``standin=True``) are set on the sample.

    Shapes:
        points ``[N, 2]``, triangles ``[M, 3]`` -> x ``[N, K]``, y ``[N, C]``, params ``[1, K]``
    """
    fields = constant_fields(len(points), names, values)
    fields.update(targets)
    mesh = mesh_from_arrays(points, [("triangle", np.asarray(triangles, np.int64))], fields,
                            cell_data, source=source)
    return add_inputs_targets(mesh, list(names), list(targets), dtype, sample_id=sample_id,
                              params=torch.as_tensor(np.asarray(values, np.float64))[None],
                              **attrs)


def _params_of(sample: MeshData, names: Sequence[str], where: str) -> dict:
    p = getattr(sample, "params", None)
    if p is None:
        raise MeshError(f"{where}: the sample has no params")
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    if len(p) != len(names):
        raise MeshError(f"{where}: params has {len(p)} values for {len(names)} names {names}")
    if not np.isfinite(p).all():
        raise MeshError(f"{where}: parameter {names[int(np.flatnonzero(~np.isfinite(p))[0])]!r} "
                        "is not finite")
    return {k: float(v) for k, v in zip(names, p)}


def write_parametric_folders(dataset: ParametricSet, root, overwrite: bool = False,
                             progress: bool = True) -> Path:
    """Write ``dataset`` to ``root`` (layout in the module docstring), atomically.

    Args:
        dataset: The set.
        root: Output folder; it must not exist unless ``overwrite``.
        overwrite: Replace an existing ``root``.
        progress: tqdm bar on a terminal.

    Returns:
        ``root`` as a :class:`~pathlib.Path`.

    Raises:
        MeshError: ``root`` exists (without ``overwrite``), a sample lacks a field
            or its params, or a mesh cannot be written. Nothing is left behind then.
    """
    from meshops.utils.progress import progress as progress_bar

    root = Path(root)
    if root.exists() and not overwrite:
        raise MeshError(f"{root}: already exists; pass overwrite=True or choose another folder")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    splits = [("train", [(dataset.file_name(k), dataset.samples[k]) for k in dataset.train]),
              ("test", [(dataset.file_name(k), dataset.samples[k]) for k in dataset.test])]
    splits += [(name, [(dataset.extra_file_name(s), s) for s in samples])
               for name, samples in dataset.extra.items()]
    try:
        for split, items in splits:
            folder = tmp / split
            folder.mkdir()
            sidecar = {}
            for name, s in progress_bar(items, desc=f"writing {dataset.name} {split}",
                                        enabled=progress, leave=False):
                where = f"{dataset.name} {split}/{name}"
                missing = [f for f in dataset.input_names + list(dataset.targets)
                           if f not in (s.fields or {})]
                if missing:
                    raise MeshError(f"{where}: no field(s) {missing}")
                sidecar[name] = _params_of(s, dataset.param_names, where)
                write_mesh(folder / name, s)
            (folder / PARAMS_FILE).write_text(json.dumps(sidecar, indent=1, sort_keys=True)
                                              + "\n")
        (tmp / DATASET_FILE).write_text(json.dumps(dataset.describe(), indent=1) + "\n")
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def read_description(root) -> dict | None:
    """``ROOT/dataset.json`` of a written set, or ``None`` if absent or unreadable."""
    try:
        return json.loads((Path(root) / DATASET_FILE).read_text())
    except (OSError, ValueError):
        return None


def prepare_parametric_folders(root, build: Callable[[], ParametricSet], key: dict,
                               progress: bool = True) -> Path:
    """``root`` written by :func:`write_parametric_folders` from ``build()``, unless it
    already holds a set whose ``info["key"]`` equals ``key`` and whose files are all
    there (then it is reused as it is).

    ``key`` names what the folder depends on (generator, version, sizes, seed);
    ``build`` must store it as ``info["key"]``.
    """
    root = Path(root)
    desc = read_description(root)
    key = json.loads(json.dumps(key))
    if desc is not None and desc.get("layout_version") == LAYOUT_VERSION \
            and desc.get("info", {}).get("key") == key \
            and all((root / split / f).is_file()
                    for split in ("train", "test", *desc.get("extra_splits", []))
                    for f in desc[split]):
        return root
    dataset = build()
    if dataset.info.get("key") != key:
        raise MeshError(f"{dataset.name}: build() must store info['key'] = {key}")
    return write_parametric_folders(dataset, root, overwrite=True, progress=progress)
