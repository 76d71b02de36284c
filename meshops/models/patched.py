"""Patched transformer for meshes too large for global attention."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from meshops.models.base import (
    NeuralOperator,
    check_model_sizes,
    check_positive_int,
    register_model,
)
from meshops.models.conditioning import ParamConditioning, read_params
from meshops.models.inputs import read_inputs
from meshops.models.structures import MeshStructures, interpolation_structures, read_stored
from meshops.nn.block import TransformerBlock
from meshops.nn.fourier_features import FourierFeatures
from meshops.nn.interpolate import knn_interpolate
from meshops.nn.mlp import MLP
from meshops.nn.patch import PatchTokenAttention, WindowAttention

__all__ = ["PatchedTransformer"]

_PATTERNS = ("window", "token", "alternate")


@register_model("patched_transformer")
class PatchedTransformer(NeuralOperator):
    r"""Transformer with patched continuum attention (O(N·N/P) or O(N·P) per layer).

    For meshes too large for global attention (continuum-attention paper §3-4.4,
    DESIGN §2.5). Each sample's points are split into ``num_patches`` spatial patches
    (:func:`meshops.search.partition`) and:

    1. **Lifting**: ``[x, pos] -> width`` by a pointwise linear layer (eq. 14).
    2. **Processor**: ``layers`` :class:`~meshops.nn.block.TransformerBlock` s (pre-norm,
       GELU FFN) whose attention is, by ``pattern``:

       * ``"window"`` (default): :class:`~meshops.nn.patch.WindowAttention`, continuum
         attention inside each patch, alternating the partition and its shifted
         (rotated) alternate between consecutive layers so information crosses patch
         borders (Swin-type); cost ``O(N · N/P · width)``.
       * ``"token"``: :class:`~meshops.nn.patch.PatchTokenAttention`, patch tokens by
         quadrature against learned patch-local functions, attention among the ``P``
         tokens (the paper's patched attention / ViT neural operator), back to the
         points; alternating partitions as above; cost ``O(N · P)``.
       * ``"alternate"``: window and token layers alternate (window, token, shifted
         window, shifted token, ...): local detail and global coupling.

       Every partition is computed once per forward pass and shared by all layers that
       use it (same ``num_patches``/``method``/``shift``), or read from the samples:
       :meth:`mesh_transform` stores each sample's partitions (and its query-point
       interpolation) once, so that training on a fixed dataset does no partitioning or
       neighbour search (:class:`~meshops.training.Trainer` applies it).
    3. **Decoder**: a pointwise MLP at the input points, ``[N, width] -> [N, out]``. At
       other query points the processor output is interpolated from the ``interp_k``
       nearest input points by inverse-distance weights
       (:func:`~meshops.nn.knn_interpolate`, exact at coincident points),
       then the same MLP: querying the input points reproduces the default output.

    Partition method: ``"voxel"`` (default) cuts the bounding box into a regular grid, so
    the patches are geometric and the operator is (nearly) the same on any mesh of the
    geometry, also strongly graded ones; patch sizes then follow the point density
    (cost ``O(N · n_max)`` with ``n_max`` the largest patch). ``"kd"`` balances the points
    per patch (best cost on strongly graded meshes such as the NACA C-grid) but its
    patches follow the density, so zero-shot transfer to a differently graded mesh is
    weaker (uniform refinement is fine).

    Args:
        in_channels (int): input channels (``0``: geometry-only input).
        out_channels (int): output channels.
        pos_dim (int): spatial dimension. (default: ``2``)
        width (int): hidden width. (default: ``128``)
        layers (int): processor blocks. (default: ``4``)
        heads (int): attention heads. (default: ``4``)
        num_patches (int): patches per sample ``P``. (default: ``16``)
        patch_size (int, optional): points per patch instead of ``num_patches`` (which is
            then ignored): a sample of ``n`` points gets ``ceil(n / patch_size)`` patches,
            so the cost per point is the same on a mesh of any size (a fixed ``P`` makes
            patches, and the window attention's cost per point, grow with ``n``). Use
            it with ``method="kd"``, whose patches are balanced; voxel patches of a
            graded mesh vary in size. (default: ``None``)
        method (str): ``"voxel"`` (default), ``"kd"`` or ``"kmeans"``.
        pattern (str): ``"window"`` (default), ``"token"`` or ``"alternate"``.
        ffn_ratio (float): FFN hidden width / ``width``. (default: ``2``)
        num_basis (int): learned patch functions of the token layers. (default: ``8``)
        dropout (float): dropout in the blocks. (default: ``0``)
        interp_k (int): neighbours of the query-point interpolation. (default: ``4``)
        activation (str): ``"gelu"`` (default), ``"relu"``, ``"silu"``, ``"tanh"``.
        pos_encoding (int): octaves ``F`` of sinusoidal position features in the lifting,
            :class:`~meshops.nn.FourierFeatures` (``0``: raw coordinates;
            coordinates of order one assumed). (default: ``0``)
        param_channels (int): ``K`` parameters per sample (``data.params [B, K]``) that
            condition the model (:class:`~meshops.models.conditioning.ParamConditioning`:
            FiLM of the lifted features and of the features after every block); ``0``
            (default): none, and the model is exactly the unconditioned one.

    Defaults per benchmark size (``PatchedTransformer.PRESETS``; parameters for
    ``in_channels=0, out_channels=1``):

    ===============================  =====  ======  =====  =================  =========  ==========
    preset                           width  layers  heads  patches            pattern    parameters
    ===============================  =====  ======  =====  =================  =========  ==========
    ``"elasticity"`` (972 points)    128    4       4      8 (voxel)          alternate  1,076,385
    ``"naca"`` (221x51 = 11,271)     128    6       4      32 (kd)            alternate  1,605,937
    ``"large"`` (100k+ points)       96     6       4      N/1024 (kd)        alternate  906,481
    ===============================  =====  ======  =====  =================  =========  ==========

    (The bare defaults - width 128, 4 window layers, 16 voxel patches - have 547,201
    parameters.) Measured on one shared CPU core: NACA size 5.7 s fwd+bwd. On 2 cores
    (``python -m benchmarks --only models --cases patched_transformer``), ``"large"``
    (``patch_size=1024``): 100k points 6.4 s forward, 1M points 70 s forward in 4.1 GB,
    i.e. 64-70 us per point from 100k to 1M. (Its earlier fixed 256 patches cost 146 s at
    1M and x3.7 per point from 100k, as the patches grew with ``N``; ``patch_size=4096``:
    155 us per point, flat.) The NACA C-grid and large CFD meshes are strongly graded,
    hence ``"kd"`` there (balanced patches); their samples share one grid topology, so
    the k-d patches are the same pieces of every sample.

    Shapes:
        - **input:** ``x [N, in_channels]``, ``pos [N, pos_dim]``, ``weight [N]``,
          ``batch [N]`` (optional), ``query_pos [M, pos_dim]``/``query_batch [M]``
          (optional).
        - **output:** ``[M, out_channels]``.
    """

    PRESETS: dict[str, dict[str, Any]] = {
        "elasticity": dict(width=128, layers=4, heads=4, num_patches=8, pattern="alternate"),
        "naca": dict(width=128, layers=6, heads=4, num_patches=32, method="kd",
                     pattern="alternate"),
        "large": dict(width=96, layers=6, heads=4, patch_size=1024, method="kd",
                      pattern="alternate"),
    }

    def __init__(self, in_channels: int, out_channels: int, pos_dim: int = 2, width: int = 128,
                 layers: int = 4, heads: int = 4, num_patches: int = 16, method: str = "voxel",
                 pattern: str = "window", ffn_ratio: float = 2, num_basis: int = 8,
                 dropout: float = 0.0, interp_k: int = 4, activation: str = "gelu",
                 pos_encoding: int = 0, patch_size: Optional[int] = None,
                 param_channels: int = 0) -> None:
        super().__init__()
        check_model_sizes(in_channels, out_channels, pos_dim, width)
        check_positive_int(layers, "layers", minimum=0)
        check_positive_int(num_patches, "num_patches")
        if patch_size is not None:
            check_positive_int(patch_size, "patch_size")
        check_positive_int(interp_k, "interp_k")
        if pattern not in _PATTERNS:
            raise ValueError(f"pattern must be one of {_PATTERNS}, got {pattern!r}")
        self.in_channels, self.out_channels, self.pos_dim = in_channels, out_channels, pos_dim
        self.width, self.interp_k, self.pattern = width, interp_k, pattern
        self.pos_enc = FourierFeatures(pos_dim, pos_encoding)
        self.lift = nn.Linear(in_channels + self.pos_enc.out_channels, width)
        blocks = []
        for i in range(layers):
            if pattern == "alternate":
                kind, shift = ("window" if i % 2 == 0 else "token"), (i // 2) % 2 == 1
            else:
                kind, shift = pattern, i % 2 == 1
            if kind == "window":
                att = WindowAttention(width, width, heads=heads, num_patches=num_patches,
                                      method=method, shift=shift, patch_size=patch_size)
            else:
                att = PatchTokenAttention(width, width, heads=heads, num_patches=num_patches,
                                          method=method, shift=shift, num_basis=num_basis,
                                          patch_size=patch_size,
                                          hidden=max(32, width // 2), pos_dim=pos_dim)
            blocks.append(TransformerBlock(att, width, ffn_ratio=ffn_ratio, dropout=dropout,
                                           activation=activation))
        self.blocks = nn.ModuleList(blocks)
        self.norm_out = nn.LayerNorm(width)
        self.head = MLP(width, width, out_channels, layers=2, activation=activation)
        # built last: the other layers' initial weights do not depend on it
        check_positive_int(param_channels, "param_channels", minimum=0)
        self.param_channels = param_channels
        self.conditioning = (ParamConditioning(param_channels, width, layers + 1)
                             if param_channels else None)

    def reset_parameters(self) -> None:
        self.lift.reset_parameters()
        for blk in self.blocks:
            blk.reset_parameters()
        self.norm_out.reset_parameters()
        self.head.reset_parameters()
        if self.conditioning is not None:
            self.conditioning.reset_parameters()

    def _partition_keys(self) -> tuple[list[tuple], list[int]]:
        """The distinct partitions of the blocks (``(num_patches, patch_size, method,
        shift)``, in order of first use) and, per block, the index of its own."""
        keys: list[tuple] = []
        which = []
        for blk in self.blocks:
            att = blk.attention
            key = (att.num_patches, att.patch_size, att.method, att.shift)
            if key not in keys:
                keys.append(key)
            which.append(keys.index(key))
        return keys, which

    def _distinct_partitions(self, pos: Tensor, batch: Optional[Tensor]) -> list[Tensor]:
        keys, which = self._partition_keys()
        return [self.blocks[which.index(j)].attention.partition(pos, batch)
                for j in range(len(keys))]

    def partitions(self, pos: Tensor, batch: Optional[Tensor]) -> list[Tensor]:
        """Patch ids ``[N]`` for every block, each distinct partition computed once."""
        distinct = self._distinct_partitions(pos, batch)
        return [distinct[j] for j in self._partition_keys()[1]]

    # ------------------------------------------------------ mesh-only structures
    def mesh_transform(self) -> MeshStructures:
        """:class:`~meshops.models.structures.MeshStructures` for this model: the
        partitions of every sample and, for samples with ``query_pos``, the
        interpolation to the query points (see
        :meth:`~meshops.models.NeuralOperator.mesh_transform`)."""
        return MeshStructures(self)

    def structure_key(self, dtype: torch.dtype, query: bool) -> str:
        """What the mesh-only structures of a sample depend on (besides the sample)."""
        return (f"PatchedTransformer partitions={self._partition_keys()[0]} "
                f"interp_k={self.interp_k} pos_dim={self.pos_dim} dtype={dtype} "
                f"query_pos={query}")

    def build_structures(self, inp) -> dict[str, Tensor]:
        """One sample's ``parts [N, J]`` (its patch ids in each of the ``J`` distinct
        partitions, local to the sample) and the query interpolation (``interp``,
        ``interp_weight``; :func:`~meshops.models.structures.interpolation_structures`)."""
        distinct = self._distinct_partitions(inp.pos, None)
        parts = (torch.stack(distinct, 1) if distinct
                 else torch.zeros(inp.pos.shape[0], 0, dtype=torch.long, device=inp.pos.device))
        return {"parts": parts, **interpolation_structures(inp, self.interp_k)}

    def _stored_partitions(self, data, inp) -> list[Tensor]:
        parts = data.mesh_parts.to(inp.pos.device)
        keys, which = self._partition_keys()
        if parts.dim() != 2 or parts.shape != (inp.pos.shape[0], len(keys)):
            raise ValueError(f"data.mesh_parts must be [N={inp.pos.shape[0]}, {len(keys)}], "
                             f"got {tuple(parts.shape)}")
        # The ids are local to each sample: the layers combine them with the batch
        # vector, which keeps the patches (and their order) of a batch-wide partition.
        return [parts[:, j] for j in which]

    def forward(self, data) -> Tensor:
        inp = read_inputs(data, self.in_channels, self.pos_dim, self.lift.weight.dtype,
                          self.lift.weight.device, dense=False)
        key = self.structure_key(inp.pos.dtype, inp.has_query)
        # the stored partitions and query interpolation, or None (built below)
        stored, weights = read_stored(data, inp, key, "PatchedTransformer", self.interp_k)
        parts = (self._stored_partitions(data, inp) if stored
                 else self.partitions(inp.pos, inp.batch))
        h = self.lift(torch.cat([inp.x, self.pos_enc(inp.pos)], dim=-1))
        film = None
        if self.conditioning is not None:
            film = self.conditioning.embed(read_params(data, self.param_channels, inp.num_graphs,
                                                       h.device))
            h = self.conditioning(h, film, inp.batch, 0)
        for site, (blk, p) in enumerate(zip(self.blocks, parts), 1):
            h = self.run_block(blk, h, inp.points, parts=p)
            if film is not None:
                h = self.conditioning(h, film, inp.batch, site)
        h = self.norm_out(h)
        if inp.has_query:
            h = knn_interpolate(h, inp.pos, inp.query_pos, inp.batch, inp.query_batch,
                                self.interp_k, weights=weights)
        return self.head(h)
