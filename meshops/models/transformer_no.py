"""Transformer neural operator (continuum-attention paper §4.2) on meshes."""

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
from meshops.models.inputs import MeshInputs, read_inputs
from meshops.nn.block import TransformerBlock
from meshops.nn.continuum import ContinuumAttention
from meshops.nn.fourier_features import FourierFeatures
from meshops.nn.mlp import MLP

__all__ = ["TransformerNO"]


@register_model("transformer_no")
class TransformerNO(NeuralOperator):
    r"""Transformer neural operator with quadrature-weighted continuum attention.

    The transformer neural operator (TNO) of the continuum-attention paper (§4.2,
    eqs. (9), (10), (14)) with every integral replaced by the quadrature rule of the
    input mesh, so the same parameters define (nearly) the same operator on every mesh
    of a geometry:

    1. **Lifting** :math:`\mathsf T_{in}`: the input function concatenated with the
       identity, :math:`u_{in}(x) = (u(x), x)` (eq. 14), mapped pointwise by a linear
       layer to ``width`` channels: ``[N, in_channels + pos_dim] -> [N, width]``. With
       ``pos_encoding = F > 0`` the identity is replaced by
       :math:`\gamma(x) = [x, \sin(\pi 2^k x), \cos(\pi 2^k x)]_{k<F}`
       (:class:`~meshops.nn.FourierFeatures`, also used for the query
       features), which makes sharp position-dependent kernels far easier to learn
       (coordinates of order one assumed).
    2. **Processor** :math:`\mathsf E_L`: ``layers`` :class:`~meshops.nn.block.TransformerBlock`
       s of multi-head :class:`~meshops.nn.continuum.ContinuumAttention` (self-attention
       :math:`\mathrm{softmax}(QK^\top/\sqrt{d} + \log w)V` on the input mesh; fused
       SDPA, no ``N x N`` matrix) + GELU feed-forward network, layer norms and
       residuals: ``[N, width] -> [N, width]``. ``pre_norm=False`` is the paper's
       post-norm iteration (10a)-(10d) with :math:`W_1 = W_2 = I`; the default pre-norm
       form trains more reliably.
    3. **Decoder** :math:`\mathsf T_{out}`, evaluated at any query points ``y``
       (``query_pos``; default: the input points). With ``decoder="cross"`` (default)
       the query features are an MLP of the coordinates, :math:`e(y) =
       \mathrm{MLP}(y)`; a cross-attention block attends from them to the processor's
       output on the input mesh (continuum cross-attention, Definition 11, weights of
       the input mesh), and a pointwise MLP maps to ``out_channels``:
       ``[M, pos_dim] -> [M, width] -> [M, out_channels]``. The output is thus one
       function of ``y`` defined by a single formula: querying the input points
       explicitly gives exactly the default output, and any other points are
       evaluations of the same function. ``decoder="pointwise"`` is the paper's
       eq. (19), a pointwise MLP of the processor output at the input points; it
       cannot evaluate other points (a ``query_pos`` different from ``pos`` is refused).

    Cost: ``O(layers · N² · width)`` time with ``O(N · width)`` memory (fused attention);
    use :class:`~meshops.models.pit.PiT` or
    :class:`~meshops.models.patched.PatchedTransformer` for meshes beyond ~20k points.

    Args:
        in_channels (int): input function channels ``C`` (``0`` for geometry-only
            problems, where the input is the mesh itself).
        out_channels (int): output channels.
        pos_dim (int): spatial dimension ``d``. (default: ``2``)
        width (int): embedding dimension :math:`d_{model}`. (default: ``128``)
        layers (int): transformer blocks ``L``. (default: ``4``)
        heads (int): attention heads (``width`` divisible by it). (default: ``4``)
        ffn_ratio (float): hidden width of the feed-forward networks / ``width``.
            (default: ``2``)
        decoder (str): ``"cross"`` (default) or ``"pointwise"``, see above.
        pre_norm (bool): pre-norm (default) or the paper's post-norm blocks.
        dropout (float): dropout in the blocks. (default: ``0``)
        activation (str): ``"gelu"`` (default), ``"relu"``, ``"silu"``, ``"tanh"``.
        pos_encoding (int): octaves ``F`` of sinusoidal position features (``0``: the
            raw coordinates, as in the paper). (default: ``0``)
        param_channels (int): ``K`` parameters per sample (``data.params [B, K]``) that
            condition the model (:class:`~meshops.models.conditioning.ParamConditioning`:
            FiLM of the lifted features, of the tokens after every block and of the
            cross decoder's query features); ``0`` (default): none, and the model is
            exactly the unconditioned one.

    Defaults per benchmark size (``TransformerNO.PRESETS``, build with
    ``TransformerNO.from_preset(name, in_channels=..., out_channels=...)``; parameters
    for ``in_channels=0, out_channels=1``):

    =============================  =====  ======  =====  ===========  =================
    preset                         width  layers  heads  parameters   notes
    =============================  =====  ======  =====  ===========  =================
    ``"elasticity"`` (972 points)  128    4       4      696,833      = the defaults
    ``"naca"`` (221x51 = 11,271)   96     4       4      393,601      N² attention:
                                                                      GPU advised (41 s
                                                                      fwd+bwd per sample
                                                                      on 1 CPU core)
    large meshes (100k+ points)    --     --      --     --           quadratic: use
                                                                      PiT or
                                                                      PatchedTransformer
    =============================  =====  ======  =====  ===========  =================

    For coordinates of order one, ``pos_encoding=3`` cuts the training steps needed by
    about 3x (measured on a Gaussian-smoothing operator: 6% error after 400 steps versus
    24% with raw coordinates).

    Shapes:
        - **input:** a :class:`~meshops.MeshData` (batch) with ``x [N, in_channels]``,
          ``pos [N, pos_dim]``, ``weight [N]``, ``batch [N]`` (optional),
          ``query_pos [M, pos_dim]`` and ``query_batch [M]`` (optional).
        - **output:** ``[M, out_channels]`` (``M = N`` without ``query_pos``).
    """

    PRESETS: dict[str, dict[str, Any]] = {
        "elasticity": dict(width=128, layers=4, heads=4, ffn_ratio=2),
        "naca": dict(width=96, layers=4, heads=4, ffn_ratio=2),
    }

    def __init__(self, in_channels: int, out_channels: int, pos_dim: int = 2, width: int = 128,
                 layers: int = 4, heads: int = 4, ffn_ratio: float = 2, decoder: str = "cross",
                 pre_norm: bool = True, dropout: float = 0.0, activation: str = "gelu",
                 pos_encoding: int = 0, param_channels: int = 0) -> None:
        super().__init__()
        check_model_sizes(in_channels, out_channels, pos_dim, width)
        check_positive_int(layers, "layers", minimum=0)
        check_positive_int(param_channels, "param_channels", minimum=0)
        if decoder not in ("cross", "pointwise"):
            raise ValueError(f"decoder must be 'cross' or 'pointwise', got {decoder!r}")
        self.in_channels, self.out_channels, self.pos_dim = in_channels, out_channels, pos_dim
        self.width, self.decoder = width, decoder
        self.pos_enc = FourierFeatures(pos_dim, pos_encoding)
        self.lift = nn.Linear(in_channels + self.pos_enc.out_channels, width)
        self.blocks = nn.ModuleList([
            TransformerBlock(ContinuumAttention(width, width, heads=heads), width,
                             ffn_ratio=ffn_ratio, dropout=dropout, pre_norm=pre_norm,
                             activation=activation)
            for _ in range(layers)])
        if decoder == "cross":
            self.query_embed = MLP(self.pos_enc.out_channels, width, width, layers=2,
                                   activation=activation)
            self.cross = TransformerBlock(ContinuumAttention((width, width), width, heads=heads),
                                          width, ffn_ratio=ffn_ratio, dropout=dropout,
                                          pre_norm=pre_norm, activation=activation, cross=True)
        else:
            self.query_embed = None
            self.cross = None
        self.norm_out = nn.LayerNorm(width) if pre_norm else nn.Identity()
        self.head = MLP(width, width, out_channels, layers=2, activation=activation)
        # built last: the other layers' initial weights do not depend on it
        self.param_channels = param_channels
        self.conditioning = (ParamConditioning(param_channels, width, layers + 2)
                             if param_channels else None)

    def mesh_transform(self):
        """Stores the digest of each sample's mesh (:class:`~meshops.models.structures.
        MeshDigest`): TransformerNO derives nothing else from a mesh, but with it a
        compiled forward on a batch of one mesh knows the samples' sizes (no graph
        break)."""
        from meshops.models.structures import MeshDigest
        return MeshDigest()

    def reset_parameters(self) -> None:
        self.lift.reset_parameters()
        for blk in self.blocks:
            blk.reset_parameters()
        if self.cross is not None:
            self.query_embed.reset_parameters()
            self.cross.reset_parameters()
        if isinstance(self.norm_out, nn.LayerNorm):
            self.norm_out.reset_parameters()
        self.head.reset_parameters()
        if self.conditioning is not None:
            self.conditioning.reset_parameters()

    def encode(self, data) -> tuple[Tensor, MeshInputs]:
        """Lifting + processor: features ``[N, width]`` on the input mesh, and the inputs
        (:func:`~meshops.models.inputs.read_inputs`)."""
        return self._encode(data)[:2]

    def _encode(self, data) -> tuple[Tensor, MeshInputs, Optional[Tensor]]:
        """:meth:`encode` and the parameters' FiLM (None without conditioning)."""
        dtype = self.lift.weight.dtype
        inp = read_inputs(data, self.in_channels, self.pos_dim, dtype, self.lift.weight.device)
        h = self.lift(torch.cat([inp.x, self.pos_enc(inp.pos)], dim=-1))
        film = None
        if self.conditioning is not None:
            film = self.conditioning.embed(read_params(data, self.param_channels, inp.num_graphs,
                                                       h.device))
            h = self.conditioning(h, film, inp.batch, 0)
        for site, blk in enumerate(self.blocks, 1):
            h = self.run_block(blk, h, inp.points)
            if film is not None:
                h = self.conditioning(h, film, inp.batch, site)
        return h, inp, film

    def forward(self, data) -> Tensor:
        h, inp, film = self._encode(data)
        last = len(self.blocks) + 1
        if self.decoder == "pointwise":
            if inp.has_query and not (inp.query_pos.shape == inp.pos.shape
                                      and torch.equal(inp.query_pos, inp.pos)):
                raise ValueError("decoder='pointwise' evaluates the output at the input points "
                                 "only; build the model with decoder='cross' to query other points")
            return self.head(self.norm_out(h))
        q = self.query_embed(self.pos_enc(inp.query_pos))
        if film is not None:
            q = self.conditioning(q, film, inp.query_batch, last)
        z = self.cross((h, q), (inp.points, inp.queries))
        return self.head(self.norm_out(z))
