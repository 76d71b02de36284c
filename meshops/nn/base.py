"""The base every meshops attention layer builds on (public).

A layer is one file that implements its kernel; this module holds the rest:

* :class:`Points`: a validated point set (one mesh or a flat PyG batch of meshes)
  with the flat ``[N, C]`` <-> dense ``[B, N_max, C]`` maps.  All value checks
  (weights finite and non-negative, batch vector sorted, sample sizes) happen once,
  when it is built (:func:`batch_points`); layers trust it, so their forward passes
  do no host synchronisation and compile with ``torch.compile(fullgraph=True)``.
  While ``torch.compile`` traces, the value checks are skipped everywhere in
  :mod:`meshops.nn` (the compiled code trusts its inputs; eager calls check them), and
  :func:`batch_points` given ``num_graphs`` and ``max_points`` reads no tensor value.
* :class:`AttentionBase`: channels and heads, input shape checks, ``(src, dst)``
  pairs, PyG-style :meth:`~AttentionBase.reset_parameters` and ``__repr__``.
* :class:`GlobalAttentionBase`: attention over all source points of a sample.  A
  subclass implements ``_attend`` on dense, masked tensors; the base provides
  ``forward(x, pos, weight, batch)`` (flat) and ``dense(x, pos, weight, mask)``.
* :class:`LocalAttentionBase`: attention over the edges of a neighbourhood graph.  A
  subclass implements ``_edges_attend``; the base provides the graph, ``forward``
  and ``dense``.

Conventions (as in PyG): flat ``x [N, C]``, ``pos [N, d]``, ``weight [N]``, sorted
``batch [N]``; cross-attention takes ``(src, dst)`` pairs of ``x``, ``pos`` and
``batch``; ``weight`` always belongs to the source (it is the quadrature rule of the
integral).  Dense: ``x [B, N, C]``, ``weight [B, N]``, ``mask [B, N]`` (True = real
point); padding carries weight 0, so it drops out of every integral.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.inits import glorot, zeros

from meshops.nn._utils import as_pair, check_batch, check_channels, check_length, check_weight

__all__ = ["AttentionBase", "GlobalAttentionBase", "LocalAttentionBase", "Points",
           "batch_points", "reset_linear"]

Channels = Union[int, Tuple[int, int]]
PairOrTensor = Union[Tensor, Tuple[Optional[Tensor], Optional[Tensor]]]


def reset_linear(*linears: torch.nn.Linear) -> None:
    """The layers' one initialisation: Glorot (Xavier-uniform) weights, zero biases
    (PyG's :mod:`torch_geometric.nn.inits`)."""
    for lin in linears:
        glorot(lin.weight)
        zeros(lin.bias)


def is_pair(value: Any) -> bool:
    return isinstance(value, (tuple, list))


def is_points(pos: Any) -> bool:
    """Whether ``pos`` is a trusted :class:`Points` (or a ``(src, dst)`` pair of them)."""
    return isinstance(pos, Points) or (is_pair(pos) and isinstance(pos[0], Points))


class Points:
    """A validated point set: one mesh, or a flat PyG batch of meshes.

    Build it with :func:`batch_points` (which checks the values once); a layer given
    a :class:`Points` trusts it and checks nothing that needs the tensors' values.

    Attributes:
        pos: ``[N, d]`` positions or None.
        weight: ``[N]`` quadrature weights (sources) or None (destinations).
        batch: ``[N]`` sorted sample index, or None for one sample.
        num_graphs: number of samples ``B`` (a Python int).
        max_points: ``N_max``, the most points of a sample (a Python int).
        index: ``[N]`` slot of every point in the flattened ``[B * N_max]`` dense
            layout, or None (one sample: the dense form is ``x[None]``).
        mask: ``[B, N_max]`` True at real points, or None (one sample, no padding).
    """

    __slots__ = ("pos", "weight", "batch", "num_graphs", "max_points", "index", "mask",
                 "num_points")

    def __init__(self, pos: Optional[Tensor], weight: Optional[Tensor], batch: Optional[Tensor],
                 num_points: int, num_graphs: int, max_points: int, index: Optional[Tensor],
                 mask: Optional[Tensor]) -> None:
        self.pos, self.weight, self.batch = pos, weight, batch
        self.num_points, self.num_graphs, self.max_points = num_points, num_graphs, max_points
        self.index, self.mask = index, mask

    def to_dense(self, t: Tensor) -> Tensor:
        """Flat ``[N, *F]`` to dense ``[B, N_max, *F]`` (zeros on padding)."""
        if self.max_points < 0:
            raise RuntimeError("these Points were built without the dense layout "
                               "(batch_points(..., dense=False))")
        if self.index is None:
            return t.unsqueeze(0)
        rest = tuple(t.shape[1:])
        out = t.new_zeros((self.num_graphs * self.max_points,) + rest)
        return out.index_copy(0, self.index, t).view((self.num_graphs, self.max_points) + rest)

    def to_flat(self, t: Tensor) -> Tensor:
        """Dense ``[B, N_max, *F]`` back to flat ``[N, *F]``."""
        if self.index is None:
            return t[0]
        return t.reshape((-1,) + tuple(t.shape[2:]))[self.index]

    def __repr__(self) -> str:
        return (f"Points(num_points={self.num_points}, num_graphs={self.num_graphs}, "
                f"max_points={self.max_points}, pos={self.pos is not None}, "
                f"weight={self.weight is not None})")


def _layout(batch: Optional[Tensor], n: int, size: int, nmax: Optional[int] = None
            ) -> Tuple[int, Optional[Tensor], Optional[Tensor]]:
    """``max_points``, ``index`` and ``mask`` of a sorted batch vector with ``size``
    samples.  ``nmax`` (the most points of a sample) is read from the batch vector (one
    host synchronisation, here and only here) unless given: then it is checked on the
    device, without a synchronisation (an error when a sample has more points)."""
    if batch is None:
        return n, None, None
    # sample boundaries of the sorted vector (a static shape, unlike bincount's)
    bounds = torch.searchsorted(batch, torch.arange(size + 1, device=batch.device,
                                                    dtype=batch.dtype))
    start, counts = bounds[:-1], bounds[1:] - bounds[:-1]
    if nmax is None:
        nmax = int(counts.max()) if size else 0
    else:
        # (a compiled model passes the size of a fixed mesh's samples: see
        # meshops.models.inputs.read_inputs)
        torch._assert_async((counts <= nmax).all(),
                            f"a sample has more than max_points={nmax} points; compiled "
                            f"meshops models take a batch of N points in B samples, B "
                            f"dividing N, for B samples of N/B points (a fixed mesh): call "
                            f"the model eagerly on such a batch of samples of different "
                            f"sizes")
    index = batch * nmax + (torch.arange(n, device=batch.device) - start[batch])
    mask = torch.zeros(size * nmax, dtype=torch.bool, device=batch.device)
    mask[index] = True
    return nmax, index, mask.view(size, nmax)


def _no_layout(batch: Optional[Tensor], n: int, size: int, nmax: Optional[int] = None
               ) -> Tuple[int, None, None]:
    """No dense layout (``max_points = -1``): :meth:`Points.to_dense` then refuses."""
    return (n, None, None) if batch is None else (-1, None, None)


def _check_pos(pos: Optional[Tensor], n: int, name: str) -> None:
    if pos is None:
        return
    if not isinstance(pos, Tensor) or pos.dim() != 2 or not pos.is_floating_point():
        got = tuple(pos.shape) if isinstance(pos, Tensor) else type(pos).__name__
        raise ValueError(f"{name} must be a floating [N, d] tensor, got {got}")
    check_length(pos, n, name)


def batch_points(pos: Any, weight: Optional[Tensor], batch: Any = None,
                 num_points: Any = None, dense: bool = True, num_graphs: Optional[int] = None,
                 max_points: Any = None) -> Union[Points, Tuple[Points, Points]]:
    """Validate a flat point set once and return the :class:`Points` layers trust.

    Args:
        pos: ``[N, d]`` positions, or a ``(pos_src, pos_dst)`` pair (either may be None
            for layers that do not use positions).
        weight: source quadrature weights ``[N_src]`` (finite, non-negative).
        batch: sorted ``[N]`` sample index, or a ``(batch_src, batch_dst)`` pair.
        num_points: ``N`` or ``(N_src, N_dst)`` where ``pos`` is None.
        dense: also build the dense layout (``index``, ``mask``, ``max_points``); the
            local layers, which work on the flat batch, skip it.
        num_graphs: the number of samples ``B`` where the caller knows it (e.g. a PyG
            batch's ``num_graphs``); read from the batch vectors otherwise.
        max_points: the most points of a sample (or an ``(src, dst)`` pair; None: read
            from the batch vector) where the caller knows it; a sample with more points
            is an error raised on the device.  With both given (and while
            ``torch.compile`` traces, where the value checks are skipped) nothing here
            reads a tensor value.

    Returns:
        :class:`Points` (one tensor given) or a ``(src, dst)`` pair of them sharing
        ``num_graphs``.

    Raises:
        ValueError: naming the array: wrong shapes or lengths, an unsorted batch,
            weights that are negative or not finite.
    """
    cross = is_pair(pos) or is_pair(batch) or is_pair(num_points)
    s, d = ("_src", "_dst") if cross else ("", "")
    pos_src, pos_dst = as_pair(pos)
    b_src, b_dst = as_pair(batch)
    n_src, n_dst = as_pair(num_points)
    if n_src is None and pos_src is None:
        raise ValueError("give pos or num_points")
    n_src = pos_src.shape[0] if n_src is None else n_src
    n_dst = pos_dst.shape[0] if n_dst is None else n_dst
    if pos_src is not None and pos_dst is not None and pos_src.shape[-1] != pos_dst.shape[-1]:
        raise ValueError(f"pos_src and pos_dst have different dimensions "
                         f"({pos_src.shape[-1]} and {pos_dst.shape[-1]})")
    _check_pos(pos_src, n_src, "pos" + s)
    _check_pos(pos_dst, n_dst, "pos" + d)
    if (b_src is None) != (b_dst is None):
        raise ValueError("batch_src and batch_dst must both be given or both be None")
    check_length(b_src, n_src, "batch" + s)
    check_length(b_dst, n_dst, "batch" + d)
    check_batch(b_src, "batch" + s)
    if b_dst is not b_src:
        check_batch(b_dst, "batch" + d)
    if weight is not None:
        check_weight(weight, n_src)
    if num_graphs is None:
        size = max([int(b.max()) + 1 for b in (b_src, b_dst) if b is not None and b.numel()],
                   default=1)
    else:
        size = num_graphs
    m_src, m_dst = as_pair(max_points)
    layout = _layout if dense else _no_layout
    src = Points(pos_src, weight, b_src, n_src, size, *layout(b_src, n_src, size, m_src))
    if not cross:
        return src
    if b_dst is b_src and n_dst == n_src:
        return src, Points(pos_dst, None, b_dst, n_dst, size, src.max_points, src.index,
                           src.mask)
    return src, Points(pos_dst, None, b_dst, n_dst, size, *layout(b_dst, n_dst, size, m_dst))


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
    #: whether the layer works on the dense layout of its :class:`Points`
    dense_layout = True

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

    @staticmethod
    def _check_x(x: Any, channels: int, name: str, dim: int = 2) -> None:
        if not isinstance(x, Tensor) or x.dim() != dim:
            shape = "[N, C]" if dim == 2 else "[B, N, C]"
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a {shape} tensor, got {got}")
        if x.shape[-1] != channels:
            raise ValueError(f"{name} has {x.shape[-1]} channels, expected {channels}")

    def _points(self, pos: Any, weight: Any, batch: Any, n_src: int, n_dst: int
                ) -> Tuple[Points, Points, bool]:
        """``(src, dst)`` :class:`Points` and whether the layer must still check values:
        a given :class:`Points` (pair) is trusted; tensors are built and checked here."""
        if is_points(pos):
            if weight is not None or batch is not None:
                raise ValueError("pass weight and batch inside the Points (batch_points), "
                                 "not beside them")
            src, dst = as_pair(pos)
            if src.num_points != n_src or dst.num_points != n_dst:
                raise ValueError(f"the Points hold ({src.num_points}, {dst.num_points}) "
                                 f"points, the inputs have ({n_src}, {n_dst})")
            return src, dst, False
        if not isinstance(weight, Tensor):  # batch_points takes None (a given kernel)
            check_weight(weight, n_src)     # raises, naming the missing weights
        dense = self.dense_layout
        if not is_pair(pos) and not is_pair(batch) and n_src == n_dst:  # self-attention
            src = batch_points(pos, weight, batch, n_src, dense)
            return src, src, True
        src, dst = batch_points(pos if is_pair(pos) else (pos, pos), weight,
                                batch if is_pair(batch) else (batch, batch), (n_src, n_dst),
                                dense)
        return src, dst, True

    def _repr_extra(self) -> str:
        return ""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads}{self._repr_extra()})")


def _check_mask(mask: Optional[Tensor], x: Tensor, name: str) -> Optional[Tensor]:
    if mask is None:
        return None
    if mask.shape != x.shape[:2]:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(x.shape[:2])}")
    return mask.to(torch.bool)


def _check_dense_pos(pos: Optional[Tensor], x: Tensor, name: str) -> None:
    if pos is not None and (pos.dim() != 3 or pos.shape[:2] != x.shape[:2]):
        raise ValueError(f"{name} has shape {tuple(pos.shape)}, expected "
                         f"[{x.shape[0]}, {x.shape[1]}, d]")


class GlobalAttentionBase(AttentionBase):
    """Attention over every source point of a sample, on dense masked tensors.

    A subclass implements ``_attend(x_src, x_dst, pos_src, pos_dst, weight, m_src,
    m_dst, checked)`` on dense tensors: ``x_src [B, Ns, Cs]``, ``x_dst [B, Nd, Cd]``,
    ``pos_*`` or None, ``weight [B, Ns]`` with zeros on padding, masks or None.
    ``checked`` is False when the inputs came from a trusted :class:`Points`: the
    layer then does no value check (no host synchronisation).  Padded destination
    rows of the result are zeroed afterwards.
    """

    def forward(self, x: PairOrTensor, pos: Any = None, weight: Optional[Tensor] = None,
                batch: Any = None) -> Tensor:
        """Flat (PyG) form: ``x [N, C]`` or ``(x_src, x_dst)``; ``pos``, ``weight`` and
        ``batch`` as tensors (checked here) or ``pos`` a :class:`Points` (or a pair)
        from :func:`batch_points` (trusted)."""
        cross = is_pair(x)
        x_src, x_dst = as_pair(x)
        self._check_x(x_src, self.in_src, "x_src" if cross else "x")
        self._check_x(x_dst, self.in_dst, "x_dst" if cross else "x")
        src, dst, checked = self._points(pos, weight, batch, x_src.shape[0], x_dst.shape[0])
        xs = src.to_dense(x_src)
        xd = xs if x_dst is x_src and dst.index is src.index else dst.to_dense(x_dst)
        ps = None if src.pos is None else src.to_dense(src.pos)
        if dst.pos is None:
            pd = None
        elif dst.pos is src.pos and dst.index is src.index:
            pd = ps
        else:
            pd = dst.to_dense(dst.pos)
        out = self._dense(xs, xd, ps, pd, src.to_dense(src.weight), src.mask, dst.mask,
                          checked)
        return dst.to_flat(out)

    def dense(self, x: PairOrTensor, pos: PairOrTensor = None, weight: Optional[Tensor] = None,
              mask: PairOrTensor = None, check: bool = True) -> Tensor:
        """Dense form: ``x [B, N, C]`` (or a ``(src, dst)`` pair), ``weight [B, N_src]``,
        ``mask [B, N]`` (or a ``(mask_src, mask_dst)`` pair; True = real point).
        ``check=False`` skips the value checks (weights already validated).

        Returns ``[B, N_dst, out_channels]`` with zeros on padded destination rows.
        """
        cross = is_pair(x)
        s, d = ("_src", "_dst") if cross else ("", "")
        x_src, x_dst = as_pair(x)
        pos_src, pos_dst = as_pair(pos)
        m_src, m_dst = as_pair(mask)
        self._check_x(x_src, self.in_src, "x" + s, 3)
        self._check_x(x_dst, self.in_dst, "x" + d, 3)
        if x_src.shape[0] != x_dst.shape[0]:
            raise ValueError(f"x_src and x_dst have different batch sizes "
                             f"({x_src.shape[0]} and {x_dst.shape[0]})")
        _check_dense_pos(pos_src, x_src, "pos" + s)
        _check_dense_pos(pos_dst, x_dst, "pos" + d)
        m_src = _check_mask(m_src, x_src, "mask" + s)
        m_dst = _check_mask(m_dst, x_dst, "mask" + d)
        if not isinstance(weight, Tensor):
            raise ValueError(f"weight must be a tensor of quadrature weights, got "
                             f"{type(weight)}")
        if weight.shape != x_src.shape[:2]:
            raise ValueError(f"weight has shape {tuple(weight.shape)}, expected "
                             f"{tuple(x_src.shape[:2])}")
        if check:
            check_weight(weight.reshape(-1), weight.numel())
        return self._dense(x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst, check)

    def _dense(self, x_src: Tensor, x_dst: Tensor, pos_src: Optional[Tensor],
               pos_dst: Optional[Tensor], weight: Tensor, m_src: Optional[Tensor],
               m_dst: Optional[Tensor], checked: bool) -> Tensor:
        weight = weight.to(x_src.dtype)
        if m_src is not None:
            # Padding carries no quadrature weight; zero its features too so that
            # garbage (even NaN) in padded slots cannot reach real outputs.
            weight = weight.masked_fill(~m_src, 0)
            x_src = x_src.masked_fill(~m_src.unsqueeze(-1), 0)
            if pos_src is not None:
                pos_src = pos_src.masked_fill(~m_src.unsqueeze(-1), 0)
        out = self._attend(x_src, x_dst, pos_src, pos_dst, weight, m_src, m_dst, checked)
        if m_dst is not None:
            out = out.masked_fill(~m_dst.unsqueeze(-1), 0)
        return out

    def _attend(self, x_src: Tensor, x_dst: Tensor, pos_src: Optional[Tensor],
                pos_dst: Optional[Tensor], weight: Tensor, m_src: Optional[Tensor],
                m_dst: Optional[Tensor], checked: bool) -> Tensor:  # pragma: no cover
        raise NotImplementedError


class LocalAttentionBase(AttentionBase):
    """Attention over the edges of a neighbourhood graph (``k`` nearest sources,
    PiT's ``quantile`` or a ``radius`` ball), flat form only; the dense form flattens.

    A subclass implements ``_edges_attend(x_src, x_dst, pos_src, pos_dst, src, dst,
    weight, n_dst, checked)`` with ``src``/``dst`` the source and destination index of
    every edge.  ``needs_x_dst`` says whether it reads destination features.
    """

    needs_x_dst = True
    dense_layout = False
    flow: str = "source_to_target"
    k: Optional[int] = None
    quantile: Optional[float] = None
    radius: Optional[float] = None

    def graph(self, pos: PairOrTensor, batch: PairOrTensor = None) -> Tensor:
        """The layer's neighbourhood graph ``[2, E]`` in the layer's ``flow`` (PyG's
        default: row 0 source, row 1 destination), to reuse across layers with the
        same neighbourhoods (``forward(..., edge_index=...)``)."""
        from meshops.nn.local import local_graph  # local.py builds on this module

        pos_src, pos_dst = as_pair(pos)
        b_src, b_dst = as_pair(batch)
        return local_graph(pos_src, pos_dst, self.k, self.quantile, b_src, b_dst, self.radius,
                           flow=self.flow)

    def forward(self, x: PairOrTensor, pos: Any, weight: Optional[Tensor] = None,
                batch: Any = None, edge_index: Optional[Tensor] = None) -> Tensor:
        """Flat (PyG) form; see the class docstring.  ``edge_index`` (row 0 source, row 1
        destination as in PyG, e.g. from :meth:`graph`) replaces the neighbour search.
        ``pos`` may be a :class:`Points` pair from :func:`batch_points` (trusted: with
        ``edge_index`` the forward pass then checks no values)."""
        from meshops.nn.local import _dst_src_graph, _src_dst  # local.py imports base

        cross = is_pair(x)
        x_src, x_dst = as_pair(x)
        self._check_x(x_src, self.in_src, "x_src" if cross else "x")
        if self.needs_x_dst:
            self._check_x(x_dst, self.in_dst, "x_dst" if cross else "x")
        trusted = is_points(pos)
        if not trusted:
            for name, p in zip(("pos_src", "pos_dst"), as_pair(pos)):
                if not isinstance(p, Tensor) or p.dim() != 2 or not p.is_floating_point():
                    got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
                    raise ValueError(f"{name} must be a floating [N, d] tensor, got {got}")
        n_dst = as_pair(pos)[1].num_points if trusted else as_pair(pos)[1].shape[0]
        src_pts, dst_pts, checked = self._points(pos, weight, batch, x_src.shape[0], n_dst)
        if self.needs_x_dst and x_dst.shape[0] != n_dst:
            raise ValueError(f"x_dst has {x_dst.shape[0]} rows, expected {n_dst}")
        pos_src, pos_dst = src_pts.pos, dst_pts.pos
        if edge_index is None:
            # the search's own layout, no flip
            dst, src = _dst_src_graph(pos_src, pos_dst, self.k, self.quantile, src_pts.batch,
                                      dst_pts.batch, self.radius)
        else:
            src, dst = _src_dst(edge_index, self.flow, src_pts.num_points, n_dst, checked)
        return self._edges_attend(x_src, x_dst, pos_src, pos_dst, src, dst, src_pts.weight,
                                  n_dst, checked)

    def dense(self, x: PairOrTensor, pos: PairOrTensor, weight: Tensor,
              mask: PairOrTensor = None) -> Tensor:
        """Dense form: ``x [B, N, C]`` (or ``(x_src, x_dst)``; ``x_dst`` may be None for
        position attention), ``pos [N, d]`` (shared) or ``[B, N, d]`` (or a pair),
        ``weight [Ns]`` or ``[B, Ns]``, ``mask [B, N]`` or ``(mask_src, mask_dst)``.
        Padded points are removed (they are neither neighbours nor queries); returns
        ``[B, Nd, out_channels]`` with zeros on padded rows."""
        cross = is_pair(x)
        x_src, x_dst = as_pair(x)
        pos_src, pos_dst = as_pair(pos)
        m_src, m_dst = as_pair(mask)
        if not isinstance(x_src, Tensor) or x_src.dim() != 3:
            raise ValueError("x must be a [B, N, C] tensor")
        B, Ns = x_src.shape[:2]
        if x_dst is not None and (x_dst.dim() != 3 or x_dst.shape[0] != B):
            raise ValueError(f"x_dst must be [{B}, N_dst, C]")
        Nd = pos_dst.shape[-2]
        m_src = dense_mask(m_src, B, Ns, x_src.device, "mask_src" if cross else "mask")
        m_dst = dense_mask(m_dst, B, Nd, x_src.device, "mask_dst" if cross else "mask")
        for name, p, n in (("pos_src", pos_src, Ns), ("pos_dst", pos_dst, Nd)):
            if not isinstance(p, Tensor) or p.dim() not in (2, 3) or p.shape[-2] != n \
                    or (p.dim() == 3 and p.shape[0] != B):
                raise ValueError(f"{name} must be [{n}, d] or [{B}, {n}, d]")
        if not isinstance(weight, Tensor) or weight.shape not in ((Ns,), (B, Ns)):
            raise ValueError(f"weight must be [{Ns}] or [{B}, {Ns}], got "
                             f"{tuple(weight.shape) if isinstance(weight, Tensor) else weight}")
        ar = torch.arange(B, device=x_src.device)
        b_src = ar[:, None].expand(B, Ns)[m_src]
        b_dst = ar[:, None].expand(B, Nd)[m_dst]
        ps = pos_src.expand(B, Ns, pos_src.shape[-1])[m_src]
        pd = pos_dst.expand(B, Nd, pos_dst.shape[-1])[m_dst]
        w = weight.expand(B, Ns)[m_src]
        xd = None if x_dst is None else x_dst[m_dst]
        out = self((x_src[m_src], xd), (ps, pd), w, (b_src, b_dst))
        return scatter_dense(out, m_dst)

    def _edges_attend(self, x_src: Tensor, x_dst: Optional[Tensor], pos_src: Tensor,
                      pos_dst: Tensor, src: Tensor, dst: Tensor, weight: Tensor, n_dst: int,
                      checked: bool) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _repr_extra(self) -> str:
        if self.radius is not None:
            return f", radius={self.radius}"
        return f", quantile={self.quantile}" if self.quantile is not None else f", k={self.k}"


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

