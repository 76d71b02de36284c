"""Position-induced Transformer (PiT; Chen & Wu, §2.3) with quadrature weights."""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.nn.functional import gelu

from meshops.models.base import (NeuralOperator, check_model_sizes, check_positive_int,
                                 register_model)
from meshops.models.inputs import (MESH_ID, layer_inputs, mesh_digest, read_inputs,
                                   same_digest, sample_mesh_digest)
from meshops.models.conditioning import ParamConditioning, sample_conditions
from meshops.models.latent import fps_latent, grid_latent, voronoi_weights
from meshops.nn.functional import materialise_kernel
from meshops.nn.local import LocalPositionAttention, local_graph
from meshops.nn.mlp import MLP
from meshops.nn.position import PositionAttention, position_kernel
from meshops.search.graph import measure_ball_graph

__all__ = ["PiT", "PiTStructures"]

_LATENTS = ("fps", "input", "grid")
_BALLS = ("measure", "count")


def _lam_spread(heads: int, lam_min: float, lam_max: float) -> list[float]:
    """``heads`` values geometrically spaced in ``[lam_min, lam_max]``."""
    if heads == 1:
        return [math.sqrt(lam_min * lam_max)]
    r = (lam_max / lam_min) ** (1.0 / (heads - 1))
    return [lam_min * r ** h for h in range(heads)]


class _Latent:
    """The latent mesh of a batch: indices into the inputs (or None), positions,
    quadrature weights, batch vector, and whether all samples share one mesh
    (``shared``: compared here unless the caller knows it)."""

    def __init__(self, pos: Tensor, weight: Tensor, batch: Optional[Tensor],
                 index: Optional[Tensor], num_graphs: int, shared: Optional[bool] = None
                 ) -> None:
        self.pos, self.weight, self.batch, self.index = pos, weight, batch, index
        self.num_graphs = num_graphs
        self.shared = False
        if shared is not None:
            self.shared = shared and batch is not None and num_graphs > 1
        elif batch is not None and num_graphs > 1:
            n = pos.shape[0]
            if n % num_graphs == 0 and bool((torch.bincount(batch) == n // num_graphs).all()):
                p = pos.view(num_graphs, n // num_graphs, -1)
                w = weight.view(num_graphs, -1)
                self.shared = bool((p == p[:1]).all() and (w == w[:1]).all())


@register_model("pit")
class PiT(NeuralOperator):
    r"""Position-induced Transformer with quadrature-weighted position attention.

    PiT (Chen & Wu, "Positional Knowledge is All You Need: Position-induced Transformer
    (PiT) for Operator Learning", §2.3) is an encoder - processor - decoder whose
    attention kernels depend only on positions, :math:`\mathrm{softmax}_j(-\lambda_h
    \|x_i - y_j\|^2 + \log w_j)`; here every softmax carries the quadrature weights
    :math:`w_j` of its source mesh, so each layer discretises PiT's integral operator
    (eqs. (7)-(8), (11)) on any mesh (:class:`~meshops.nn.position.PositionAttention`,
    :class:`~meshops.nn.local.LocalPositionAttention`). With ``B`` samples, ``N`` input
    points, ``Nv`` latent points, ``M`` query points and ``C = width``:

    1. **Encoder** :math:`\sigma \circ \mathrm{LocPosAtt}_{in}(\cdot; X_a \to X_v) \circ
       \sigma \circ \mathrm{LINEAR}`: the input function and the coordinates
       ``[x, pos] [N, in_channels + pos_dim]`` are lifted pointwise to ``[N, C]`` (the
       reference code lifts the coordinates for Elasticity/NACA, whose input is the
       geometry), then local position attention maps them to the latent mesh,
       ``[Nv, C]``, with the input quadrature weights.
    2. **Processor**: ``blocks`` (4 in the paper) global position-attention blocks on
       the latent mesh with its latent weights,
       :math:`h = \sigma(\mathrm{PosAtt}(U)),\ U \leftarrow \sigma(\mathrm{MLP}(h) +
       \mathrm{LINEAR}(U))`, ``[Nv, C] -> [Nv, C]``. Each block's kernel
       ``[H, Nv, Nv]`` is built once per forward and applied to all channels (and to all
       samples at once when the batch shares one latent mesh, e.g. a fixed grid);
       ``shared_lambda=True`` gives the blocks one set of :math:`\lambda_h`, so a single
       kernel serves all of them.
    3. **Decoder** :math:`\mathrm{MLP} \circ \sigma \circ \mathrm{LocPosAtt}_{out}(\cdot;
       X_v \to X_u)`: local position attention from the latent mesh to the query points
       (``query_pos``, default the input points), ``[M, C]``, then a 2-layer MLP to
       ``[M, out_channels]``. The same formula at every query point: querying the input
       points explicitly reproduces the default output.

    **Latent mesh** (``latent``):

    * ``"fps"``: farthest-point sampling of ``num_latent`` of each sample's input
      points (:func:`meshops.search.fps`; PiT's choice for unstructured data);
    * ``"input"``: the input points themselves (PiT's Elasticity model: 972 points);
    * ``"grid"``: a strided sub-grid of structured samples with ``grid_shape`` (C order)
      and ``stride`` (per axis; the last row is always kept): the 221 x 51 NACA C-grid
      with stride 2 gives PiT's 111 x 26 latent mesh.

    **Latent quadrature weights**: every input point gives its weight to its nearest
    latent point (Voronoi aggregation, :func:`~meshops.models.latent.voronoi_weights`),
    so the latent weights sum to the domain measure and converge to the Voronoi cell
    measures of the latent points as the input mesh is refined (``"input"`` keeps the
    input weights).

    **Mesh-only structures** (latent mesh and its weights, encoder and decoder graphs)
    are built in every forward pass unless the samples carry them: apply
    :class:`PiTStructures` once per sample (e.g. when the samples are loaded) and
    forward does no neighbour search for a fixed dataset.

    **Local balls**: PiT restricts the encoder/decoder softmax to a ball holding a
    fraction ``quantile`` of each row of the distance matrix. With ``ball="measure"``
    (default) the fraction is of the source *measure* (the ball holds ``q |Ω|`` of
    quadrature weight, :func:`~meshops.search.measure_ball_graph`), which is
    mesh independent also on graded meshes; ``ball="count"`` is PiT's count quantile
    (``k = floor(q (N - 1)) + 1`` nearest points, :func:`~meshops.nn.local.quantile_k`).
    With uniform weights both agree.

    :math:`\lambda_h > 0` per head and layer (units: 1/length² of ``pos``), parametrised
    as :math:`\lambda = e^{\rho}` so that it can grow by orders of magnitude during
    training (the layers' softplus moves it by ~1e-3 per step; the reference code uses
    :math:`\tan(\tfrac{\pi}{4}(1 + \sin r))` for the same purpose) and initialised
    geometrically spread over ``[lam_min, lam_max] = [1, 1024]`` across the heads: kernel
    widths :math:`1/\sqrt{\lambda}` from the size of an O(1) domain down to ~0.03 (the
    reference draws :math:`\lambda \in [1, 7.9]`; sharp heads are needed to pass
    pointwise detail through the encoder/decoder balls). Pointwise layers use the
    reference's Kaiming-normal initialisation. Activation GELU. No bias in the attention
    value maps (as the reference code).

    Args:
        in_channels (int): input channels (``0``: geometry-only input).
        out_channels (int): output channels.
        pos_dim (int): spatial dimension. (default: ``2``)
        width (int): encoding dimension :math:`d_v`. (default: ``256``)
        heads (int): heads of every position-attention layer. (default: ``2``)
        blocks (int): processor blocks. (default: ``4``)
        latent (str): ``"fps"`` (default), ``"input"`` or ``"grid"``.
        num_latent (int): latent points per sample for ``"fps"``. (default: ``1024``)
        grid_shape (list of int, optional): structured shape for ``"grid"``.
        stride (int or list of int): sub-grid stride for ``"grid"``. (default: ``2``)
        quantile_in (float): encoder locality quantile. (default: ``0.02``)
        quantile_out (float): decoder locality quantile. (default: ``0.02``)
        ball (str): ``"measure"`` (default) or ``"count"``, see above.
        lam_min, lam_max (float): range of the initial :math:`\lambda`. (default:
            ``1``, ``1024``)
        shared_lambda (bool): one :math:`\lambda` per head for all processor blocks (one
            kernel for the whole processor). (default: ``False``)
        param_channels (int): ``K`` parameters per sample (``data.params [B, K]``) that
            condition the model (:class:`~meshops.models.conditioning.ParamConditioning`:
            FiLM of the lifted features, of the latent tokens before every block and of
            the decoder's features); ``0`` (default): none, and the model is exactly the
            unconditioned one.
        condition_on_inputs (bool): condition the same way on the quadrature-weighted
            mean of each input channel over each sample (after the input normaliser).
            For inputs constant over each mesh (a family of geometries whose
            parameters are given as constant fields) these are the sample's
            parameters, passed once per sample rather than left for the attention to
            average. (default: ``False``)

    Defaults per benchmark size (``PiT.PRESETS``; the paper's Tables 7-9 for
    Elasticity and NACA: encoding dimension, heads, latent mesh, encoder/decoder
    quantiles; 4 processor blocks; parameters for ``in_channels=0, out_channels=1``):

    ===============================  =====  =====  =====================  =========  ==========
    preset                           width  heads  latent                 q in/out   parameters
    ===============================  =====  =====  =====================  =========  ==========
    ``"elasticity"`` (972 points)    512    8      input (972 points)     2% / 2%    4,989,489
    ``"naca"`` (221x51 = 11,271)     256    2      grid, stride 2         0.5% / 2%  1,249,549
                                                   (111x26 = 2,886)
    ``"large"`` (100k+ points)       128    2      fps, 2,048 points      0.5% / 1%  313,485
    ===============================  =====  =====  =====================  =========  ==========

    The bare defaults (width 256, 2 heads, fps latent of 1,024 points, 2% / 2%) have
    1,249,549 parameters. With ``in_channels=2`` (e.g. the coordinates also given as
    the input function, so that the lifting sees 4 channels) the NACA preset has exactly
    the 1,250,061 parameters the paper reports for its NACA model; for Elasticity the
    paper reports 6,586,929, more than the architecture of its Table 9 gives (4,990,513
    with ``in_channels=2``). Measured on 2 CPU cores (``python -m benchmarks --only models
    --cases pit,pit_large``): ``"large"`` at 100k points 1.9 s forward, 6.2 s fwd+bwd;
    ``"elasticity"`` (latent = all input points, 8 heads) 0.39 s forward at 1,024 points
    and 14 s at 8,192; a GPU is advised for the latter.

    Shapes:
        - **input:** ``x [N, in_channels]``, ``pos [N, pos_dim]``, ``weight [N]``,
          ``batch [N]`` (optional), ``query_pos [M, pos_dim]``/``query_batch [M]``
          (optional).
        - **output:** ``[M, out_channels]``.
    """

    PRESETS: dict[str, dict[str, Any]] = {
        "elasticity": dict(width=512, heads=8, latent="input", quantile_in=0.02,
                           quantile_out=0.02),
        "naca": dict(width=256, heads=2, latent="grid", grid_shape=[221, 51], stride=2,
                     quantile_in=0.005, quantile_out=0.02),
        "large": dict(width=128, heads=2, latent="fps", num_latent=2048, quantile_in=0.005,
                      quantile_out=0.01),
    }

    def __init__(self, in_channels: int, out_channels: int, pos_dim: int = 2, width: int = 256,
                 heads: int = 2, blocks: int = 4, latent: str = "fps", num_latent: int = 1024,
                 grid_shape: Optional[Sequence[int]] = None,
                 stride: Union[int, Sequence[int]] = 2, quantile_in: float = 0.02,
                 quantile_out: float = 0.02, ball: str = "measure", lam_min: float = 1.0,
                 lam_max: float = 1024.0, shared_lambda: bool = False,
                 param_channels: int = 0, condition_on_inputs: bool = False) -> None:
        super().__init__()
        check_model_sizes(in_channels, out_channels, pos_dim, width)
        check_positive_int(heads, "heads")
        check_positive_int(blocks, "blocks", minimum=0)
        check_positive_int(num_latent, "num_latent")
        if latent not in _LATENTS:
            raise ValueError(f"latent must be one of {_LATENTS}, got {latent!r}")
        if latent == "grid":
            if grid_shape is None or len(grid_shape) != pos_dim or min(grid_shape) < 1:
                raise ValueError(f"latent='grid' needs grid_shape with pos_dim={pos_dim} "
                                 f"positive sizes, got {grid_shape!r}")
        if ball not in _BALLS:
            raise ValueError(f"ball must be one of {_BALLS}, got {ball!r}")
        for name, q in (("quantile_in", quantile_in), ("quantile_out", quantile_out)):
            if not 0.0 < q <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {q!r}")
        if not 0 < lam_min <= lam_max:
            raise ValueError(f"need 0 < lam_min <= lam_max, got {lam_min}, {lam_max}")
        self.in_channels, self.out_channels, self.pos_dim = in_channels, out_channels, pos_dim
        self.width, self.heads, self.latent = width, heads, latent
        self.num_latent = num_latent
        self.grid_shape = None if grid_shape is None else [int(s) for s in grid_shape]
        self.stride = stride
        self.quantile_in, self.quantile_out, self.ball = quantile_in, quantile_out, ball
        self.shared_lambda = shared_lambda
        lam = _lam_spread(heads, lam_min, lam_max)

        self.lift = nn.Linear(in_channels + pos_dim, width)
        # lam = exp(raw): Adam then moves lambda by a relative amount per step, so it can
        # travel from 1 to 10^3 in a few hundred steps; with softplus it moves by an
        # absolute ~1e-3 per step and sharp kernels are out of reach.
        self.encoder = LocalPositionAttention(width, width, heads=heads, quantile=quantile_in,
                                              lam_init=lam, bias=False, lam_param="exp")
        self.attn = nn.ModuleList([PositionAttention(width, width, heads=heads, lam_init=lam,
                                                     bias=False, lam_param="exp")
                                   for _ in range(blocks)])
        self.mlp = nn.ModuleList([MLP(width, width, width) for _ in range(blocks)])
        self.linear = nn.ModuleList([nn.Linear(width, width) for _ in range(blocks)])
        self.decoder = LocalPositionAttention(width, width, heads=heads, quantile=quantile_out,
                                              lam_init=lam, bias=False, lam_param="exp")
        self.head = MLP(width, width, out_channels)
        self._init_pointwise()
        if shared_lambda:
            # one lambda per head for the whole processor: the first block's
            for att in list(self.attn)[1:]:
                att.lam_raw.requires_grad_(False)
        # built last: the other layers' initial weights do not depend on it
        self.param_channels = check_positive_int(param_channels, "param_channels", minimum=0)
        if condition_on_inputs and not in_channels:
            raise ValueError("condition_on_inputs needs input channels (in_channels > 0)")
        self.condition_on_inputs = bool(condition_on_inputs)
        conditions = param_channels + (in_channels if condition_on_inputs else 0)
        self.conditioning = (ParamConditioning(conditions, width, blocks + 2,
                                               given=param_channels)
                             if conditions else None)

    def _pointwise_linears(self) -> list[nn.Linear]:
        mods = [self.lift, *self.linear]
        for mlp in (*self.mlp, self.head):
            mods += [m for m in mlp.modules() if isinstance(m, nn.Linear)]
        return mods

    def _init_pointwise(self) -> None:
        # the reference code's initialisation: Kaiming-normal weights (gain sqrt(2), for
        # the GELU stack without normalisation layers), default biases
        for lin in self._pointwise_linears():
            lin.reset_parameters()
            nn.init.kaiming_normal_(lin.weight)

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()
        self.decoder.reset_parameters()
        for att in self.attn:
            att.reset_parameters()
        self._init_pointwise()
        if self.conditioning is not None:
            self.conditioning.reset_parameters()

    # ----------------------------------------------------------------- pieces
    def latent_mesh(self, inp) -> _Latent:
        """The latent mesh of a batch (see the class docstring)."""
        if self.latent == "input":
            return _Latent(inp.pos, inp.weight, inp.batch, None, inp.num_graphs)
        if self.latent == "fps":
            idx = fps_latent(inp.pos, inp.batch, self.num_latent)
        else:
            idx = grid_latent(self.grid_shape, self.stride, inp.batch, inp.pos.shape[0],
                              device=inp.pos.device)
        pos = inp.pos[idx]
        batch = None if inp.batch is None else inp.batch[idx]
        weight = voronoi_weights(inp.pos, inp.weight, inp.batch, pos, batch)
        return _Latent(pos, weight, batch, idx, inp.num_graphs)

    def _graph(self, pos_src: Tensor, w_src: Tensor, b_src: Optional[Tensor], pos_dst: Tensor,
               b_dst: Optional[Tensor], quantile: float) -> Tensor:
        """The encoder's or decoder's ``edge_index`` in PyG's orientation (row 0 source)."""
        if self.ball == "measure":
            # measure_ball_graph gives the search's layout (row 0 destination)
            return measure_ball_graph(pos_src, w_src, b_src, pos_dst, b_dst, quantile).flip(0)
        return local_graph(pos_src, pos_dst, None, quantile, b_src, b_dst)

    def _process(self, u: Tensor, lat: _Latent, check: bool = True,
                 film: Optional[Tensor] = None) -> Tensor:
        batch = lat.batch
        shared_kernel = None
        if self.shared_lambda and len(self.attn):
            # one kernel for all blocks (and all samples when they share the latent mesh)
            n = lat.pos.shape[0] // (lat.num_graphs if lat.shared else 1)
            entries = self.heads * n * n * (1 if lat.shared else lat.num_graphs)
            if materialise_kernel(entries):
                if lat.shared:
                    shared_kernel = position_kernel(lat.pos[:n], lat.pos[:n], lat.weight[:n],
                                                    self.attn[0].lam)
                else:
                    shared_kernel = position_kernel(lat.pos, lat.pos, lat.weight,
                                                    self.attn[0].lam, batch=batch)
        # shared_lambda without one materialised kernel: every block evaluates the
        # first block's lambda (passed explicitly; the blocks' own stay frozen)
        lam = self.attn[0].lam if self.shared_lambda and len(self.attn) else None
        def block(u: Tensor, att, mlp, lin) -> Tensor:
            if lat.shared:
                B = lat.num_graphs
                n = u.shape[0] // B
                ud = u.view(B, n, -1)
                if shared_kernel is not None:
                    h = att.dense(ud, None, None, kernel=shared_kernel)
                else:
                    h = att.dense(ud, lat.pos[:n], lat.weight[:n], lam=lam, check=check)
                h = h.reshape(B * n, -1)
            elif shared_kernel is not None:
                h = att(u, None, None, batch if batch is None else (batch, batch),
                        kernel=shared_kernel)
            else:
                h = att(u, lat.pos, lat.weight, batch, lam=lam)
            h = gelu(h)
            return gelu(mlp(h) + lin(u))

        for site, (att, mlp, lin) in enumerate(zip(self.attn, self.mlp, self.linear), 1):
            if film is not None:
                u = self.conditioning(u, film, batch, site)
            u = self.run_block(block, u, att, mlp, lin)
        return u

    def mesh_transform(self) -> "PiTStructures":
        """:class:`PiTStructures` for this model (see :meth:`NeuralOperator.mesh_transform`)."""
        return PiTStructures(self)

    def forward(self, data) -> Tensor:
        # Compiled, the forward trusts the values of its inputs: checks that read them
        # are host synchronisations (graph breaks); eager calls and PiTStructures check.
        check = not torch.compiler.is_compiling()
        inp = read_inputs(data, self.in_channels, self.pos_dim, self.lift.weight.dtype,
                          self.lift.weight.device, check_values=check)
        pre = _precomputed(self, data, inp, check)
        if pre is None:
            lat = self.latent_mesh(inp)
            e_in = self._graph(inp.pos, inp.weight, inp.batch, lat.pos, lat.batch,
                               self.quantile_in)
            e_out = None
        else:
            lat, e_in, e_out = pre
        u = gelu(self.lift(inp.lifted()))
        film = None
        if self.conditioning is not None:
            film = self.conditioning.embed(sample_conditions(
                data, inp, self.param_channels, self.condition_on_inputs, check))
            u = self.conditioning(u, film, inp.batch, 0)
        # encoder: input mesh -> latent mesh (input quadrature weights)
        # compiled: the layers get trusted Points (the sizes known here, nothing read back)
        pair = None if inp.batch is None else (inp.batch, lat.batch)
        args = layer_inputs((inp.pos, lat.pos), inp.weight, pair, None, inp.num_graphs,
                            not check, dense=False)
        u = gelu(self.encoder((u, None), *args, edge_index=e_in))
        u = self._process(u, lat, check, film)
        # decoder: latent mesh -> query points (latent quadrature weights)
        if e_out is None:
            e_out = self._graph(lat.pos, lat.weight, lat.batch, inp.query_pos, inp.query_batch,
                                self.quantile_out)
        pair = None if lat.batch is None else (lat.batch, inp.query_batch)
        args = layer_inputs((lat.pos, inp.query_pos), lat.weight, pair, None, inp.num_graphs,
                            not check, dense=False)
        h = gelu(self.decoder((u, None), *args, edge_index=e_out))
        if film is not None:
            h = self.conditioning(h, film, inp.query_batch, len(self.attn) + 1)
        return self.head(h)


def _structure_key(model: "PiT", dtype: torch.dtype, query: bool) -> str:
    """What the mesh-only structures of a sample depend on (besides the sample)."""
    return (f"PiT latent={model.latent} num_latent={model.num_latent} grid_shape="
            f"{model.grid_shape} stride={model.stride} quantile_in={model.quantile_in} "
            f"quantile_out={model.quantile_out} ball={model.ball} pos_dim={model.pos_dim} "
            f"dtype={dtype} query_pos={query}")


class PiTStructures:
    """PyG-style transform: the structures of a :class:`PiT` that depend only on a
    sample's mesh, computed once (e.g. ``dataset.transform`` or applied when the
    samples are loaded and kept with them), so that training on a fixed dataset does
    no neighbour search, farthest-point sampling or Voronoi aggregation at all.

    Adds to one sample (a :class:`~meshops.MeshData`, not a batch): the latent mesh
    (``pit_latent``: indices into the sample's points, absent for ``latent="input"``;
    ``pit_latent_weight``; ``pit_latent_count``; ``pit_latent_id``, a digest of the
    latent points and weights, by which a batch knows without reading its tensors
    whether its samples share one latent mesh), the encoder graph (``pit_enc``, rows
    ``(latent point, input point)``; ``pit_enc_count``), the decoder graph (``pit_dec``,
    rows ``(query point, latent point)`` for ``query_pos`` when the sample has it, else
    for its points; ``pit_dec_count``), all local to the sample, and ``pit_key`` (the
    model settings and dtype they were built for). These batch with PyG's loaders
    (concatenated; the model adds each sample's offsets). :class:`PiT` uses them when
    their ``pit_key`` matches its settings, its dtype and whether the batch has
    ``query_pos``, and builds them otherwise (with a warning when a key is present but
    does not match). Apply it after anything that moves the points. The structures are those
    the model would build for the batch, up to the tie-breaking of equal distances in
    the neighbour searches.

    Args:
        model (PiT): the model; its settings and parameter dtype are read now.

    Shapes:
        - **input:** one sample with ``pos [N, d]``, ``weight [N]``, optional
          ``query_pos [M, d]``
        - **output:** the same object with ``pit_latent [Nv]``, ``pit_latent_weight
          [Nv]``, ``pit_enc [E_in, 2]``, ``pit_dec [E_out, 2]``, counts ``[1]``
    """

    def __init__(self, model: "PiT") -> None:
        if not isinstance(model, PiT):
            raise TypeError(f"PiTStructures needs a PiT model, got {type(model).__name__}")
        self.model = model
        self.dtype = model.lift.weight.dtype

    @torch.no_grad()
    def __call__(self, data):
        if getattr(data, "batch", None) is not None:
            raise ValueError("PiTStructures takes one sample (data.batch is set): apply it "
                             "to the samples before batching")
        m = self.model
        inp = read_inputs(data, m.in_channels, m.pos_dim, self.dtype, data.pos.device)
        lat = m.latent_mesh(inp)
        e_in = m._graph(inp.pos, inp.weight, None, lat.pos, None, m.quantile_in)
        e_out = m._graph(lat.pos, lat.weight, None, inp.query_pos, None, m.quantile_out)
        if lat.index is not None:
            data.pit_latent = lat.index
        data.pit_latent_weight = lat.weight
        data.pit_latent_count = torch.tensor([lat.pos.shape[0]])
        data.pit_latent_id = mesh_digest(lat.pos, lat.weight)
        setattr(data, MESH_ID, sample_mesh_digest(data))
        # Stored as rows (destination, source), the layout of structures built before
        # the layers took PyG's orientation: their pit_key is unchanged, so they stay valid.
        data.pit_enc = e_in.flip(0).t().contiguous()
        data.pit_enc_count = torch.tensor([e_in.shape[1]])
        data.pit_dec = e_out.flip(0).t().contiguous()
        data.pit_dec_count = torch.tensor([e_out.shape[1]])
        data.pit_key = _structure_key(m, self.dtype, inp.has_query)
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_structure_key(self.model, self.dtype, False)})"


def _offsets(counts: Tensor, ptr: Tensor, total: int) -> Tensor:
    """``ptr[s]`` for each of the ``counts[s]`` entries of sample ``s`` (``total`` in all:
    given, as it is known from a shape, so that nothing is read back from the device)."""
    return torch.repeat_interleave(ptr[:-1], counts, output_size=total)


def _shared_latent(data, num_graphs: int) -> Optional[bool]:
    """Whether the samples' latent meshes are one mesh, from their ``pit_latent_id``
    (None where structures built before it lack it: the tensors are compared then)."""
    return same_digest(data, "pit_latent_id", num_graphs)


def _precomputed(model: "PiT", data, inp, check: bool = True) -> Optional[tuple]:
    """The latent mesh and the encoder/decoder graphs of the batch from the
    :class:`PiTStructures` attributes, or None when they are absent or were built for
    other settings. ``check=False`` skips the checks that read tensor values (the
    structures' counts against their lengths): nothing here synchronises then."""
    key = getattr(data, "pit_key", None)
    if key is None:
        return None
    keys = key if isinstance(key, (list, tuple)) else [key]
    want = _structure_key(model, inp.pos.dtype, inp.has_query)
    if len(keys) != inp.num_graphs or any(k != want for k in keys):
        warnings.warn(f"the samples' PiT structures were built for other settings "
                      f"({keys[0]}); building them for this model ({want})", stacklevel=3)
        return None
    dev = inp.pos.device
    B = inp.num_graphs

    def ptr(batch, n):
        if batch is None:
            return torch.tensor([0, n], device=dev)
        # the start of each sample in the sorted batch vector, without reading it back
        return torch.searchsorted(batch, torch.arange(B + 1, device=dev, dtype=batch.dtype))

    def counts(name):
        c = getattr(data, name).view(-1).to(dev)
        if c.shape[0] != B:
            raise ValueError(f"data.{name} has {c.shape[0]} entries for {B} samples")
        return c

    p_in, p_q = ptr(inp.batch, inp.pos.shape[0]), ptr(inp.query_batch, inp.query_pos.shape[0])
    n_lat = counts("pit_latent_count")
    p_lat = torch.cat([n_lat.new_zeros(1), n_lat.cumsum(0)])
    weight = data.pit_latent_weight.to(device=dev, dtype=inp.pos.dtype)
    if model.latent == "input":
        if weight.shape[0] != inp.pos.shape[0]:
            raise ValueError("data.pit_latent_weight does not match the samples' points")
        lat = _Latent(inp.pos, weight, inp.batch, None, B, _shared_latent(data, B))
    else:
        local = data.pit_latent.to(dev)
        if check and int(n_lat.sum()) != local.shape[0]:
            raise ValueError("data.pit_latent does not match data.pit_latent_count")
        idx = local + _offsets(n_lat, p_in, local.shape[0])
        batch = None if inp.batch is None else inp.batch[idx]
        lat = _Latent(inp.pos[idx], weight, batch, idx, B, _shared_latent(data, B))
    enc, dec = data.pit_enc.to(dev), data.pit_dec.to(dev)
    n_enc, n_dec = counts("pit_enc_count"), counts("pit_dec_count")
    if check and (int(n_dec.sum()) != dec.shape[0] or int(n_enc.sum()) != enc.shape[0]):
        raise ValueError("data.pit_enc/pit_dec do not match their counts")
    # the layers' edge_index: PyG's orientation, row 0 source, row 1 destination
    E_in, E_out = enc.shape[0], dec.shape[0]
    e_in = torch.stack([enc[:, 1] + _offsets(n_enc, p_in, E_in),
                        enc[:, 0] + _offsets(n_enc, p_lat, E_in)])
    e_out = torch.stack([dec[:, 1] + _offsets(n_dec, p_lat, E_out),
                         dec[:, 0] + _offsets(n_dec, p_q, E_out)])
    return lat, e_in, e_out
