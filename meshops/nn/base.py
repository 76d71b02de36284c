"""The base every meshops attention layer builds on (public): the layer contract.

A layer is one file that implements its kernel; this module holds the rest:

* :class:`AttentionBase`: channels and heads, input shape checks, the ``(src, dst)``
  pairs, and the one place where raw tensors become trusted
  :class:`~meshops.nn.points.Points` (:meth:`AttentionBase._inputs`); PyG-style
  :meth:`~AttentionBase.reset_parameters` and ``__repr__``.
* :class:`GlobalAttentionBase`: attention over the points of each sample.  A subclass
  implements ``_attend``; the base provides ``forward(x, pos, weight, batch, **extra)``
  (flat) and ``dense(x, pos, weight, mask, **extra)``, and passes ``extra`` keyword
  arguments (a precomputed kernel, ``lam``, a partition) through to ``_attend``.
* :class:`LocalAttentionBase`: attention over the edges of a neighbourhood graph
  (:func:`meshops.search.neighbourhoods.local_graph`).  A subclass implements ``_edges_attend``; the
  base provides the graph, ``forward`` and ``dense``.

Conventions (as in PyG): flat ``x [N, C]``, ``pos [N, d]``, ``weight [N]``, sorted
``batch [N]``; cross-attention takes ``(src, dst)`` pairs of ``x``, ``pos`` and
``batch``; ``weight`` always belongs to the source (it is the quadrature rule of the
integral).  Dense: ``x [B, N, C]``, ``weight [B, N]``, ``mask [B, N]`` (True = real
point); padding carries weight 0, so it drops out of every integral.  Edges: PyG's
orientation, ``edge_index[0]`` source, ``edge_index[1]`` destination.

Checks: shapes are always checked; every check that reads tensor values runs when
:func:`meshops.utils.checks.checking` says so (eager calls, not while ``torch.compile``
traces).  Raw tensors are checked once, when the base turns them into
:class:`~meshops.nn.points.Points`; a given :class:`~meshops.nn.points.Points` was
checked when it was built (:func:`~meshops.nn.points.batch_points`).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.inits import glorot, zeros

from meshops.nn._utils import as_pair, check_channels
from meshops.nn.points import Points, batch_points, is_pair, is_points

# called through the module: a test replaces the search there (its owner)
from meshops.search import neighbourhoods
from meshops.utils.checks import check_pos, check_weight, checking

__all__ = ["AttentionBase", "GlobalAttentionBase", "LocalAttentionBase", "Points",
           "batch_points", "dense_geometry", "dense_mask", "reset_linear", "scatter_dense"]

Channels = Union[int, Tuple[int, int]]
PairOrTensor = Union[Tensor, Tuple[Optional[Tensor], Optional[Tensor]]]


def reset_linear(*linears: torch.nn.Linear) -> None:
    """The layers' one initialisation: Glorot (Xavier-uniform) weights, zero biases
    (PyG's :mod:`torch_geometric.nn.inits`)."""
    for lin in linears:
        glorot(lin.weight)
        zeros(lin.bias)


def dense_mask(mask: Optional[Tensor], B: int, n: int, device: torch.device, name: str
               ) -> Tensor:
    """A checked boolean ``[B, n]`` mask (all True when ``mask`` is None)."""
    if mask is None:
        return torch.ones(B, n, dtype=torch.bool, device=device)
    if mask.shape != (B, n):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {(B, n)}")
    return mask.to(torch.bool)


def scatter_dense(out: Tensor, mask: Tensor) -> Tensor:
    """Flat rows ``[N, C]`` of the True entries of ``mask [B, n]`` -> ``[B, n, C]``
    (zeros elsewhere): the dense form of layers that compute on the flat batch."""
    dense = out.new_zeros(mask.shape + (out.shape[-1],))
    dense[mask] = out
    return dense


class AttentionBase(torch.nn.Module):
    """Channels, heads, input checks, ``reset_parameters`` and ``__repr__`` of a layer.

    Subclasses call :meth:`_init_channels` in ``__init__`` and list their projections
    in ``reset_parameters`` (or keep this one: it resets every child module that has
    a ``reset_parameters``, Linear layers with :func:`reset_linear`).
    """

    in_channels: Channels
    in_src: int
    in_dst: int
    out_channels: int
    heads: int
    #: whether ``_attend`` works on the dense layout of the samples (else on the flat
    #: batch, with the batch vectors where the dense form has masks)
    dense_layout = True
    #: whether the layer reads destination features (position attention does not:
    #: cross-attention accepts ``x=(x_src, None)``)
    needs_x_dst = True
    #: keyword arguments of ``forward`` that hold one value per source point (``parts``):
    #: :meth:`GlobalAttentionBase.dense` flattens them with the features
    point_args: Tuple[str, ...] = ()

    def _init_channels(self, in_channels: Channels, out_channels: Optional[int],
                       heads: int, divisible: bool = True) -> None:
        src, dst = as_pair(in_channels)
        for c in (src, dst):
            if not isinstance(c, int) or isinstance(c, bool) or c < 1:
                raise ValueError(f"in_channels must be a positive int or a (src, dst) pair of "
                                 f"them, got {in_channels!r}")
        out_channels = dst if out_channels is None else out_channels
        if divisible:
            check_channels(out_channels, heads, "out_channels")
        elif not isinstance(heads, int) or heads < 1:
            raise ValueError(f"heads must be >= 1, got {heads}")
        if not isinstance(out_channels, int) or out_channels < 1:
            raise ValueError(f"out_channels must be >= 1, got {out_channels}")
        self.in_channels, self.in_src, self.in_dst = in_channels, src, dst
        self.out_channels, self.heads = out_channels, heads

    def _init_projections(self, bias: bool, out_in: Optional[int] = None) -> None:
        """The Q/K/V projections (``lin_q`` from the destination, ``lin_k``/``lin_v``
        from the source, ``out_channels`` wide) and the output projection ``lin_out``
        (``out_in`` -> ``out_channels``; ``out_in`` defaults to ``out_channels``)."""
        out = self.out_channels
        self.lin_q = torch.nn.Linear(self.in_dst, out, bias=bias)
        self.lin_k = torch.nn.Linear(self.in_src, out, bias=bias)
        self.lin_v = torch.nn.Linear(self.in_src, out, bias=bias)
        self.lin_out = torch.nn.Linear(out if out_in is None else out_in, out, bias=bias)

    def reset_parameters(self) -> None:
        for child in self.children():
            if isinstance(child, torch.nn.Linear) and not isinstance(
                    child, torch.nn.modules.lazy.LazyModuleMixin):
                reset_linear(child)
            elif hasattr(child, "reset_parameters"):
                child.reset_parameters()

    def _weightless(self, extra: dict) -> bool:
        """Whether a call with these ``extra`` arguments needs no quadrature weights
        (position attention given a precomputed kernel, which holds them)."""
        return False

    @staticmethod
    def _check_x(x: Any, channels: int, name: str, dim: int = 2) -> None:
        shape = "[N, C]" if dim == 2 else "[B, N, C]"
        if not isinstance(x, Tensor) or x.dim() != dim:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a {shape} tensor, got {got}")
        if x.shape[-1] != channels:
            want = f"[N, {channels}]" if dim == 2 else f"[B, N, {channels}]"
            raise ValueError(f"{name} has {x.shape[-1]} channels, expected {channels} "
                             f"({name} must have shape {want}, got {tuple(x.shape)})")

    # ------------------------------------------------------------- the flat inputs
    def _inputs(self, x: PairOrTensor, pos: Any, weight: Any, batch: Any,
                need_weight: bool = True) -> Tuple[Tensor, Optional[Tensor], Points, Points]:
        """The one input path of the flat forms: ``x_src``, ``x_dst`` (None for layers
        that do not read it) and the ``(src, dst)`` :class:`Points`.  A given
        :class:`Points` (pair) is trusted; tensors are checked and turned into
        :class:`Points` here."""
        cross = is_pair(x)
        x_src, x_dst = as_pair(x)
        self._check_x(x_src, self.in_src, "x_src" if cross else "x")
        if not self.needs_x_dst:
            x_dst = None
        else:
            self._check_x(x_dst, self.in_dst, "x_dst" if cross else "x")
        n_src = x_src.shape[0]
        n_dst = _num_dst(x_dst, pos, batch, n_src)
        if x_dst is not None and x_dst.shape[0] != n_dst:
            raise ValueError(f"x_dst has {x_dst.shape[0]} rows, expected {n_dst}")
        src, dst = self._points(pos, weight, batch, n_src, n_dst, need_weight)
        return x_src, x_dst, src, dst

    def _points(self, pos: Any, weight: Any, batch: Any, n_src: int, n_dst: int,
                need_weight: bool = True) -> Tuple[Points, Points]:
        """``(src, dst)`` :class:`Points`: a given :class:`Points` (pair) is trusted;
        tensors are checked and turned into :class:`Points`."""
        if is_points(pos):
            if weight is not None or batch is not None:
                raise ValueError("pass weight and batch inside the Points (batch_points), "
                                 "not beside them")
            src, dst = as_pair(pos)
            if src.num_points != n_src or dst.num_points != n_dst:
                raise ValueError(f"the Points hold ({src.num_points}, {dst.num_points}) "
                                 f"points, the inputs have ({n_src}, {n_dst})")
            return src, dst
        if need_weight or weight is not None:
            check_weight(weight, n_src)     # raises, naming missing or misshaped weights
        dense = self.dense_layout
        if not is_pair(pos) and not is_pair(batch) and n_src == n_dst:  # self-attention
            src = batch_points(pos, weight, batch, n_src, dense)
            return src, src
        return batch_points(pos if is_pair(pos) else (pos, pos), weight,
                            batch if is_pair(batch) else (batch, batch), (n_src, n_dst), dense)

    # ------------------------------------------------------------- the dense inputs
    def _dense_inputs(self, x: PairOrTensor, pos: Any, weight: Any, mask: Any,
                      need_weight: bool = True) -> tuple:
        """Checked dense inputs ``(x_src, x_dst, pos_src, pos_dst, weight, m_src,
        m_dst)``: features ``[B, N, C]`` (``x_dst`` None for layers that do not read
        it), positions ``[N, d]`` (one mesh shared by the batch) or ``[B, N, d]`` or
        None, ``weight [Ns]`` or ``[B, Ns]`` (values checked) or None, boolean masks
        ``[B, N]`` or None."""
        cross = is_pair(x)
        s, d = ("_src", "_dst") if cross else ("", "")
        x_src, x_dst = as_pair(x)
        self._check_x(x_src, self.in_src, "x" + s, 3)
        if not self.needs_x_dst:
            x_dst = None
        else:
            self._check_x(x_dst, self.in_dst, "x" + d, 3)
            if x_src.shape[0] != x_dst.shape[0]:
                raise ValueError(f"x_src and x_dst have different batch sizes "
                                 f"({x_src.shape[0]} and {x_dst.shape[0]})")
        pos_src, pos_dst = as_pair(pos)
        m_src, m_dst = as_pair(mask)
        ns = x_src.shape[1]
        nd = _dense_num_dst(x_dst, pos_dst, as_pair(mask)[1], ns)
        pos_src, pos_dst, weight, m_src, m_dst, _ = dense_geometry(
            pos_src, pos_dst, weight, m_src, m_dst, ns, nd, x_src.shape[0], need_weight,
            ("_src", "_dst") if cross else ("", ""))
        return x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst

    def _dense_via_flat(self, inputs: tuple, cross: bool, **extra: Any) -> Tensor:
        """The dense form of a layer that computes on the flat batch: the padded points
        removed (they are neither sources nor destinations), ``forward`` on the rest,
        and its rows scattered back (zeros on padding)."""
        x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst = inputs
        B, ns = x_src.shape[:2]
        nd = _dense_num_dst(x_dst, pos_dst, m_dst, ns)
        m_src = dense_mask(m_src, B, ns, x_src.device, "mask")
        m_dst = dense_mask(m_dst, B, nd, x_src.device, "mask")
        ar = torch.arange(B, device=x_src.device)
        b_src, b_dst = ar[:, None].expand(B, ns)[m_src], ar[:, None].expand(B, nd)[m_dst]
        ps = None if pos_src is None else pos_src.expand(B, ns, pos_src.shape[-1])[m_src]
        pd = None if pos_dst is None else pos_dst.expand(B, nd, pos_dst.shape[-1])[m_dst]
        w = None if weight is None else weight.expand(B, ns)[m_src]
        for key in self.point_args:
            value = extra.get(key)
            if value is not None:
                if value.shape[:2] != (B, ns):
                    raise ValueError(f"{key} has shape {tuple(value.shape)}, expected "
                                     f"{(B, ns)}")
                extra[key] = value[m_src]
        if not cross:
            out = self(x_src[m_src], ps, w, b_src, **extra)
        else:
            xd = None if x_dst is None else x_dst[m_dst]
            out = self((x_src[m_src], xd), (ps, pd), w, (b_src, b_dst), **extra)
        return scatter_dense(out, m_dst)

    def _repr_extra(self) -> str:
        return ""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads}{self._repr_extra()})")


def dense_geometry(pos_src: Optional[Tensor], pos_dst: Optional[Tensor], weight: Any,
                   m_src: Optional[Tensor], m_dst: Optional[Tensor], ns: int, nd: int,
                   batch_size: Optional[int] = None, need_weight: bool = True,
                   suffix: Tuple[str, str] = ("_src", "_dst")) -> tuple:
    """Check the geometry of a dense call: positions ``[N, d]`` (one mesh shared by the
    batch) or ``[B, N, d]`` or None, ``weight [Ns]`` or ``[B, Ns]`` (values checked when
    :func:`meshops.utils.checks.checking`) or None where not ``need_weight``, masks ``[B, N]``
    or None, all of one batch size (``batch_size``, the features', when given).

    Returns:
        ``(pos_src, pos_dst, weight, m_src, m_dst, B)``, the masks boolean, ``B`` the
        batch size of the batched inputs (None when nothing is batched).
    """
    s, d = suffix
    sizes = set() if batch_size is None else {batch_size}
    for name, p in (("pos" + s, pos_src), ("pos" + d, pos_dst)):
        if p is not None and (not isinstance(p, Tensor) or p.dim() not in (2, 3)
                              or not p.is_floating_point()):
            got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"{name} must be a floating [N, d] or [B, N, d] tensor, "
                             f"got {got}")
        if p is not None and p.dim() == 3:
            sizes.add(p.shape[0])
    if pos_src is not None and pos_src.shape[-2] != ns:
        raise ValueError(f"pos{s} has {pos_src.shape[-2]} points but x{s} has {ns}")
    if pos_src is not None and pos_dst is not None and pos_src.shape[-1] != pos_dst.shape[-1]:
        raise ValueError(f"pos_src and pos_dst have different dimensions "
                         f"({pos_src.shape[-1]} and {pos_dst.shape[-1]})")
    if pos_dst is not None and pos_dst.shape[-2] != nd:
        raise ValueError(f"pos{d} has {pos_dst.shape[-2]} points, expected {nd}")
    if weight is not None or need_weight:
        if not isinstance(weight, Tensor) or weight.dim() not in (1, 2):
            got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight)
            raise ValueError(f"weight must be a tensor of quadrature weights [Ns] or "
                             f"[B, Ns], got {got}")
        if weight.shape[-1] != ns:
            want = f"[{ns}]" if batch_size is None else f"[{ns}] or [{batch_size}, {ns}]"
            raise ValueError(f"weight has shape {tuple(weight.shape)}, expected {want}")
        if weight.dim() == 2:
            sizes.add(weight.shape[0])
        check_weight(weight.reshape(-1), weight.numel())
    for name, m, n in (("mask" + s, m_src, ns), ("mask" + d, m_dst, nd)):
        if m is not None and (m.dim() != 2 or m.shape[1] != n):
            want = f"[B, {n}]" if batch_size is None else f"[{batch_size}, {n}]"
            raise ValueError(f"{name} has shape {tuple(m.shape)}, expected {want}")
        if m is not None:
            sizes.add(m.shape[0])
    if len(sizes) > 1:
        raise ValueError(f"inconsistent batch sizes {sorted(sizes)} among x, pos, weight, "
                         f"mask")
    m_src = None if m_src is None else m_src.to(torch.bool)
    m_dst = None if m_dst is None else m_dst.to(torch.bool)
    return pos_src, pos_dst, weight, m_src, m_dst, (sizes.pop() if sizes else None)


def _num_dst(x_dst: Optional[Tensor], pos: Any, batch: Any, n_src: int) -> int:
    """Destination points of a flat call: the destination features of a call without a
    ``(pos_src, pos_dst)`` pair, else the destination :class:`Points`, positions,
    features or batch vector; one sample of ``n_src`` points when nothing says (the
    layer's output then decides)."""
    p_dst = as_pair(pos)[1]
    if x_dst is not None and not is_pair(pos):
        return x_dst.shape[0]
    if isinstance(p_dst, Points):
        return p_dst.num_points
    if isinstance(p_dst, Tensor):
        return p_dst.shape[0]
    if x_dst is not None:
        return x_dst.shape[0]
    b_dst = as_pair(batch)[1]
    return b_dst.shape[0] if isinstance(b_dst, Tensor) else n_src


def _dense_num_dst(x_dst: Optional[Tensor], pos_dst: Optional[Tensor],
                   m_dst: Optional[Tensor], ns: int) -> int:
    if x_dst is not None:
        return x_dst.shape[1]
    if pos_dst is not None:
        return pos_dst.shape[-2]
    return ns if m_dst is None else m_dst.shape[1]


class GlobalAttentionBase(AttentionBase):
    """Attention over the points of each sample (all of them, or the layer's own
    patches of them).

    A subclass implements ``_attend(x_src, x_dst, pos_src, pos_dst, weight, m_src,
    m_dst, **extra)``; ``extra`` holds the keyword arguments of ``forward``/``dense``
    beyond the contract's (a precomputed kernel, ``lam``, a partition).

    * Dense layout (``dense_layout = True``, the default): ``x_src [B, Ns, Cs]``,
      ``x_dst [B, Nd, Cd]`` (None when the layer sets ``needs_x_dst = False``),
      ``pos_*`` ``[B, N, d]`` or None, ``weight [B, Ns]`` with zeros on padding (padded
      features and positions are zeroed too), masks ``[B, N]`` or None (one sample, no
      padding).  Layers that set ``shared_mesh = True`` also get one mesh shared by the
      batch unbatched (``pos [N, d]``, ``weight [Ns]``, from :meth:`dense` with unbatched
      positions and weights and no mask).  Padded destination rows of the result
      are zeroed afterwards.
    * Flat layout (``dense_layout = False``): the flat batch, ``x [N, C]``, ``pos [N, d]``,
      ``weight [N]`` and the sorted batch vectors (or None) where the dense layout has
      masks; :meth:`dense` removes the padding and scatters the result back.

    ``_attend`` returns ``[B, Nd, out_channels]`` (dense) or ``[Nd, out_channels]``
    (flat).  It checks no input the base checked; a check of its own that reads tensor
    values runs only when :func:`meshops.utils.checks.checking`.
    """

    #: whether ``_attend`` takes one mesh shared by a dense batch unbatched
    shared_mesh = False

    def forward(self, x: PairOrTensor, pos: Any = None, weight: Optional[Tensor] = None,
                batch: Any = None, **extra: Any) -> Tensor:
        """Flat (PyG) form: ``x [N, C]`` or ``(x_src, x_dst)``; ``pos``, ``weight`` and
        ``batch`` as tensors (checked here) or ``pos`` a :class:`Points` (or a pair)
        from :func:`batch_points` (trusted).  ``extra`` goes to ``_attend``."""
        x_src, x_dst, src, dst = self._inputs(x, pos, weight, batch,
                                              not self._weightless(extra))
        if not self.dense_layout:
            return self._attend(x_src, x_dst, src.pos, dst.pos, src.weight, src.batch,
                                dst.batch, **extra)
        xs = src.to_dense(x_src)
        if x_dst is None:
            xd = None
        elif x_dst is x_src and dst.index is src.index:
            xd = xs
        else:
            xd = dst.to_dense(x_dst)
        ps = None if src.pos is None else src.to_dense(src.pos)
        if dst.pos is None:
            pd = None
        elif dst.pos is src.pos and dst.index is src.index:
            pd = ps
        else:
            pd = dst.to_dense(dst.pos)
        w = None if src.weight is None else src.to_dense(src.weight)
        out = self._masked_attend(xs, xd, ps, pd, w, src.mask, dst.mask, **extra)
        return dst.to_flat(out)

    def dense(self, x: PairOrTensor, pos: Any = None, weight: Optional[Tensor] = None,
              mask: Any = None, **extra: Any) -> Tensor:
        """Dense form: ``x [B, N, C]`` (or a ``(src, dst)`` pair), ``pos [N, d]`` (one
        mesh shared by the batch) or ``[B, N, d]`` (or a pair), ``weight [Ns]`` or
        ``[B, Ns]``, ``mask [B, N]`` (or a ``(mask_src, mask_dst)`` pair; True = real
        point).  ``extra`` goes to ``_attend``.

        Returns ``[B, N_dst, out_channels]`` with zeros on padded destination rows.
        """
        inputs = self._dense_inputs(x, pos, weight, mask, not self._weightless(extra))
        if not self.dense_layout:
            return self._dense_via_flat(inputs, is_pair(x) or is_pair(pos), **extra)
        x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst = inputs
        unbatched = [t.dim() == 2 for t in (pos_src, pos_dst) if t is not None]
        unbatched += [weight.dim() == 1] if weight is not None else []
        if not (self.shared_mesh and m_src is None and m_dst is None and all(unbatched)):
            B, ns = x_src.shape[:2]
            nd = _dense_num_dst(x_dst, pos_dst, m_dst, ns)
            pos_src = None if pos_src is None else pos_src.expand(B, ns, pos_src.shape[-1])
            pos_dst = None if pos_dst is None else pos_dst.expand(B, nd, pos_dst.shape[-1])
            weight = None if weight is None else weight.expand(B, ns)
        return self._masked_attend(x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst,
                                   **extra)

    def _masked_attend(self, x_src: Tensor, x_dst: Optional[Tensor],
                       pos_src: Optional[Tensor], pos_dst: Optional[Tensor],
                       weight: Optional[Tensor], m_src: Optional[Tensor],
                       m_dst: Optional[Tensor], **extra: Any) -> Tensor:
        if m_src is not None:
            # Padding carries no quadrature weight; zero its features too so that
            # garbage (even NaN) in padded slots cannot reach real outputs.
            if weight is not None:
                weight = weight.masked_fill(~m_src, 0)
            same = x_dst is x_src
            x_src = x_src.masked_fill(~m_src.unsqueeze(-1), 0)
            # self-attention stays recognisable (``x_dst is x_src``): a layer then
            # computes what depends on the features once for both sides
            x_dst = x_src if same else x_dst
            if pos_src is not None:
                pos_src = pos_src.masked_fill(~m_src.unsqueeze(-1), 0)
        out = self._attend(x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst, **extra)
        if m_dst is not None:
            out = out.masked_fill(~m_dst.unsqueeze(-1), 0)
        return out

    def _attend(self, x_src: Tensor, x_dst: Optional[Tensor], pos_src: Optional[Tensor],
                pos_dst: Optional[Tensor], weight: Optional[Tensor], m_src: Optional[Tensor],
                m_dst: Optional[Tensor], **extra: Any) -> Tensor:  # pragma: no cover
        raise NotImplementedError


class LocalAttentionBase(AttentionBase):
    """Attention over the edges of a neighbourhood graph (``k`` nearest sources,
    PiT's ``quantile`` or a ``radius`` ball), flat form only; the dense form flattens.

    A subclass implements ``_edges_attend(x_src, x_dst, pos_src, pos_dst, src, dst,
    weight, n_dst)`` with ``src``/``dst`` the source and destination index of every
    edge (PyG's ``edge_index[0]`` and ``edge_index[1]``).  ``needs_x_dst`` says whether
    it reads destination features.
    """

    dense_layout = False
    flow: str = "source_to_target"
    k: Optional[int] = None
    quantile: Optional[float] = None
    radius: Optional[float] = None

    def graph(self, pos: PairOrTensor, batch: PairOrTensor = None) -> Tensor:
        """The layer's neighbourhood graph ``[2, E]`` in the layer's ``flow`` (PyG's
        default: row 0 source, row 1 destination), to reuse across layers with the
        same neighbourhoods (``forward(..., edge_index=...)``)."""
        pos_src, pos_dst = as_pair(pos)
        b_src, b_dst = as_pair(batch)
        return neighbourhoods.local_graph(pos_src, pos_dst, self.k, self.quantile, b_src,
                                          b_dst, self.radius, flow=self.flow)

    def forward(self, x: PairOrTensor, pos: Any, weight: Optional[Tensor] = None,
                batch: Any = None, edge_index: Optional[Tensor] = None) -> Tensor:
        """Flat (PyG) form; see the class docstring.  ``edge_index`` (row 0 source, row 1
        destination as in PyG, e.g. from :meth:`graph`) replaces the neighbour search.
        ``pos`` may be a :class:`Points` pair from :func:`batch_points` (trusted: with
        ``edge_index`` the forward pass then checks no values)."""
        if not is_points(pos):
            for name, p in zip(("pos_src", "pos_dst"), as_pair(pos)):
                check_pos(p, name)
        x_src, x_dst, src_pts, dst_pts = self._inputs(x, pos, weight, batch)
        n_dst = dst_pts.num_points
        pos_src, pos_dst = src_pts.pos, dst_pts.pos
        if edge_index is None:
            edge_index = neighbourhoods.local_graph(pos_src, pos_dst, self.k, self.quantile,
                                                    src_pts.batch, dst_pts.batch, self.radius)
            src, dst = edge_index[0], edge_index[1]
        else:
            src, dst = _src_dst(edge_index, self.flow, src_pts.num_points, n_dst)
        return self._edges_attend(x_src, x_dst, pos_src, pos_dst, src, dst, src_pts.weight,
                                  n_dst)

    def dense(self, x: PairOrTensor, pos: PairOrTensor, weight: Tensor,
              mask: PairOrTensor = None) -> Tensor:
        """Dense form: ``x [B, N, C]`` (or ``(x_src, x_dst)``; ``x_dst`` may be None for
        position attention), ``pos [N, d]`` (shared) or ``[B, N, d]`` (or a pair),
        ``weight [Ns]`` or ``[B, Ns]``, ``mask [B, N]`` or ``(mask_src, mask_dst)``.
        Padded points are removed (they are neither neighbours nor queries); returns
        ``[B, Nd, out_channels]`` with zeros on padded rows."""
        for name, p in zip(("pos_src", "pos_dst"), as_pair(pos)):
            if not isinstance(p, Tensor):
                raise ValueError(f"{name} must be [N, d] or [B, N, d], got "
                                 f"{type(p).__name__}")
        return self._dense_via_flat(self._dense_inputs(x, pos, weight, mask), True)

    def _edges_attend(self, x_src: Tensor, x_dst: Optional[Tensor], pos_src: Tensor,
                      pos_dst: Tensor, src: Tensor, dst: Tensor, weight: Tensor,
                      n_dst: int) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _repr_extra(self) -> str:
        if self.radius is not None:
            return f", radius={self.radius}"
        return f", quantile={self.quantile}" if self.quantile is not None else f", k={self.k}"


def _src_dst(edge_index: Tensor, flow: str, n_src: int, n_dst: int) -> Tuple[Tensor, Tensor]:
    """``(source, destination)`` rows of an ``edge_index`` given with ``flow``, the
    indices range-checked when :func:`meshops.utils.checks.checking`."""
    neighbourhoods.check_flow(flow)
    rows = ("source", "destination") if flow == "source_to_target" else ("destination", "source")
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 \
            or edge_index.shape[0] != 2 or edge_index.dtype != torch.long:
        got = (f"{tuple(edge_index.shape)} {edge_index.dtype}" if isinstance(edge_index, Tensor)
               else type(edge_index).__name__)
        raise ValueError(f"edge_index must be a LongTensor [2, E] (row 0 {rows[0]}, row 1 "
                         f"{rows[1]}; flow={flow!r}), got {got}")
    sizes = {"source": n_src, "destination": n_dst}
    if checking() and edge_index.numel():
        for row, name in enumerate(rows):
            n = sizes[name]
            if int(edge_index[row].min()) < 0 or int(edge_index[row].max()) >= n:
                raise ValueError(f"edge_index[{row}] ({name}, flow={flow!r}) out of range "
                                 f"[0, {n})")
    if flow == "source_to_target":
        return edge_index[0], edge_index[1]
    return edge_index[1], edge_index[0]
