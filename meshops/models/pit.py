"""Position-induced Transformer (PiT; Chen & Wu, §2.3) with quadrature weights."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.nn.functional import gelu

from meshops.mesh.digest import mesh_digest, same_digest
from meshops.models import latent as latents  # called through it: tests replace them there
from meshops.models.base import (
    NeuralOperator,
    check_model_sizes,
    check_positive_int,
    register_model,
)
from meshops.models.conditioning import ParamConditioning, sample_conditions
from meshops.models.inputs import read_inputs
from meshops.models.structures import MeshStructures, has_structures
from meshops.nn.block import pit_block
from meshops.nn.functional import materialise_kernel
from meshops.nn.local import LocalPositionAttention
from meshops.nn.mlp import MLP
from meshops.nn.points import Points, batch_points
from meshops.nn.position import PositionAttention, position_kernel
from meshops.search import graph, neighbourhoods  # called through them, as latents
from meshops.utils.checks import checking

__all__ = ["LatentMesh", "PiT"]

_LATENTS = ("fps", "sites", "input", "grid")
_BALLS = ("measure", "count")


def _lam_spread(heads: int, lam_min: float, lam_max: float) -> list[float]:
    """``heads`` values geometrically spaced in ``[lam_min, lam_max]``."""
    if heads == 1:
        return [math.sqrt(lam_min * lam_max)]
    r = (lam_max / lam_min) ** (1.0 / (heads - 1))
    return [lam_min * r ** h for h in range(heads)]


class LatentMesh:
    """The latent mesh of a batch: indices into the inputs (or None), positions,
    quadrature weights, batch vector, whether all samples share one mesh (``shared``:
    compared here unless the caller knows it) and the :class:`Points` of the mesh (the
    dense layout too when the processor needs it, i.e. unless ``shared``)."""

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
        self.points: Points = batch_points(pos, weight, batch, dense=not self.shared,
                                           num_graphs=num_graphs)


def _check_pit_options(heads, blocks, num_latent, latent, grid_shape, pos_dim, ball,
                       quantile_in, quantile_out, lam_min, lam_max) -> None:
    """:class:`PiT`'s options, each refused with a ValueError naming it."""
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
       ``shared_lambda=True`` gives the blocks one set of :math:`\lambda_h` (one
       parameter, shared by the blocks), so a single kernel serves all of them.
    3. **Decoder** :math:`\mathrm{MLP} \circ \sigma \circ \mathrm{LocPosAtt}_{out}(\cdot;
       X_v \to X_u)`: local position attention from the latent mesh to the query points
       (``query_pos``, default the input points), ``[M, C]``, then a 2-layer MLP to
       ``[M, out_channels]``. The same formula at every query point: querying the input
       points explicitly reproduces the default output.

    **Latent mesh** (``latent``):

    * ``"fps"``: farthest-point sampling of ``num_latent`` of each sample's input
      points (:func:`meshops.search.fps`; PiT's choice for unstructured data);
    * ``"sites"``: each sample's input point nearest to each of about ``num_latent``
      sites of a regular grid over its bounding box
      (:func:`~meshops.models.latent.site_latent`): fixed by the domain, so the latent
      mesh of the same domain meshed again (finer, graded) moves by at most the local
      mesh size, where a farthest-point sample moves by up to its own spacing;
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
    :meth:`mesh_transform` once per sample (e.g. when the samples are loaded;
    :class:`~meshops.training.Trainer` does it) and forward does no neighbour search
    for a fixed dataset (:mod:`meshops.models.structures`).

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
        latent (str): ``"fps"`` (default), ``"sites"``, ``"input"`` or ``"grid"``.
        num_latent (int): latent points per sample for ``"fps"`` (about as many for
            ``"sites"``). (default: ``1024``)
        grid_shape (list of int, optional): structured shape for ``"grid"``.
        stride (int or list of int): sub-grid stride for ``"grid"``. (default: ``2``)
        quantile_in (float): encoder locality quantile. (default: ``0.02``)
        quantile_out (float): decoder locality quantile. (default: ``0.02``)
        ball (str): ``"measure"`` (default) or ``"count"``, see above.
        lam_min, lam_max (float): range of the initial :math:`\lambda`. (default:
            ``1``, ``1024``)
        shared_lambda (bool): one :math:`\lambda` per head for all processor blocks: the
            blocks share the first block's parameter ``lam_raw`` (one kernel for the
            whole processor). (default: ``False``)
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
        _check_pit_options(heads, blocks, num_latent, latent, grid_shape, pos_dim, ball,
                           quantile_in, quantile_out, lam_min, lam_max)
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
            # one lambda per head for the whole processor: the first block's parameter,
            # shared (one tensor in the state dict under every block's name)
            for att in list(self.attn)[1:]:
                att.lam_raw = self.attn[0].lam_raw
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

    # ----------------------------------------------------------------- forward
    def forward(self, data) -> Tensor:
        inp = read_inputs(data, self.in_channels, self.pos_dim, self.lift.weight.dtype,
                          self.lift.weight.device, dense=False)
        key = self.structure_key(inp.pos.dtype, inp.has_query)
        if has_structures(data, key, inp.num_graphs, "PiT"):
            lat, e_in, e_out = self.stored_structures(data, inp)
        else:
            lat, e_in, e_out = self.structures(inp)
        u = gelu(self.lift(torch.cat([inp.x, inp.pos], dim=-1)))
        film = None
        if self.conditioning is not None:
            film = self.conditioning.embed(sample_conditions(
                data, inp, self.param_channels, self.condition_on_inputs))
            u = self.conditioning(u, film, inp.batch, 0)
        # encoder: input mesh -> latent mesh (input quadrature weights)
        u = gelu(self.encoder((u, None), (inp.points, lat.points), edge_index=e_in))
        u = self._process(u, lat, film)
        # decoder: latent mesh -> query points (latent quadrature weights)
        h = gelu(self.decoder((u, None), (lat.points, inp.queries), edge_index=e_out))
        if film is not None:
            h = self.conditioning(h, film, inp.query_batch, len(self.attn) + 1)
        return self.head(h)

    def _process(self, u: Tensor, lat: LatentMesh, film: Optional[Tensor] = None) -> Tensor:
        """The processor blocks on the latent mesh: one kernel for all samples when they
        share the mesh, and for all blocks with ``shared_lambda`` when it fits
        (:func:`~meshops.nn.functional.materialise_kernel`); ``film``: the parameters'
        FiLM of the latent tokens before every block (None: no conditioning)."""
        kernel = self._shared_kernel(lat) if self.shared_lambda and len(self.attn) else None
        extra = {} if kernel is None else {"kernel": kernel}
        if lat.shared:
            B = lat.num_graphs
            n = lat.pos.shape[0] // B
            args = (None, None) if kernel is not None else (lat.pos[:n], lat.weight[:n])
            extra["shape"] = (B, n)
        else:
            args = (lat.points,)
        for site, (att, mlp, lin) in enumerate(zip(self.attn, self.mlp, self.linear), 1):
            if film is not None:
                u = self.conditioning(u, film, lat.batch, site)
            u = self.run_block(pit_block, u, att, mlp, lin, *args, **extra)
        return u

    def _shared_kernel(self, lat: LatentMesh) -> Optional[Tensor]:
        """The one position kernel of ``shared_lambda``, or None when it is too large to
        materialise (each block then evaluates the shared lambda itself)."""
        n = lat.pos.shape[0] // (lat.num_graphs if lat.shared else 1)
        entries = self.heads * n * n * (1 if lat.shared else lat.num_graphs)
        if not materialise_kernel(entries):
            return None
        lam = self.attn[0].lam
        if lat.shared:
            return position_kernel(lat.pos[:n], lat.pos[:n], lat.weight[:n], lam)
        return position_kernel(lat.pos, lat.pos, lat.weight, lam, batch=lat.batch)

    # ------------------------------------------------------ mesh-only structures
    def latent_mesh(self, inp) -> LatentMesh:
        """The latent mesh of a batch (see the class docstring)."""
        idx, pos, weight, batch = latents.latent_points(
            self.latent, inp.pos, inp.weight, inp.batch, self.num_latent, self.grid_shape,
            self.stride)
        return LatentMesh(pos, weight, batch, idx, inp.num_graphs)

    def structures(self, inp) -> tuple[LatentMesh, Tensor, Tensor]:
        """The latent mesh of a batch (``inp`` from
        :func:`~meshops.models.inputs.read_inputs`) and the encoder and decoder graphs
        (``edge_index [2, E]``, PyG's orientation: row 0 source, row 1 destination)."""
        lat = self.latent_mesh(inp)
        e_in = self._graph(inp.pos, inp.weight, inp.batch, lat.pos, lat.batch,
                           self.quantile_in)
        e_out = self._graph(lat.pos, lat.weight, lat.batch, inp.query_pos, inp.query_batch,
                            self.quantile_out)
        return lat, e_in, e_out

    def _graph(self, pos_src: Tensor, w_src: Tensor, b_src: Optional[Tensor], pos_dst: Tensor,
               b_dst: Optional[Tensor], quantile: float) -> Tensor:
        """The encoder's or decoder's ``edge_index`` (row 0 source, row 1 destination)."""
        if self.ball == "measure":
            return graph.measure_ball_graph(pos_src, w_src, b_src, pos_dst, b_dst, quantile)
        return neighbourhoods.local_graph(pos_src, pos_dst, None, quantile, b_src, b_dst)

    def mesh_transform(self) -> MeshStructures:
        """:class:`~meshops.models.structures.MeshStructures` for this model: each
        sample's latent mesh and encoder/decoder graphs (see
        :meth:`NeuralOperator.mesh_transform`)."""
        return MeshStructures(self)

    def structure_key(self, dtype: torch.dtype, query: bool) -> str:
        """What the mesh-only structures of a sample depend on (besides the sample)."""
        return (f"PiT latent={self.latent} num_latent={self.num_latent} grid_shape="
                f"{self.grid_shape} stride={self.stride} quantile_in={self.quantile_in} "
                f"quantile_out={self.quantile_out} ball={self.ball} pos_dim={self.pos_dim} "
                f"dtype={dtype} query_pos={query}")

    def build_structures(self, inp) -> dict[str, Any]:
        """One sample's structures, local to it: the latent mesh (``latent``: indices
        into the sample's points, absent for ``latent="input"``; ``latent_weight``;
        ``latent_count``; ``latent_id``, a digest of the latent points and weights, by
        which a batch knows without reading its tensors whether its samples share one
        latent mesh) and the encoder and decoder graphs (``enc``, ``dec``: ``[E, 2]``
        rows ``(source, destination)``; ``enc_count``, ``dec_count``). The decoder graph
        is built for ``query_pos`` when the sample has it, else for its points."""
        lat, e_in, e_out = self.structures(inp)
        out: dict[str, Any] = {} if lat.index is None else {"latent": lat.index}
        out.update(latent_weight=lat.weight, latent_count=torch.tensor([lat.pos.shape[0]]),
                   latent_id=mesh_digest(lat.pos, lat.weight),
                   enc=e_in.t().contiguous(), enc_count=torch.tensor([e_in.shape[1]]),
                   dec=e_out.t().contiguous(), dec_count=torch.tensor([e_out.shape[1]]))
        return out

    def stored_structures(self, data, inp) -> tuple[LatentMesh, Tensor, Tensor]:
        """The batch's latent mesh and encoder/decoder graphs from the samples'
        :meth:`build_structures` (each sample's offsets added). Checks of the counts
        against the lengths read tensor values: only when
        :func:`meshops.utils.checks.checking`."""
        dev, B = inp.pos.device, inp.num_graphs
        n_lat = _counts(data, "mesh_latent_count", B, dev)
        p_lat = torch.cat([n_lat.new_zeros(1), n_lat.cumsum(0)])
        p_in = _starts(inp.batch, inp.pos.shape[0], B, dev)
        weight = data.mesh_latent_weight.to(device=dev, dtype=inp.pos.dtype)
        shared = same_digest(data, "mesh_latent_id", B)
        if self.latent == "input":
            if weight.shape[0] != inp.pos.shape[0]:
                raise ValueError("data.mesh_latent_weight does not match the samples' points")
            lat = LatentMesh(inp.pos, weight, inp.batch, None, B, shared)
        else:
            local = data.mesh_latent.to(dev)
            if checking() and int(n_lat.sum()) != local.shape[0]:
                raise ValueError("data.mesh_latent does not match data.mesh_latent_count")
            idx = local + _offsets(n_lat, p_in, local.shape[0])
            batch = None if inp.batch is None else inp.batch[idx]
            lat = LatentMesh(inp.pos[idx], weight, batch, idx, B, shared)
        p_q = _starts(inp.query_batch, inp.query_pos.shape[0], B, dev)
        e_in = _stored_graph(data, "enc", B, dev, p_in, p_lat)
        e_out = _stored_graph(data, "dec", B, dev, p_lat, p_q)
        return lat, e_in, e_out


def _counts(data, name: str, B: int, dev) -> Tensor:
    """A stored per-sample count, one entry per sample."""
    c = getattr(data, name).view(-1).to(dev)
    if c.shape[0] != B:
        raise ValueError(f"data.{name} has {c.shape[0]} entries for {B} samples")
    return c


def _starts(batch: Optional[Tensor], n: int, B: int, dev) -> Tensor:
    """``ptr [B + 1]`` of a sorted batch vector, without reading it back."""
    if batch is None:
        return torch.tensor([0, n], device=dev)
    return torch.searchsorted(batch, torch.arange(B + 1, device=dev, dtype=batch.dtype))


def _offsets(counts: Tensor, ptr: Tensor, total: int) -> Tensor:
    """``ptr[s]`` for each of the ``counts[s]`` entries of sample ``s`` (``total`` in all:
    given, as it is known from a shape, so that nothing is read back from the device)."""
    return torch.repeat_interleave(ptr[:-1], counts, output_size=total)


def _stored_graph(data, name: str, B: int, dev, p_src: Tensor, p_dst: Tensor) -> Tensor:
    """A stored graph of the batch, ``[2, E]`` (row 0 source, row 1 destination), each
    sample's source and destination offsets added."""
    edges = getattr(data, f"mesh_{name}").to(dev)
    counts = _counts(data, f"mesh_{name}_count", B, dev)
    E = edges.shape[0]
    if checking() and int(counts.sum()) != E:
        raise ValueError(f"data.mesh_{name} does not match data.mesh_{name}_count")
    return torch.stack([edges[:, 0] + _offsets(counts, p_src, E),
                        edges[:, 1] + _offsets(counts, p_dst, E)])
