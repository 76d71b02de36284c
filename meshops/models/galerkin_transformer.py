"""Galerkin transformer (Cao, "Choose a Transformer: Fourier or Galerkin", §4) on meshes."""

from __future__ import annotations

from typing import Any

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
from meshops.models.structures import InterpolatedQueries
from meshops.nn.block import TransformerBlock
from meshops.nn.fourier_features import FourierFeatures
from meshops.nn.galerkin import FourierAttention, GalerkinAttention
from meshops.nn.mlp import MLP

__all__ = ["GalerkinTransformer"]


@register_model("galerkin_transformer")
class GalerkinTransformer(InterpolatedQueries, NeuralOperator):
    r"""Galerkin transformer: softmax-free linear attention with quadrature weights.

    Cao's operator learner (§4) with the ``1/n`` of the attention replaced by the
    quadrature weights of the input mesh:

    1. **Feature extractor**: a pointwise 2-layer FFN of the input function and the
       coordinates, ``[x, pos] [N, in_channels + pos_dim] -> [N, width]`` (the
       coordinates with sinusoidal features when ``pos_encoding > 0``).
    2. **Encoder**: ``layers`` simple-attention layers (eq. (4)),
       :math:`\tilde y = y + \mathrm{Attn}(y),\ y \mapsto \tilde y + g(\tilde y)`, no
       layer norm on the residual stream (the Galerkin projection-type normalisation
       acts on K and V inside the attention), with
       :class:`~meshops.nn.galerkin.GalerkinAttention`
       :math:`z = Q(\tilde K^\top \mathrm{diag}(w) \tilde V)` (``attention="galerkin"``,
       default; :math:`O(N \cdot width^2)`) or
       :class:`~meshops.nn.galerkin.FourierAttention` (``"fourier"``). The coordinates
       are concatenated to every head's Q, K, V ("recurrent enrichment of positional
       encoding", ``pos_dim`` extra channels per head) and Q/K/V are initialised as
       ``xavier(gain=eta) + delta I`` as in the reference code. ``[N, width] -> [N, width]``.
    3. **Decoder**: a pointwise FFN (the paper's decoder for non-smooth targets),
       ``[N, width] -> [N, out_channels]`` at the input points. At other query points the
       encoder output is first interpolated from the ``interp_k`` nearest input points by
       inverse-distance weighting (:func:`~meshops.nn.knn_interpolate`, exact
       at coincident points), so querying the input points reproduces the default output
       exactly and other points see the same feature function.

    Args:
        in_channels (int): input channels (``0``: geometry-only input).
        out_channels (int): output channels.
        pos_dim (int): spatial dimension. (default: ``2``)
        width (int): hidden width ``d``. (default: ``128``)
        layers (int): encoder layers. (default: ``4``)
        heads (int): attention heads. (default: ``4``)
        ffn_ratio (float): FFN hidden width / ``width``. (default: ``2``)
        attention (str): ``"galerkin"`` (default) or ``"fourier"``.
        eta, delta (float): Q/K/V initialisation ``xavier(gain=eta) + delta I``.
            (default: ``1e-2``, ``1e-2``)
        dropout (float): dropout in the encoder layers. (default: ``0``)
        interp_k (int): neighbours for the query-point interpolation. (default: ``4``)
        activation (str): ``"gelu"`` (default), ``"relu"``, ``"silu"``, ``"tanh"``.
        pos_encoding (int): octaves ``F`` of sinusoidal position features in the lifting,
            :class:`~meshops.nn.FourierFeatures` (``0``: raw coordinates;
            coordinates of order one assumed). (default: ``0``)
        param_channels (int): ``K`` parameters per sample (``data.params [B, K]``) that
            condition the model (:class:`~meshops.models.conditioning.ParamConditioning`:
            FiLM of the lifted features and of the features after every block); ``0``
            (default): none, and the model is exactly the unconditioned one.

    Defaults per benchmark size (``GalerkinTransformer.PRESETS``; cost linear in ``N``;
    parameters for ``in_channels=0, out_channels=1``):

    ==============================  =====  ======  =====  ==========  ===================
    preset                          width  layers  heads  parameters  CPU fwd+bwd, 1 core
    ==============================  =====  ======  =====  ==========  ===================
    ``"elasticity"`` (972 points)   128    4       4      567,553     (= the defaults)
    ``"naca"`` (221x51 = 11,271)    128    4       4      567,553     3.3 s per sample
    ``"large"`` (100k+ points)      96     4       4      321,217     6.6 s fwd (100k pts)
    ==============================  =====  ======  =====  ==========  ===================

    Shapes:
        - **input:** ``x [N, in_channels]``, ``pos [N, pos_dim]``, ``weight [N]``,
          ``batch [N]`` (optional), ``query_pos [M, pos_dim]``/``query_batch [M]``
          (optional).
        - **output:** ``[M, out_channels]``.
    """

    PRESETS: dict[str, dict[str, Any]] = {
        "elasticity": dict(width=128, layers=4, heads=4),
        "naca": dict(width=128, layers=4, heads=4),
        "large": dict(width=96, layers=4, heads=4),
    }

    def __init__(self, in_channels: int, out_channels: int, pos_dim: int = 2, width: int = 128,
                 layers: int = 4, heads: int = 4, ffn_ratio: float = 2,
                 attention: str = "galerkin", eta: float = 1e-2, delta: float = 1e-2,
                 dropout: float = 0.0, interp_k: int = 4, activation: str = "gelu",
                 pos_encoding: int = 0, param_channels: int = 0) -> None:
        super().__init__()
        check_model_sizes(in_channels, out_channels, pos_dim, width)
        check_positive_int(layers, "layers", minimum=0)
        check_positive_int(interp_k, "interp_k")
        if attention not in ("galerkin", "fourier"):
            raise ValueError(f"attention must be 'galerkin' or 'fourier', got {attention!r}")
        self.in_channels, self.out_channels, self.pos_dim = in_channels, out_channels, pos_dim
        self.width, self.interp_k = width, interp_k
        att_cls = GalerkinAttention if attention == "galerkin" else FourierAttention
        self.pos_enc = FourierFeatures(pos_dim, pos_encoding)
        self.lift = MLP(in_channels + self.pos_enc.out_channels, width, width, layers=2,
                        activation=activation)
        self.blocks = nn.ModuleList([
            TransformerBlock(att_cls(width, width, heads=heads, pos_dim=pos_dim, eta=eta,
                                     delta=delta), width, ffn_ratio=ffn_ratio, dropout=dropout,
                             norm=None, activation=activation)
            for _ in range(layers)])
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
        self.head.reset_parameters()
        if self.conditioning is not None:
            self.conditioning.reset_parameters()

    def forward(self, data) -> Tensor:
        p = next(self.head.parameters())
        inp = read_inputs(data, self.in_channels, self.pos_dim, p.dtype, p.device)
        h = self.lift(torch.cat([inp.x, self.pos_enc(inp.pos)], dim=-1))
        film = None
        if self.conditioning is not None:
            film = self.conditioning.embed(read_params(data, self.param_channels, inp.num_graphs,
                                                       p.device))
            h = self.conditioning(h, film, inp.batch, 0)
        for site, blk in enumerate(self.blocks, 1):
            h = self.run_block(blk, h, inp.points)
            if film is not None:
                h = self.conditioning(h, film, inp.batch, site)
        return self.head(self.to_queries(h, data, inp))
