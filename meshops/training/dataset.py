"""Training samples from meshes: input/target tensors, normalisers, data loaders."""

from __future__ import annotations

import copy
from typing import Iterable, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from meshops.datasets.folder import check_finite_fields
from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.errors import MeshError
from meshops.mesh.data import MeshData


def _stack_fields(mesh: MeshData, names: Sequence[str], role: str, n: int,
                  dtype: torch.dtype | None = None) -> Tensor | None:
    """Concatenate point fields ``names`` of ``mesh`` into ``[n, C]`` (``None`` if no names)."""
    if not names:
        return None
    fields = getattr(mesh, "fields", None) or {}
    source = getattr(mesh, "source", None) or "mesh"
    missing = [k for k in names if k not in fields]
    if missing:
        raise MeshError(f"{source}: {role} field(s) {missing} not found; "
                        f"available fields: {sorted(fields)}")
    cols = []
    for k in names:
        f = torch.as_tensor(fields[k])
        if f.shape[0] != n:
            raise MeshError(f"{source}: {role} field {k!r} has {f.shape[0]} rows but the "
                            f"mesh has {n} points")
        cols.append(f.reshape(n, -1))  # scalars [N] -> [N, 1]; [N, a, b] -> [N, a*b]
    check_finite_fields(fields, names, source, role, dtype)
    # float64 first, so that mixed field dtypes concatenate without losing digits.
    return torch.cat([c.to(torch.float64) for c in cols], dim=1)


def assemble(mesh: MeshData, inputs: Sequence[str], targets: Sequence[str],
             dtype: torch.dtype = torch.float32) -> MeshData:
    """A training sample: inputs ``x`` and targets ``y`` from a mesh's point fields.

    ``x`` is the concatenation of the ``inputs`` fields in the given order (scalar
    fields give one channel, ``[N, c]`` fields ``c``), ``y`` that of ``targets``.
    ``pos``, ``weight``, ``x`` and ``y`` are cast to ``dtype``; everything else
    (``fields``, ``cells``, ``source``, ...) is kept as it is, shared with the
    mesh rather than copied. The mesh is not modified.

    For outputs at other points than the inputs, set ``query_pos [M, d]``, ``y
    [M, C_out]`` and optionally ``query_weight [M]`` on the returned sample; the
    :class:`~meshops.training.Trainer` then computes the loss at the queries.

    Args:
        mesh: The mesh with its fields (e.g. from :func:`meshops.read_mesh`).
        inputs: Names of the input fields; empty for geometry-only problems
            (``x`` is then ``[N, 0]``).
        targets: Names of the target fields (at least one).
        dtype: Floating dtype of the tensors the model sees.

    Returns:
        A new :class:`~meshops.MeshData`.

    Raises:
        MeshError: (a ``ValueError``) when a field is missing or has the wrong
            number of rows (the message names the sample's ``source`` and lists
            the available fields), or holds a NaN/inf value (the message names the
            field and the first such point, see :func:`check_finite_fields`).

    Shapes:
        x ``[N, C_in]``, y ``[N, C_out]``, pos ``[N, d]``, weight ``[N]``
    """
    if not targets:
        raise ValueError("assemble: at least one target field is needed")
    if isinstance(inputs, str) or isinstance(targets, str):
        # A bare string would be split into one-letter field names.
        raise TypeError("assemble: inputs and targets are lists of field names, not strings")
    n = int(mesh.pos.shape[0])
    x = _stack_fields(mesh, list(inputs), "input", n, dtype)
    y = _stack_fields(mesh, list(targets), "target", n, dtype)
    # A shallow copy: the sample shares the mesh's field/cell tensors (no second
    # copy of a large dataset in memory) but has its own attributes.
    sample = copy.copy(mesh)
    if getattr(mesh, "fields", None) is not None:
        sample.fields = dict(mesh.fields)
    sample.pos = mesh.pos.to(dtype)
    sample.weight = mesh.weight.to(dtype)
    sample.x = x.to(dtype) if x is not None else mesh.pos.new_zeros((n, 0), dtype=dtype)
    sample.y = y.to(dtype)
    return sample


def _target_view(sample) -> Data:
    """``y`` with the weights of the points it lives at (the queries when present)."""
    y = sample.y
    if getattr(sample, "query_pos", None) is not None:
        w = getattr(sample, "query_weight", None)
        # Uniform weights over the queries when they carry none (see Trainer).
        w = torch.ones(y.shape[0], dtype=torch.float64) if w is None else w
    else:
        w = sample.weight
    if w.shape[0] != y.shape[0]:
        raise ValueError(f"sample {getattr(sample, 'source', '')!r}: y has {y.shape[0]} rows "
                         f"but its weights {w.shape[0]}")
    return Data(y=y, weight=w, x=sample.x, source=getattr(sample, "source", ""))


def fit_normalizers(train_samples: Iterable[MeshData], scale_by: int | None = None
                    ) -> tuple[UnitGaussianNormalizer | None, UnitGaussianNormalizer]:
    """Quadrature-weighted per-channel normalisers for ``x`` and ``y``.

    Fit them on the training split only: statistics that have seen the
    validation or test data leak it into the model.

    Args:
        train_samples: Samples from :func:`assemble` (a list, or anything that can be
            iterated over more than once).
        scale_by: An input channel constant over each mesh that the targets are
            proportional to (a load): the output normaliser is fitted on the targets
            per unit of it and scales the outputs by it
            (:class:`~meshops.datasets.normalizer.UnitGaussianNormalizer`).

    Returns:
        ``(input_normalizer, output_normalizer)``; the input normaliser is ``None``
        when the samples have no input channels.

    A data set read lazily from disk (:class:`meshops.datasets.cache.CachedMeshDataset`) gives
    them from the statistics it recorded per sample (its ``normalizers()``), rather
    than holding all its samples in memory here.
    """
    own = getattr(train_samples, "normalizers", None)
    if callable(own):
        return own() if scale_by is None else own(scale_by)
    samples = list(train_samples)
    if not samples:
        raise ValueError("fit_normalizers: no training samples")
    c_in = {int(s.x.shape[-1]) for s in samples}
    c_out = {int(s.y.shape[-1]) for s in samples}
    if len(c_in) != 1 or len(c_out) != 1:
        raise ValueError(f"fit_normalizers: samples disagree on the number of channels "
                         f"(x: {sorted(c_in)}, y: {sorted(c_out)})")
    (c_in,), (c_out,) = c_in, c_out
    norm_in = UnitGaussianNormalizer(c_in).fit(samples, "x") if c_in else None
    norm_out = UnitGaussianNormalizer(c_out)
    if scale_by is not None:
        if not 0 <= scale_by < c_in:
            raise ValueError(f"fit_normalizers: scale_by={scale_by} is not one of the "
                             f"{c_in} input channels")
        norm_out.set_scale_by(scale_by)
    norm_out.fit([_target_view(s) for s in samples], "y")
    return norm_in, norm_out


def make_loader(data, batch_size: int, sampler=None, shuffle: bool = False,
                generator: torch.Generator | None = None, num_workers: int = 0) -> DataLoader:
    """A PyG :class:`~torch_geometric.loader.DataLoader` that also batches query points.

    ``follow_batch=["query_pos"]`` makes PyG build ``query_pos_batch``; use
    :func:`prepare_batch` to expose it as ``query_batch``. A ``generator`` keeps the
    loader from drawing its base seed from the global torch generator.
    """
    return DataLoader(data, batch_size=batch_size, sampler=sampler,
                      shuffle=shuffle if sampler is None else False,
                      follow_batch=["query_pos"], generator=generator,
                      num_workers=num_workers)


def prepare_batch(batch, device: torch.device | str | None = None):
    """Move a batch to ``device`` and name the query batch vector ``query_batch``.

    Batches without a ``batch`` vector (a single sample) get one of zeros, so that
    every consumer can index per sample.
    """
    if device is not None:
        batch = batch.to(device)
    if getattr(batch, "batch", None) is None:
        batch.batch = torch.zeros(batch.pos.shape[0], dtype=torch.long, device=batch.pos.device)
    if getattr(batch, "query_pos", None) is not None \
            and getattr(batch, "query_batch", None) is None:
        qb = getattr(batch, "query_pos_batch", None)
        batch.query_batch = qb if qb is not None else torch.zeros(
            batch.query_pos.shape[0], dtype=torch.long, device=batch.query_pos.device)
    return batch


def own_part(data):
    """The samples this process may read: a lazily read data set of a data-parallel run
    reads only its own part (:meth:`meshops.datasets.cache.CachedMeshDataset.own`);
    any other data set whole."""
    own = getattr(data, "own", None)
    return own() if callable(own) else data


def first_sample(data):
    """The first sample this process may read (:func:`own_part`)."""
    return own_part(data)[0]
