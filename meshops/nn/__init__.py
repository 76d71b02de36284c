"""Discretisation-consistent attention layers (PyG style).

Every layer approximates an integral operator with the quadrature weights of the
source mesh, so the same parameters give (nearly) the same function on any mesh
of the same geometry. Flat PyG batches: ``layer(x, pos, weight, batch=None)``;
cross forms take ``(src, dst)`` pairs; dense batches: ``layer.dense(...)``.
"""

from meshops.nn.block import TransformerBlock
from meshops.nn.continuum import ContinuumAttention
from meshops.nn.fourier_features import FourierFeatures
from meshops.nn.galerkin import FourierAttention, GalerkinAttention
from meshops.nn.interpolate import knn_interpolate
# knn_graph: the old name of local_graph, kept only to raise an error that names both
# replacements (it had PyG's name but not its signature or orientation).
from meshops.nn.local import (LocalAttention, LocalPositionAttention, knn_graph,  # noqa: F401
                              local_graph, quantile_k)
from meshops.nn.mlp import MLP
from meshops.nn.patch import PatchAttention, PatchTokenAttention, WindowAttention
from meshops.nn.position import PositionAttention, position_kernel

__all__ = [
    "ContinuumAttention", "FourierAttention", "FourierFeatures", "GalerkinAttention", "MLP",
    "LocalAttention", "knn_interpolate",
    "LocalPositionAttention", "PatchAttention", "PatchTokenAttention", "PositionAttention",
    "TransformerBlock", "WindowAttention", "local_graph", "position_kernel", "quantile_k",
]
