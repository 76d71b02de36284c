"""Transformer block (attention + feed-forward, norms, residuals) for any
meshops attention layer."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from meshops.nn._utils import as_pair

__all__ = ["TransformerBlock", "pit_block"]

_ACTIVATIONS = {
    "gelu": torch.nn.GELU,
    "relu": torch.nn.ReLU,
    "silu": torch.nn.SiLU,
    "tanh": torch.nn.Tanh,
}


def _make_norm(norm: Optional[str], channels: int) -> torch.nn.Module:
    if norm is None or norm == "none":
        return torch.nn.Identity()
    if norm == "layer":
        return torch.nn.LayerNorm(channels)
    if norm == "rms":
        return torch.nn.RMSNorm(channels)
    raise ValueError(f"norm must be 'layer', 'rms', 'none' or None, got {norm!r} "
                     f"(batch-statistics norms would couple samples and meshes)")


def _make_activation(activation: Union[str, torch.nn.Module, Callable]) -> torch.nn.Module:
    if isinstance(activation, torch.nn.Module):
        return activation
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)} or a "
                             f"module, got {activation!r}")
        return _ACTIVATIONS[activation]()
    if callable(activation):
        return _Lambda(activation)
    raise ValueError(f"activation must be a name, module or callable, got {activation!r}")


class _Lambda(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)


class TransformerBlock(torch.nn.Module):
    r"""Attention + feed-forward block with layer norms and residual connections.

    Wraps any meshops attention layer with the common signature
    ``attention(x, pos, weight, batch)`` (and ``attention.dense(x, pos, weight,
    mask)`` for :meth:`dense`).  Pre-norm (default), self form:

    .. math::
        h = x + \mathrm{Drop}(\mathrm{Attn}(\mathrm{N}_1(x))), \qquad
        y = h + \mathrm{FFN}(\mathrm{N}_2(h)),

    cross form (``cross=True``; queries and residual on the destination, the
    source normalised with its own norm :math:`\mathrm{N}_s`):

    .. math::
        h = x_d + \mathrm{Drop}(\mathrm{Attn}(\mathrm{N}_s(x_s), \mathrm{N}_1(x_d))), \qquad
        y = h + \mathrm{FFN}(\mathrm{N}_2(h)).

    Post-norm (``pre_norm=False``): :math:`h = \mathrm{N}_1(x + \mathrm{Drop}(\mathrm{Attn}(x)))`,
    :math:`y = \mathrm{N}_2(h + \mathrm{FFN}(h))` (the source is used as given).
    :math:`\mathrm{FFN}(h) = \mathrm{Drop}(W_2\, \mathrm{Drop}(\sigma(W_1 h)))`.
    All parts are pointwise except the attention, so the block is as
    discretisation-consistent as its attention layer.

    Args:
        attention (torch.nn.Module): the attention layer; its output width must be
            ``channels``.
        channels (int): width of the (destination) features and the residual stream.
        ffn_ratio (float): hidden width of the FFN as a multiple of ``channels``.
            (default: ``2``)
        hidden_channels (int, optional): hidden width of the FFN (overrides
            ``ffn_ratio``).
        dropout (float): dropout on the attention output and in the FFN.
            (default: ``0.0``)
        norm (str, optional): ``"layer"`` (default), ``"rms"`` or ``"none"``/``None``.
        pre_norm (bool): pre-norm (default) or post-norm residuals.
        activation (str or callable): ``"gelu"`` (default), ``"relu"``,
            ``"silu"``, ``"tanh"``, a module or a callable.
        cross (bool): build a cross-attention block (inputs are ``(src, dst)``
            pairs). (default: ``False``)
        src_channels (int, optional): width of the source features in the cross
            form (default: ``channels``).

    Shapes:
        - **input (flat):** self: ``x [N, C]``, ``pos [N, d]`` or ``None``,
          ``weight [N]``, ``batch [N]`` (optional); cross: ``(x_src [Ns, Cs],
          x_dst [Nd, C])``, ``(pos_src, pos_dst)``, ``weight [Ns]``,
          ``(batch_src, batch_dst)`` (optional)
        - **output (flat):** ``[N, C]`` (self) or ``[Nd, C]`` (cross)
        - **input/output (dense, :meth:`dense`):** as above with a leading batch
          dimension and ``mask [B, N]`` (or a pair) instead of ``batch``;
          output ``[B, Nd, C]`` with zeros on padded rows.
        - no points (``N = 0``, or ``Nd = 0`` in the cross form): an empty output,
          ``[0, C]`` flat, as from the attention layer.

    Extra keyword arguments of :meth:`forward`/:meth:`dense` are passed to the
    attention layer.
    """

    def __init__(self, attention: torch.nn.Module, channels: int, ffn_ratio: float = 2,
                 hidden_channels: Optional[int] = None, dropout: float = 0.0,
                 norm: Optional[str] = "layer", pre_norm: bool = True,
                 activation: Union[str, Callable] = "gelu", cross: bool = False,
                 src_channels: Optional[int] = None) -> None:
        super().__init__()
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        out = getattr(attention, "out_channels", None)
        if isinstance(out, int) and out != channels:
            raise ValueError(f"the attention layer outputs {out} channels but the block "
                             f"has channels={channels}; the residual needs them equal")
        if hidden_channels is None:
            if ffn_ratio <= 0:
                raise ValueError(f"ffn_ratio must be positive, got {ffn_ratio}")
            hidden_channels = max(1, int(round(ffn_ratio * channels)))
        if hidden_channels < 1:
            raise ValueError(f"hidden_channels must be positive, got {hidden_channels}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if src_channels is not None and not cross:
            raise ValueError("src_channels is only used by cross blocks (cross=True)")
        self.attention = attention
        self.channels = channels
        self.hidden_channels = hidden_channels
        self.src_channels = (channels if src_channels is None else src_channels) if cross else None
        self.pre_norm = pre_norm
        self.cross = cross
        self.norm = norm
        self.norm1 = _make_norm(norm, channels)
        self.norm2 = _make_norm(norm, channels)
        # The source gets its own norm only where it is normalised (pre-norm cross).
        self.norm_src = _make_norm(norm, self.src_channels) if cross and pre_norm else None
        self.drop = torch.nn.Dropout(dropout)
        self.ffn = torch.nn.Sequential(
            torch.nn.Linear(channels, hidden_channels),
            _make_activation(activation),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(hidden_channels, channels),
            torch.nn.Dropout(dropout),
        )
        # The attention layer is used as given (it may hold trained weights); only
        # reset_parameters() re-initialises it.

    def reset_parameters(self) -> None:
        """Re-initialise the attention layer, the norms and the FFN."""
        if hasattr(self.attention, "reset_parameters"):
            self.attention.reset_parameters()
        for m in (self.norm1, self.norm2, self.norm_src, self.ffn[0], self.ffn[3]):
            if m is not None and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def _inputs(self, x: Any):
        is_pair = isinstance(x, (tuple, list))
        if self.cross and not is_pair:
            raise ValueError("this block was built with cross=True and needs x=(x_src, x_dst)")
        if is_pair and not self.cross:
            raise ValueError("x is a (src, dst) pair but the block was built for "
                             "self-attention; use TransformerBlock(..., cross=True)")
        return as_pair(x) if is_pair else (x, x)

    def _run(self, x: Any, call: Callable[[Any], Tensor]) -> Tensor:
        x_src, x_dst = self._inputs(x)
        name = "x_dst" if self.cross else "x"
        if x_dst.shape[-1] != self.channels:
            raise ValueError(f"{name} has {x_dst.shape[-1]} channels, expected {self.channels}")
        if self.cross and x_src.shape[-1] != self.src_channels:
            raise ValueError(f"x_src has {x_src.shape[-1]} channels, expected "
                             f"src_channels={self.src_channels}")
        if self.cross:
            src = self.norm_src(x_src) if self.pre_norm else x_src
            return self.finish(x_dst, call((src, self.attention_input(x_dst))))
        return self.finish(x_dst, call(self.attention_input(x_dst)))

    def attention_input(self, x: Tensor) -> Tensor:
        """What the attention layer reads of the (destination) features ``x [..., C]``:
        ``N_1(x)`` pre-norm, ``x`` post-norm; pointwise."""
        return self.norm1(x) if self.pre_norm else x

    def finish(self, x: Tensor, attended: Tensor) -> Tensor:
        """The block's output from its (destination) input ``x [..., C]`` and the
        attention layer's output ``attended [..., C]`` at the same points: the
        residuals, the norms and the feed-forward network, pointwise (so a block can
        be evaluated on parts of the points once its attention is known)."""
        if self.pre_norm:
            h = x + self.drop(attended)
            return h + self.ffn(self.norm2(h))
        h = self.norm1(x + self.drop(attended))
        return self.norm2(h + self.ffn(h))

    def forward(self, x: Union[Tensor, tuple], pos: Any, weight: Optional[Tensor] = None,
                batch: Any = None, **kwargs: Any) -> Tensor:
        """Flat form; ``pos`` may be a :class:`~meshops.nn.base.Points` (pair) from
        :func:`~meshops.nn.base.batch_points`, passed on to the attention layer."""
        return self._run(x, lambda a: self.attention(a, pos, weight, batch, **kwargs))

    def dense(self, x: Union[Tensor, tuple], pos: Any, weight: Tensor, mask: Any = None,
              **kwargs: Any) -> Tensor:
        """Dense form ``x [B, N, C]`` (or a pair), ``weight [B, Ns]``, ``mask [B, N]``
        (or a pair); returns ``[B, Nd, C]`` with zeros on padded destination rows."""
        out = self._run(x, lambda a: self.attention.dense(a, pos, weight, mask, **kwargs))
        m_dst = as_pair(mask)[1]
        if m_dst is not None:
            out = out.masked_fill(~m_dst.to(torch.bool).unsqueeze(-1), 0)
        return out

    def __repr__(self) -> str:
        kind = ", cross=True" if self.cross else ""
        order = "" if self.pre_norm else ", pre_norm=False"
        return (f"{self.__class__.__name__}({self.attention!r}, channels={self.channels}, "
                f"hidden_channels={self.hidden_channels}{kind}{order})")


def pit_block(u: Tensor, attention: torch.nn.Module, mlp: torch.nn.Module,
              linear: torch.nn.Module, *args: Any, shape: Optional[tuple] = None,
              **kwargs: Any) -> Tensor:
    r"""PiT's processor block (PiT §2.3) around any meshops attention layer:

    .. math::
        h = \sigma(\mathrm{Attn}(U)), \qquad U \leftarrow \sigma(\mathrm{MLP}(h) + W U),

    with :math:`\sigma` the GELU and :math:`W` ``linear``.  ``args`` and ``kwargs`` go to
    the attention layer (``pos``, ``weight``, ``batch`` or a
    :class:`~meshops.nn.points.Points`; a precomputed ``kernel``).  With ``shape=(B, n)``
    the flat features are ``B`` samples of ``n`` points on one mesh, and the layer's
    dense form runs on them (one kernel for the whole batch).

    Shapes:
        ``u [N, C]`` -> ``[N, C]`` (``N = B n`` with ``shape``)
    """
    if shape is None:
        h = attention(u, *args, **kwargs)
    else:
        h = attention.dense(u.view(*shape, -1), *args, **kwargs).reshape(u.shape[0], -1)
    h = torch.nn.functional.gelu(h)
    return torch.nn.functional.gelu(mlp(h) + linear(u))
