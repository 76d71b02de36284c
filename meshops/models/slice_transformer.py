"""Slice transformer: Transolver's architecture on meshes, every slice a quadrature
integral."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from meshops.models.base import (
    NeuralOperator,
    check_model_sizes,
    check_positive_int,
    register_model,
)
from meshops.models.conditioning import ParamConditioning, sample_conditions
from meshops.models.inputs import read_inputs
from meshops.models.structures import InterpolatedQueries
from meshops.nn.block import TransformerBlock
from meshops.nn.fourier_features import FourierFeatures
from meshops.nn.mlp import MLP
from meshops.nn.slice import SliceAttention

__all__ = ["SliceTransformer"]


def _check_global_inputs(channels: Sequence[int], in_channels: int,
                         condition_on_inputs: bool) -> tuple[int, ...]:
    """``global_inputs`` as a sorted tuple of distinct channel indices, checked."""
    out = tuple(sorted({int(c) for c in channels}))
    if not out:
        return out
    if not condition_on_inputs:
        raise ValueError("global_inputs enter through the conditioning on the input means: "
                         "set condition_on_inputs=True")
    if out[0] < 0 or out[-1] >= in_channels:
        raise ValueError(f"global_inputs {list(channels)} are not input channels "
                         f"0..{in_channels - 1}")
    return out


@register_model("slice_transformer")
class SliceTransformer(InterpolatedQueries, NeuralOperator):
    r"""Transolver-style neural operator with quadrature-weighted slice attention.

    Transolver (Wu et al., ICML 2024) learns soft partitions of the domain into a few
    *slices*, attends among their tokens and reads the result back at every point;
    here every slice token is a quadrature integral over the domain
    (:class:`~meshops.nn.slice.SliceAttention`), so the same parameters define (nearly)
    the same operator on any mesh of a geometry. With ``N`` points, ``C = width``:

    1. **Lifting**: ``[x, gamma(pos)] [N, in_channels + P] -> [N, C]`` by a 2-layer MLP
       (hidden ``2 C``), ``gamma`` the coordinates with ``pos_encoding`` octaves of
       sinusoids (:class:`~meshops.nn.FourierFeatures`; ``0``: the coordinates).
    2. **Processor**: ``layers`` pre-norm :class:`~meshops.nn.block.TransformerBlock` s
       of slice attention (``heads`` heads of ``slices`` slices) and a GELU
       feed-forward network of hidden width ``ffn_ratio * C``, ``[N, C] -> [N, C]``;
       linear in ``N``.
    3. **Decoder**: a layer norm and a linear map, ``[N, C] -> [N, out_channels]``
       (Transolver's). At other query points (``query_pos``) the processor's output is
       first interpolated from the ``interp_k`` nearest input points by inverse-distance
       weighting (:func:`~meshops.nn.knn_interpolate`, exact at coincident points), so
       querying the input points reproduces the default output.

    Conditioning (optional): ``param_channels`` parameters per sample
    (``data.params [B, K]``) and, with ``condition_on_inputs``, the quadrature-weighted
    mean of each input channel modulate the lifted features, the features after
    every block and the decoder's normalised features by FiLM
    (:class:`~meshops.models.conditioning.ParamConditioning`).

    Memory: a training step with checkpointed blocks, and a prediction, run on parts
    of the points (:meth:`in_parts`): the same values, with the slice weights and the
    MLPs' hidden features of one part at a time, so that a step on a million points
    takes about 2 GB at the default width.

    Args:
        in_channels (int): input channels (``0``: geometry only).
        out_channels (int): output channels.
        pos_dim (int): spatial dimension. (default: ``2``)
        width (int): feature width ``C``. (default: ``64``)
        layers (int): processor blocks. (default: ``4``)
        heads (int): heads of every slice attention (``width`` divisible by it).
            (default: ``4``)
        slices (int): slices per head. (default: ``32``)
        ffn_ratio (float): hidden width of the feed-forward networks / ``width``.
            (default: ``1``, Transolver's)
        pos_encoding (int): octaves of sinusoidal position features. (default: ``0``)
        interp_k (int): neighbours for the query-point interpolation. (default: ``4``)
        param_channels (int): parameters per sample that condition the model.
            (default: ``0``)
        condition_on_inputs (bool): also condition on the mean of each input channel.
            (default: ``False``)
        adaptive_temperature (bool): a slice temperature per point and head
            (Transolver++; :class:`~meshops.nn.slice.SliceAttention`). (default: ``False``)
        global_inputs (sequence of int): input channels constant over each mesh (a load,
            a speed) that enter only through the conditioning on the input means, not
            at every point, where a value unique to each training sample lets the model
            tell the samples apart (needs ``condition_on_inputs``). (default: ``()``)
        min_measure (float): a slice covering less than this fraction of the domain is
            muted in the attention among the tokens
            (:class:`~meshops.nn.slice.SliceAttention`), so that a slice smaller than the
            mesh resolves does not move the others when the mesh changes. (default: ``0``)

    Shapes:
        - **input:** ``x [N, in_channels]``, ``pos [N, pos_dim]``, ``weight [N]``,
          ``batch [N]`` (optional), ``query_pos [M, pos_dim]`` / ``query_batch [M]``
          (optional).
        - **output:** ``[M, out_channels]`` (``M = N`` without ``query_pos``).
    """

    def __init__(self, in_channels: int, out_channels: int, pos_dim: int = 2, width: int = 64,
                 layers: int = 4, heads: int = 4, slices: int = 32, ffn_ratio: float = 1,
                 pos_encoding: int = 0, interp_k: int = 4, param_channels: int = 0,
                 condition_on_inputs: bool = False, adaptive_temperature: bool = False,
                 global_inputs: Sequence[int] = (), min_measure: float = 0.0) -> None:
        super().__init__()
        check_model_sizes(in_channels, out_channels, pos_dim, width)
        check_positive_int(layers, "layers", minimum=1)
        check_positive_int(param_channels, "param_channels", minimum=0)
        check_positive_int(interp_k, "interp_k")
        if condition_on_inputs and not in_channels:
            raise ValueError("condition_on_inputs needs input channels (in_channels > 0)")
        self.global_inputs = _check_global_inputs(global_inputs, in_channels,
                                                  condition_on_inputs)
        self.in_channels, self.out_channels, self.pos_dim = in_channels, out_channels, pos_dim
        self.width, self.interp_k = width, interp_k
        self.pos_enc = FourierFeatures(pos_dim, pos_encoding)
        # the channels read at every point: all but the global ones
        self.register_buffer("pointwise", torch.tensor(
            [c for c in range(in_channels) if c not in self.global_inputs], dtype=torch.long),
            persistent=False)
        self.lift = MLP(len(self.pointwise) + self.pos_enc.out_channels, 2 * width, width,
                        layers=2, activation="gelu")
        self.blocks = nn.ModuleList([
            TransformerBlock(SliceAttention(width, width, heads=heads, slices=slices,
                                            adaptive_temperature=adaptive_temperature,
                                            min_measure=min_measure),
                             width, ffn_ratio=ffn_ratio)
            for _ in range(layers)])
        self.norm_out = nn.LayerNorm(width)
        self.head = nn.Linear(width, out_channels)
        # built last: the other layers' initial weights do not depend on it
        self.param_channels = param_channels
        self.condition_on_inputs = bool(condition_on_inputs)
        conditions = param_channels + (in_channels if condition_on_inputs else 0)
        self.conditioning = (ParamConditioning(conditions, width, layers + 2,
                                               given=param_channels)
                             if conditions else None)
        self.reset_parameters()

    #: Standard deviation of the initial weights of every linear map (Transolver's
    #: initialisation: truncated normal, zero biases): the residual blocks start near the
    #: identity and the slices near uniform. 3-minute validation errors on the obstacle
    #: stand-in, batch 2, one-cycle rate 1e-3: 0.070 with it, 0.106 with the layers' own
    #: (Glorot) initialisation (benchmarks/results/family-probes-cpu-3min.jsonl).
    INIT_STD = 0.02

    def reset_parameters(self) -> None:
        self.lift.reset_parameters()
        for blk in self.blocks:
            blk.reset_parameters()
        self.norm_out.reset_parameters()
        self.head.reset_parameters()
        self._init_small()
        for blk in self.blocks:
            # after the small initialisation: a per-point temperature starts as the
            # head's own (SliceAttention's zero offsets)
            if blk.attention.lin_temperature is not None:
                nn.init.zeros_(blk.attention.lin_temperature.weight)
                nn.init.zeros_(blk.attention.lin_temperature.bias)
        if self.conditioning is not None:
            # after the small initialisation: FiLM starts at zero (the identity)
            self.conditioning.reset_parameters()

    def _init_small(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=self.INIT_STD)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    #: Points per part where a pass runs on parts of the points (:meth:`in_parts`).
    #: Below :data:`meshops.training.footprint.PROBE_POINTS`' smaller probe, so that
    #: both probes measure the same path and their difference is the cost per point.
    PART_POINTS = 8192

    def in_parts(self, points: int) -> Optional[int]:
        """Points per part when a forward pass on ``points`` input points runs on parts
        of them (``None``: in one piece): in a training step with the blocks
        checkpointed (:meth:`~meshops.models.NeuralOperator.set_block_checkpointing`),
        and without gradients (prediction), when the points are more than one part of
        :attr:`PART_POINTS`.

        Every layer but the slice attention's integrals is pointwise, and those are
        sums over the points, so the model runs part by part: the lifting (with FiLM)
        on each part, then per block the integrals summed over the parts, the tokens'
        attention once, and the read-back, residuals, norms, feed-forward network and
        FiLM on each part; the norm and head at the end on each part. With gradients
        each part keeps only its input and is recomputed in the backward pass
        (``torch.utils.checkpoint``): the slice weights ``[N, heads, slices]`` and the
        hidden features of the MLPs never exist for all the points at once, and a step
        keeps the blocks' inputs and outputs ``[N, width]`` and the gradient of one of
        them (about 2 kB per point at width 64 in float32, against 8 kB with whole
        blocks checkpointed: ``benchmarks/results/step-memory-parts-cpu-1thread.txt``).
        The same values as in one piece up to rounding (the sums run in another order).
        """
        if points <= self.PART_POINTS:
            return None
        if not torch.is_grad_enabled() or (self.checkpoint_blocks and self.training):
            return self.PART_POINTS
        return None

    def features(self, inp, film: Optional[Tensor] = None) -> Tensor:
        """The lifted and processed features ``[N, width]`` at the input points of
        ``inp`` (:func:`~meshops.models.inputs.read_inputs`), FiLM-conditioned by
        ``film`` (from the conditioning's ``embed``) when given; on parts of the points
        where :meth:`in_parts` says so."""
        part = self.in_parts(inp.points.num_points)
        x = inp.x if len(self.pointwise) == self.in_channels else inp.x[:, self.pointwise]
        # 1. lifting of the pointwise inputs (and FiLM site 0)          [N, C]
        h = _by_rows(lambda xp, pp, bp: self._lift(xp, pp, bp, film), part,
                     x, inp.pos, inp.batch)
        # 2. slice-attention blocks (FiLM after each)                    [N, C]
        if part is None:
            for site, blk in enumerate(self.blocks, 1):
                h = self.run_block(blk, h, inp.points)
                if film is not None:
                    h = self.conditioning(h, film, inp.batch, site)
            return h
        pts = inp.points
        dense = pts.to_dense(h)                                          # [B, N, C]
        weight = self.blocks[0].attention.fractions(pts.to_dense(inp.weight), h.dtype,
                                                    pts.num_points, pts.mask)
        for site, blk in enumerate(self.blocks, 1):
            dense = self._block_in_parts(blk, dense, weight, film, site, part)
        return pts.to_flat(dense)

    def _lift(self, x: Tensor, pos: Tensor, batch: Optional[Tensor],
              film: Optional[Tensor]) -> Tensor:
        h = self.lift(torch.cat([x, self.pos_enc(pos)], dim=-1))
        return h if film is None else self.conditioning(h, film, batch, 0)

    def _block_in_parts(self, blk: TransformerBlock, x: Tensor, weight: Tensor,
                        film: Optional[Tensor], site: int, part: int) -> Tensor:
        """Block ``blk`` and FiLM site ``site`` on ``x [B, N, C]`` (dense, the weights
        ``weight [B, N]`` fractions of each sample's measure, zero on padding) part by
        part (:meth:`in_parts`)."""
        att = blk.attention
        xs, ws = x.split(part, 1), weight.split(part, 1)
        sums = [_run_part(lambda xp, wp: att.integrals(blk.attention_input(xp), wp), xp, wp)
                for xp, wp in zip(xs, ws)]
        z = att.tokens(torch.stack([m for m, _ in sums]).sum(0),          # [B, H, M, d]
                       torch.stack([f for _, f in sums]).sum(0))

        def rest(xp: Tensor) -> Tensor:
            h = blk.finish(xp, att.read(blk.attention_input(xp), z))     # [B, n, C]
            if film is None:
                return h
            B, n, C = h.shape
            batch = (None if B == 1 else
                     torch.arange(B, device=h.device).repeat_interleave(n))
            return self.conditioning(h.reshape(B * n, C), film, batch, site).view(B, n, C)

        if torch.is_grad_enabled():
            return torch.cat([_run_part(rest, xp) for xp in xs], 1)
        # Without gradients each part's output replaces its input, which nothing reads
        # once the tokens are known: one [B, N, C] tensor for the whole block.
        for xp in xs:
            xp.copy_(rest(xp))
        return x

    def _head(self, h: Tensor, batch: Optional[Tensor], film: Optional[Tensor]) -> Tensor:
        h = self.norm_out(h)
        if film is not None:
            # after the norm: the conditions scale the output itself (an answer linear
            # in a load), which the norm would otherwise undo
            h = self.conditioning(h, film, batch, len(self.blocks) + 1)
        return self.head(h)

    def forward(self, data) -> Tensor:
        inp = read_inputs(data, self.in_channels, self.pos_dim, self.head.weight.dtype,
                          self.head.weight.device)
        film: Optional[Tensor] = None
        if self.conditioning is not None:
            film = self.conditioning.embed(sample_conditions(
                data, inp, self.param_channels, self.condition_on_inputs))
        h = self.features(inp, film)
        # 3. to the query points, if any, the norm, FiLM's last site, the head  [M, out]
        h = self.to_queries(h, data, inp)
        return _by_rows(lambda hp, bp: self._head(hp, bp, film),
                        self.in_parts(h.shape[0]), h, inp.query_batch)


def _run_part(fn: Callable, *args: Optional[Tensor]):
    """``fn(*args)``, recomputed in the backward pass (keeping only ``args``) when
    gradients are on: :meth:`SliceTransformer.in_parts` runs in parts only then, or
    without gradients."""
    if torch.is_grad_enabled():
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def _by_rows(fn: Callable, part: Optional[int], *args: Optional[Tensor]) -> Tensor:
    """``fn(*args)`` on parts of ``part`` rows of every tensor in
    ``args`` (``None`` passed on as is), concatenated (:func:`_run_part`); in one piece
    when ``part`` is ``None``. One ``split`` of each tensor: its gradient is put
    together once, not a zero-filled copy per part."""
    if part is None:
        return fn(*args)
    n = next(a for a in args if a is not None).shape[0]
    pieces = [a.split(part) if a is not None else (None,) * -(-n // part) for a in args]
    if torch.is_grad_enabled():
        return torch.cat([_run_part(fn, *p) for p in zip(*pieces)])
    out: Optional[Tensor] = None     # without gradients: filled in place, not concatenated
    for start, p in zip(range(0, n, part), zip(*pieces)):
        y = fn(*p)
        out = y.new_empty((n,) + y.shape[1:]) if out is None else out
        out[start:start + y.shape[0]] = y
    return out
