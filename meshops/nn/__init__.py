"""Discretisation-consistent attention layers (PyG style).

Every layer approximates an integral operator with the quadrature weights of the
source mesh, so the same parameters give (nearly) the same function on any mesh
of the same geometry. Flat PyG batches: ``layer(x, pos, weight, batch=None)``;
cross forms take ``(src, dst)`` pairs; dense batches: ``layer.dense(...)``.
Every layer builds on :mod:`meshops.nn.base`; the attention primitive and the choice
of its implementation are :func:`meshops.nn.functional.weighted_attention`.

Imports :mod:`meshops.kernels`, :mod:`meshops.search` and :mod:`meshops.utils` only:
the layers take tensors, never a mesh file, a data set or a model.
"""

from meshops.nn import functional
from meshops.nn.base import AttentionBase, GlobalAttentionBase, LocalAttentionBase
from meshops.nn.block import TransformerBlock
from meshops.nn.continuum import ContinuumAttention
from meshops.nn.fourier_features import FourierFeatures
from meshops.nn.functional import weighted_attention
from meshops.nn.galerkin import FourierAttention, GalerkinAttention
from meshops.nn.interpolate import knn_interpolate
from meshops.nn.local import LocalAttention, LocalPositionAttention
from meshops.nn.mlp import MLP
from meshops.nn.patch import PatchAttention, PatchTokenAttention, WindowAttention, patch_attention
from meshops.nn.points import Points, batch_points
from meshops.nn.position import PositionAttention, position_kernel
from meshops.nn.slice import SliceAttention

# the neighbourhoods of the local layers (built by the search)
from meshops.search.neighbourhoods import local_graph, quantile_k

__all__ = [
    "AttentionBase", "ContinuumAttention", "FourierAttention", "FourierFeatures",
    "GalerkinAttention", "GlobalAttentionBase", "LocalAttention", "LocalAttentionBase",
    "LocalPositionAttention", "MLP", "PatchAttention", "PatchTokenAttention", "Points",
    "PositionAttention", "SliceAttention", "TransformerBlock", "WindowAttention",
    "batch_points", "functional", "knn_interpolate", "local_graph", "patch_attention",
    "position_kernel", "quantile_k", "weighted_attention",
]
