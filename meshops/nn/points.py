"""The point sets layers trust: :class:`Points` and :func:`batch_points`, which builds
them (public).

A :class:`Points` is one mesh, or a flat PyG batch of meshes, checked once when it is
built: positions, quadrature weights (sources), the sorted batch vector and the sizes
of the samples, with the flat ``[N, C]`` <-> dense ``[B, N_max, C]`` maps.  Layers
given a :class:`Points` check nothing that reads tensor values, so a forward pass on
them does no host synchronisation and compiles with ``torch.compile(fullgraph=True)``.
The value checks run when :func:`meshops.utils.checks.checking` says so (eager calls, not
while ``torch.compile`` traces); given ``num_graphs`` and ``max_points``,
:func:`batch_points` reads no tensor value at all.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
from torch import Tensor

from meshops.nn._utils import as_pair
from meshops.utils.checks import check_batch, check_length, check_pos, check_weight

__all__ = ["Points", "batch_points", "is_pair", "is_points"]


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
        num_points: ``N`` (a Python int).
        num_graphs: number of samples ``B`` (a Python int).
        max_points: ``N_max``, the most points of a sample (a Python int; ``-1`` when
            built without the dense layout).
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
    if batch is None or size == 1:
        # one sample has no padding: its dense form is a view (``x[None]``), with no
        # index copies and no masks for the layers to apply
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


def _checked_sides(pos_src, pos_dst, b_src, b_dst, n_src, n_dst, weight,
                   suffixes: tuple[str, str], prefix: str) -> tuple:
    """:func:`batch_points`' checks of both sides: ``(n_src, n_dst, batch_src,
    batch_dst)``, the counts from the positions where not given, the batch vectors
    checked (and made, where None); each error names its array."""
    s, d = suffixes
    if n_src is None and pos_src is None:
        raise ValueError("give pos or num_points")
    n_src = pos_src.shape[0] if n_src is None else n_src
    n_dst = pos_dst.shape[0] if n_dst is None else n_dst
    if pos_src is not None and pos_dst is not None and pos_src.shape[-1] != pos_dst.shape[-1]:
        raise ValueError(f"pos_src and pos_dst have different dimensions "
                         f"({pos_src.shape[-1]} and {pos_dst.shape[-1]})")
    for p, n, name in ((pos_src, n_src, "pos" + s), (pos_dst, n_dst, "pos" + d)):
        if p is not None:
            check_pos(p, prefix + name, n=n)
    if (b_src is None) != (b_dst is None):
        raise ValueError("batch_src and batch_dst must both be given or both be None")
    check_length(b_src, n_src, prefix + "batch" + s)
    check_length(b_dst, n_dst, prefix + "batch" + d)
    same = b_dst is b_src
    b_src = check_batch(b_src, n_src, prefix + "batch" + s)
    b_dst = b_src if same else check_batch(b_dst, n_dst, prefix + "batch" + d)
    if weight is not None:
        check_weight(weight, n_src, prefix + "weight")
    return n_src, n_dst, b_src, b_dst


def batch_points(pos: Any, weight: Optional[Tensor], batch: Any = None,
                 num_points: Any = None, dense: bool = True, num_graphs: Optional[int] = None,
                 max_points: Any = None, prefix: str = ""
                 ) -> Union[Points, Tuple[Points, Points]]:
    """Validate a flat point set once and return the :class:`Points` layers trust.

    Args:
        pos: ``[N, d]`` positions, or a ``(pos_src, pos_dst)`` pair (either may be None
            for layers that do not use positions).
        weight: source quadrature weights ``[N_src]`` (finite, non-negative), or None.
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
        prefix: put before the arrays' names in messages (``"data."``: ``data.batch``).

    Returns:
        :class:`Points` (one tensor given) or a ``(src, dst)`` pair of them sharing
        ``num_graphs``.

    Raises:
        ValueError (:class:`meshops.errors.MeshError`): naming the array: wrong shapes
            or lengths, an unsorted batch, weights that are negative or not finite.
    """
    cross = is_pair(pos) or is_pair(batch) or is_pair(num_points)
    s, d = ("_src", "_dst") if cross else ("", "")
    pos_src, pos_dst = as_pair(pos)
    b_src, b_dst = as_pair(batch)
    n_src, n_dst = as_pair(num_points)
    n_src, n_dst, b_src, b_dst = _checked_sides(pos_src, pos_dst, b_src, b_dst, n_src, n_dst,
                                                weight, (s, d), prefix)
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
