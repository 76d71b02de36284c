"""Mesh-only structures of a model computed once per sample (the PyG transform way).

A model whose forward derives something from the mesh alone (a latent mesh, a
partition, a neighbour graph, interpolation weights) implements

* ``structure_key(dtype, query) -> str``: what the structures depend on besides the
  sample (the model's settings, the dtype, whether the sample has ``query_pos``);
* ``build_structures(inp) -> dict[str, Tensor]``: the structures of one sample from its
  :class:`~meshops.models.inputs.MeshInputs`, indices local to the sample;

and its ``mesh_transform()`` returns :class:`MeshStructures` for itself. The transform
stores the structures on the sample as ``mesh_<name>`` attributes plus ``mesh_key``;
PyG's loaders concatenate them, and the model reads them back when
:func:`has_structures` says they were built for it (adding each sample's offsets
itself), or builds them when a batch lacks them. Every model with structures
(:class:`~meshops.models.PiT`, :class:`~meshops.models.PatchedTransformer`,
:class:`~meshops.models.GalerkinTransformer`) uses this one mechanism. Edges are
stored as ``[E, 2]`` rows ``(source, destination)``: PyG's orientation, one edge per row,
so that PyG's loaders concatenate them (they concatenate other attributes along the
first dimension).
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from meshops.mesh.digest import MESH_ID, sample_mesh_digest
from meshops.models.inputs import read_inputs
from meshops.search import graph  # called through it: tests replace the search there

__all__ = ["InterpolatedQueries", "MeshDigest", "MeshStructures", "has_structures",
           "interpolation_structures", "read_stored", "sample_offsets",
           "stored_interpolation"]

#: Key of the attribute that records what the stored structures were built for.
KEY = "mesh_key"


class MeshStructures:
    """PyG-style transform: the structures of a model that depend only on a sample's
    mesh, computed once (e.g. as ``dataset.transform``, or applied when the samples are
    loaded and kept with them; :class:`~meshops.training.Trainer` does this for lists of
    samples), so that training on a fixed dataset does no partition or neighbour search.

    Adds to one sample (a :class:`~meshops.MeshData`, not a batch) the model's
    ``build_structures`` as ``mesh_<name>`` attributes and ``mesh_key`` (the model
    settings, dtype and whether the sample has ``query_pos``). The model uses them when
    the key matches, and builds its own otherwise (with a warning when a key is present
    but does not match). Apply it after anything that moves the points.

    Args:
        model: a model with ``structure_key`` and ``build_structures`` (see the module
            docstring); its settings and parameter dtype are read now.

    Shapes:
        - **input:** one sample with ``pos [N, d]``, ``weight [N]``, optional
          ``query_pos [M, d]``
        - **output:** the same object with the model's ``mesh_*`` attributes
    """

    def __init__(self, model) -> None:
        if not (hasattr(model, "structure_key") and hasattr(model, "build_structures")):
            raise TypeError(f"{type(model).__name__} has no mesh structures "
                            f"(structure_key / build_structures)")
        self.model = model
        self.dtype = next(model.parameters()).dtype

    @torch.no_grad()
    def __call__(self, data):
        if getattr(data, "batch", None) is not None:
            raise ValueError(f"{type(self).__name__} takes one sample (data.batch is set): "
                             f"apply it to the samples before batching")
        m = self.model
        inp = read_inputs(data, m.in_channels, m.pos_dim, self.dtype, data.pos.device)
        for name, value in m.build_structures(inp).items():
            setattr(data, f"mesh_{name}", value)
        setattr(data, KEY, m.structure_key(self.dtype, inp.has_query))
        setattr(data, MESH_ID, sample_mesh_digest(data))
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model.structure_key(self.dtype, False)})"


def has_structures(data, key: str, num_graphs: int, what: str = "mesh") -> bool:
    """Whether ``data`` carries :class:`MeshStructures` built with ``key`` (the model's
    ``structure_key`` for its dtype and whether the batch has ``query_pos``) for each of
    its ``num_graphs`` samples. A key for other settings gives a warning (naming
    ``what``, the model) and ``False``: the model then builds its own."""
    stored = getattr(data, KEY, None)
    if stored is None:
        return False
    keys = stored if isinstance(stored, (list, tuple)) else [stored]
    if len(keys) != num_graphs or any(k != key for k in keys):
        warnings.warn(f"the samples' {what} structures were built for other settings "
                      f"({keys[0]}); building them for this model ({key})", stacklevel=3)
        return False
    return True


def sample_offsets(batch: Optional[Tensor], num_graphs: int) -> Optional[Tensor]:
    """Index of the first point of each sample, ``[B]`` (None for one
    sample): what turns a sample's local indices into the batch's."""
    if batch is None:
        return None
    counts = torch.bincount(batch, minlength=num_graphs)
    return torch.cumsum(counts, 0) - counts


def interpolation_structures(inp, k: int) -> dict[str, Tensor]:
    """The query-point interpolation of one sample (``inp`` from :func:`read_inputs`):
    ``interp`` (source indices) and ``interp_weight``, flattened ``[M k]`` rows of
    :func:`~meshops.search.knn_interpolation_weights`; nothing without ``query_pos``."""
    if not inp.has_query:
        return {}
    src, w = graph.knn_interpolation_weights(inp.pos, inp.query_pos, None, None, k)
    return {"interp": src.reshape(-1), "interp_weight": w.reshape(-1)}


def stored_interpolation(data, inp, k: int) -> Optional[tuple[Tensor, Tensor]]:
    """The batch's ``(src [M, k], w [M, k])`` from the samples' stored
    :func:`interpolation_structures`, or None when a sample has fewer than ``k`` points
    (the batch then takes fewer neighbours than that sample's structures hold)."""
    dev = inp.pos.device
    m = inp.query_pos.shape[0]
    k = graph.interpolation_k(k, inp.pos.shape[0], inp.batch, inp.query_batch)
    src = data.mesh_interp.to(dev)
    w = data.mesh_interp_weight.to(device=dev, dtype=inp.pos.dtype)
    if src.shape[0] != w.shape[0]:
        raise ValueError(f"data.mesh_interp has {src.shape[0]} entries but "
                         f"data.mesh_interp_weight has {w.shape[0]}")
    # Every sample stored min(k, its points) >= k neighbours per query point: the total
    # is m * k exactly when each holds k.
    if src.shape[0] != m * k:
        return None
    src = src.view(m, k)
    offsets = sample_offsets(inp.batch, inp.num_graphs)
    if offsets is not None:
        src = src + offsets[inp.query_batch][:, None]
    return src, w.view(m, k)


def read_stored(data, inp, key: str, what: str, interp_k: int
                ) -> tuple[bool, Optional[tuple[Tensor, Tensor]]]:
    """The stored structures of a batch in one step: whether it carries those built
    with ``key`` (:func:`has_structures`, ``what`` naming the model), and their query
    interpolation (:func:`stored_interpolation`; None without query points or without
    stored structures)."""
    if not has_structures(data, key, inp.num_graphs, what):
        return False, None
    return True, (stored_interpolation(data, inp, interp_k) if inp.has_query else None)


class InterpolatedQueries:
    """Mixin of the models whose output at query points is their processor's output
    interpolated from the ``interp_k`` nearest input points
    (:func:`~meshops.nn.knn_interpolate`, exact at coincident points, so that querying
    the input points reproduces the default output): the interpolation weights are
    their only mesh structure. The model sets ``interp_k`` and ``pos_dim``."""

    interp_k: int
    pos_dim: int

    def mesh_transform(self) -> MeshStructures:
        """:class:`MeshStructures` for this model: the interpolation to the query points
        of samples with ``query_pos`` (see
        :meth:`~meshops.models.NeuralOperator.mesh_transform`)."""
        return MeshStructures(self)

    def structure_key(self, dtype: torch.dtype, query: bool) -> str:
        """What the mesh-only structures of a sample depend on (besides the sample)."""
        return (f"{type(self).__name__} interp_k={self.interp_k} pos_dim={self.pos_dim} "
                f"dtype={dtype} query_pos={query}")

    def build_structures(self, inp) -> dict[str, Tensor]:
        """One sample's query interpolation (:func:`interpolation_structures`)."""
        return interpolation_structures(inp, self.interp_k)

    def to_queries(self, h: Tensor, data, inp) -> Tensor:
        """Features ``h [N, C]`` at the input points carried to the query points
        ``[M, C]`` (``h`` itself without query points), with the stored weights when the
        batch carries them."""
        if not inp.has_query:
            return h
        from meshops.nn.interpolate import knn_interpolate

        key = self.structure_key(inp.pos.dtype, inp.has_query)
        _, weights = read_stored(data, inp, key, type(self).__name__, self.interp_k)
        return knn_interpolate(h, inp.pos, inp.query_pos, inp.batch, inp.query_batch,
                               self.interp_k, weights=weights)


class MeshDigest:
    """PyG-style transform for models with no mesh structures of their own
    (:class:`~meshops.models.TransformerNO`): stores :data:`~meshops.mesh.digest.MESH_ID`,
    the digest of the sample's mesh, so that a compiled forward on a batch of samples of
    one mesh knows their sizes without reading them back from the device."""

    @torch.no_grad()
    def __call__(self, data):
        if getattr(data, "batch", None) is not None:
            raise ValueError(f"{type(self).__name__} takes one sample (data.batch is set): "
                             f"apply it to the samples before batching")
        setattr(data, MESH_ID, sample_mesh_digest(data))
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
