"""Parameter-free interpolation of point features to other points (:func:`knn_interpolate`)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from meshops.search import graph  # called through it: tests replace the search there

__all__ = ["knn_interpolate"]


def knn_interpolate(h: Tensor, pos_src: Tensor, pos_dst: Tensor, batch_src: Optional[Tensor],
                    batch_dst: Optional[Tensor], k: int = 4, power: float = 2.0, *,
                    weights: Optional[tuple[Tensor, Tensor]] = None) -> Tensor:
    r"""Inverse-distance interpolation of point features to other points.

    .. math::
        h(y) = \frac{\sum_{j \in \mathrm{kNN}(y)} d_j^{-p}\, h_j}
                    {\sum_{j \in \mathrm{kNN}(y)} d_j^{-p}},
        \qquad d_j = |y - x_j|,

    over the ``k`` nearest source points of the same sample
    (:func:`meshops.search.knn_interpolation_weights`). Parameter free; continuous in
    ``y``; *exact* at a source point (``d = 0`` takes that point's value), so querying
    the source points themselves reproduces ``h``. As the source mesh is refined the
    interpolant of a continuous field converges to it.

    Args:
        h: features of the source points.
        pos_src, pos_dst: source and destination points.
        batch_src, batch_dst: sorted sample index of each, or None (one sample).
        k: neighbours per destination point (at most the points of the smallest sample).
        power: exponent ``p`` of the inverse distance.
        weights: ``(src, w)`` from :func:`~meshops.search.knn_interpolation_weights` for
            these points (e.g. computed once per mesh); then no search is done and the
            positions are not read.

    Shapes:
        h ``[N, C]``, pos_src ``[N, d]``, pos_dst ``[M, d]``, batches ``[N]``/``[M]``
        or None, weights ``([M, k], [M, k])`` -> ``[M, C]``
    """
    if weights is None:
        weights = graph.knn_interpolation_weights(pos_src, pos_dst, batch_src, batch_dst, k,
                                                  power)
    src, w = weights
    if src.shape[0] == 0:
        return h.new_zeros(0, h.shape[-1])
    return (w.to(h.dtype).unsqueeze(-1) * h[src]).sum(1)
