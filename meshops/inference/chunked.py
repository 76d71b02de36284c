"""Predictions on huge meshes in a bounded memory: the global context once, the output
points in chunks.

Every meshops model is an encoder -> processor -> decoder whose decoder evaluates each
output point from a *context* that does not depend on the output points:
:func:`predict_chunked` computes the context once and decodes the output points
(``query_pos``, or the input points) ``chunk_size`` at a time, so that the memory of the
decoder (its neighbour graphs, attention weights, hidden features) is that of one chunk.
Each output point's value is the one :meth:`NeuralOperator.predict
<meshops.models.NeuralOperator.predict>` gives (tested in float64 for every model; the
sums run in another order, so float32 results agree to rounding).

What the context is, and so what the memory is, depends on the model:

* :class:`~meshops.models.PiT`: the latent tokens ``[Nv, width]`` after the processor.
  The encoder is computed in chunks too: the Voronoi weights of the latent mesh over
  chunks of input points, and the local attention from the input mesh to the latent
  mesh over spatially compact groups of latent points (k-d parts), each with its measure
  balls and only the input points in them lifted. Beyond the input arrays
  (``pos``, ``weight``, ``x``: ``O(N)``), the memory is that of a chunk: this is the
  model for meshes of millions of points.
* :class:`~meshops.models.TransformerNO`: the encoder output ``[N, width]`` at every
  input point (global self-attention over the whole input mesh: ``O(N^2)`` time, so the
  encoder itself cannot be split); the cross-attention decoder (or the pointwise head)
  runs in chunks.
* :class:`~meshops.models.GalerkinTransformer` and
  :class:`~meshops.models.PatchedTransformer`: the processor output ``[N, width]`` at
  every input point (each layer updates every point from global or patch-wise
  integrals; the patched model's shifted partitions carry information across the
  whole mesh); the query interpolation and the head run in chunks.
* :class:`~meshops.models.SliceTransformer`: the processor output ``[N, width]`` at
  every input point too, computed on parts of the points
  (:meth:`~meshops.models.SliceTransformer.in_parts`: the slice weights and hidden
  features of one part at a time); the query interpolation and the head run in chunks.

Only the inputs every model reads (``x``, ``pos``, ``weight``, ``query_pos``) are
supported; a sample that carries other model inputs is predicted in one piece, as is a
model without a chunked decoder here.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor
from torch.nn.functional import gelu

from meshops.datasets.normalizer import decode_outputs, encode_inputs, output_scale

__all__ = ["DEFAULT_CHUNK", "can_chunk", "predict_chunked"]

#: Output points per chunk when a mesh is predicted in chunks (meshes with fewer points
#: are predicted in one piece, :func:`meshops.inference.predict.predict_mesh`).
DEFAULT_CHUNK = 65536

#: PiT's encoder works on about this many neighbour pairs per output point of a chunk at
#: a time (a group of latent points and their measure balls; each group searches the
#: whole input mesh once, so fewer, larger groups are faster).
ENCODER_EDGES = 64
# Attributes of a sample the chunked decoders read (or that carry no model input).
_KNOWN = {"x", "pos", "weight", "query_pos", "query_weight", "y", "source", "fields",
          "cells", "cell_data", "batch", "ptr", "query_batch", "query_pos_batch"}


# ------------------------------------------------------------------------ PiT
def _pit_context(model, data, inp, chunk: int):
    """PiT's latent tokens, computed with the encoder split over latent-point groups."""
    from meshops.models.latent import fps_latent, grid_latent, voronoi_weights
    from meshops.models.pit import LatentMesh
    from meshops.search import partition

    n = inp.pos.shape[0]
    if model.latent == "input":
        lat = LatentMesh(inp.pos, inp.weight, None, None, 1)
    else:
        idx = (fps_latent(inp.pos, None, model.num_latent) if model.latent == "fps" else
               grid_latent(model.grid_shape, model.stride, None, n, device=inp.pos.device))
        lat_pos = inp.pos[idx]
        # each input point gives its weight to its nearest latent point: chunk by chunk
        weight = sum(voronoi_weights(inp.pos[s:s + chunk], inp.weight[s:s + chunk], None,
                                     lat_pos, None) for s in range(0, n, chunk))
        lat = LatentMesh(lat_pos, weight, None, idx, 1)
    nv = lat.pos.shape[0]
    # A group's edges: about q N per latent point (its ball); ENCODER_EDGES * chunk in all.
    per_point = max(1, math.ceil(model.quantile_in * n))
    groups = max(1, min(nv, math.ceil(nv * per_point / (ENCODER_EDGES * chunk))))
    part = (partition(lat.pos, groups, "kd") if groups > 1
            else torch.zeros(nv, dtype=torch.long, device=lat.pos.device))
    lifted = model.lift.weight.dtype
    u = lat.pos.new_empty(nv, model.width, dtype=lifted)
    for g in range(groups):
        dst = (part == g).nonzero().view(-1)
        if dst.numel() == 0:
            continue
        e = model._graph(inp.pos, inp.weight, None, lat.pos[dst], None, model.quantile_in)
        src, local = torch.unique(e[0], return_inverse=True)
        h = gelu(model.lift(torch.cat([inp.x[src], inp.pos[src]], dim=-1)))
        u[dst] = gelu(model.encoder((h, None), (inp.pos[src], lat.pos[dst]), inp.weight[src],
                                    None, edge_index=torch.stack([local, e[1]])))
    return model._process(u, lat), lat


def _pit_decode(model, ctx, q: Tensor) -> Tensor:
    u, lat = ctx
    e = model._graph(lat.pos, lat.weight, None, q, None, model.quantile_out)
    return model.head(gelu(model.decoder((u, None), (lat.pos, q), lat.weight, None,
                                         edge_index=e)))


# -------------------------------------------------------------- TransformerNO
def _tno_context(model, data, inp, chunk: int):
    return model.encode(data)                       # (h [N, width], its inputs)


def _tno_decode(model, ctx, q: Tensor) -> Tensor:
    h, inp = ctx
    z = model.cross((h, model.query_embed(model.pos_enc(q))), None, inp.weight, None)
    return model.head(model.norm_out(z))


# ---------------------------------------------- Galerkin and patched transformers
def _galerkin_context(model, data, inp, chunk: int):
    h = model.lift(torch.cat([inp.x, model.pos_enc(inp.pos)], dim=-1))
    for blk in model.blocks:
        h = blk(h, inp.pos, inp.weight, None)
    return h, inp


def _patched_context(model, data, inp, chunk: int):
    parts = model.partitions(inp.pos, None)
    h = model.lift(torch.cat([inp.x, model.pos_enc(inp.pos)], dim=-1))
    for blk, p in zip(model.blocks, parts):
        h = blk(h, inp.pos, inp.weight, None, parts=p)
    return model.norm_out(h), inp


def _slice_context(model, data, inp, chunk: int):
    return model.features(inp), inp               # on parts of the points (in_parts)


def _slice_decode(model, ctx, q: Tensor) -> Tensor:
    from meshops.nn.interpolate import knn_interpolate

    h, inp = ctx
    return model.head(model.norm_out(knn_interpolate(h, inp.pos, q, None, None,
                                                     model.interp_k)))


def _interpolating_decode(model, ctx, q: Tensor) -> Tensor:
    from meshops.nn.interpolate import knn_interpolate

    h, inp = ctx
    return model.head(knn_interpolate(h, inp.pos, q, None, None, model.interp_k))


def _decoders() -> dict:
    from meshops.models import (
        GalerkinTransformer,
        PatchedTransformer,
        PiT,
        SliceTransformer,
        TransformerNO,
    )

    return {PiT: (_pit_context, _pit_decode),
            TransformerNO: (_tno_context, _tno_decode),
            GalerkinTransformer: (_galerkin_context, _interpolating_decode),
            PatchedTransformer: (_patched_context, _interpolating_decode),
            SliceTransformer: (_slice_context, _slice_decode)}


def can_chunk(model, data=None) -> bool:
    """Whether :func:`predict_chunked` splits ``model``'s prediction of ``data`` (one
    sample with only ``x``, ``pos``, ``weight`` and optionally ``query_pos`` as inputs,
    and a model without parameter conditioning)."""
    if not any(type(model) is cls for cls in _decoders()):
        return False
    # The chunked path runs the layers without the FiLM conditioning (per-sample
    # parameters, or the input means of PiT(condition_on_inputs=True)).
    if getattr(model, "conditioning", None) is not None:
        return False
    if data is None:
        return True
    if getattr(data, "num_graphs", 1) != 1:
        return False
    return not (set(data.keys()) - _KNOWN)


@torch.no_grad()
def predict_chunked(model, data, chunk_size: int = DEFAULT_CHUNK, progress: bool = True
                    ) -> Tensor:
    """``model.predict(data)`` with the global context computed once and the output
    points decoded ``chunk_size`` at a time (see the module docstring).

    Args:
        model: A :class:`~meshops.models.PiT`, :class:`~meshops.models.TransformerNO`,
            :class:`~meshops.models.GalerkinTransformer` or
            :class:`~meshops.models.PatchedTransformer` (others: one piece).
        data: One sample (a :class:`~meshops.MeshData`, not a batch).
        chunk_size: Output points per chunk (PiT's encoder also works on about
            ``ENCODER_EDGES * chunk_size`` neighbour pairs at a time).
        progress: A tqdm bar over the chunks (on a terminal).

    Shapes:
        data ``x [N, C_in]``, ``pos [N, d]``, ``weight [N]``, optional
        ``query_pos [M, d]`` -> ``[M, C_out]`` (``M = N`` without ``query_pos``), in
        physical units (the model's normalisers applied)

    Raises:
        ValueError: ``chunk_size < 1``, or the checks of the model's input reader.
    """
    from meshops.models.inputs import read_inputs
    from meshops.utils.progress import progress as bar

    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if not can_chunk(model, data):
        return model.predict(data)
    was_training = model.training
    model.eval()
    try:
        raw = data.x
        x = encode_inputs(model, raw)
        if x is not data.x:
            data = data.clone()
            data.x = x
        p = next(model.parameters())
        inp = read_inputs(data, model.in_channels, model.pos_dim, p.dtype, p.device)
        context, decode = _decoders()[type(model)]
        ctx = context(model, data, inp, chunk_size)
        rows = _rows(model, inp)
        m = inp.query_pos.shape[0]
        out = []
        for s in bar(range(0, m, chunk_size), desc="predicting in chunks", unit="chunk",
                     leave=False, enabled=progress, total=math.ceil(m / chunk_size)):
            if rows is not None:
                y = rows(ctx, s, s + chunk_size)
            else:
                y = decode(model, ctx, inp.query_pos[s:s + chunk_size])
            out.append(decode_outputs(model, y, output_scale(model, raw, y.shape[0])))
        return torch.cat(out)
    finally:
        model.train(was_training)


def _rows(model, inp) -> Optional[Callable]:
    """The decoder of models whose output at the input points is a pointwise head of
    the context (no query points, or TransformerNO's pointwise decoder): rows of it."""
    from meshops.models import (
        GalerkinTransformer,
        PatchedTransformer,
        SliceTransformer,
        TransformerNO,
    )

    if isinstance(model, TransformerNO) and model.decoder == "pointwise":
        if inp.has_query and not (inp.query_pos.shape == inp.pos.shape
                                  and torch.equal(inp.query_pos, inp.pos)):
            raise ValueError("decoder='pointwise' evaluates the output at the input points "
                             "only; build the model with decoder='cross' to query other points")
        return lambda ctx, a, b: model.head(model.norm_out(ctx[0][a:b]))
    if isinstance(model, (GalerkinTransformer, PatchedTransformer)) and not inp.has_query:
        return lambda ctx, a, b: model.head(ctx[0][a:b])
    if isinstance(model, SliceTransformer) and not inp.has_query:
        return lambda ctx, a, b: model.head(model.norm_out(ctx[0][a:b]))
    return None
