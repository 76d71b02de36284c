"""k-nearest-neighbour and radius search with PyG / torch_cluster conventions."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from meshops.errors import MeshError
from meshops.search.backends import get_backend, resolve_backend
from meshops.utils.checks import (
    check_batch,
    check_int,
    check_pos,
    check_real,
    check_same_dim,
    num_samples,
    sample_ptr,
)


def _prepare(x: Tensor, y: Tensor, batch_x: Optional[Tensor], batch_y: Optional[Tensor],
             fn: str) -> tuple[list[int], list[int]]:
    check_pos(x, "x", fn, finite=True)
    check_pos(y, "y", fn, finite=True)
    check_same_dim(x, y, fn)
    bx = check_batch(batch_x, x.shape[0], "batch_x", fn, x.device)
    by = check_batch(batch_y, y.shape[0], "batch_y", fn, y.device)
    b = num_samples(bx, by)
    return sample_ptr(bx, x.shape[0], b), sample_ptr(by, y.shape[0], b)


def knn(x: Tensor, y: Tensor, k: int, batch_x: Optional[Tensor] = None,
        batch_y: Optional[Tensor] = None, *, backend: Optional[str] = None) -> Tensor:
    """For every point of ``y``, its ``k`` nearest points in ``x`` (Euclidean).

    Same signature and output layout as ``torch_cluster.knn`` /
    ``torch_geometric.nn.knn``: row 0 indexes ``y``, row 1 indexes ``x``; edges are
    ordered by ``y`` index, then by increasing distance (equal distances in any
    order). Neighbours never cross samples of the batch.

    Args:
        x: Candidate points.
        y: Query points (may be ``x`` itself; each point is then its own nearest
            neighbour).
        k: Number of neighbours, ``1 <= k <=`` the number of points of ``x`` in every
            sample that has queries.
        batch_x: Sorted sample index of ``x`` (PyG batch vector), or None for one sample.
        batch_y: Sorted sample index of ``y``, or None for one sample.
        backend: ``"scipy"``, ``"torch"``, ``"torch_cluster"`` or None for
            :func:`~meshops.search.default_backend` ``("knn", x.device)``.

    Returns:
        LongTensor ``[2, M * k]`` of ``(y index, x index)`` pairs on ``y.device``.

    Raises:
        MeshError: Non-tensor, non-2-D, integer or non-finite points; different ``d``
            or devices; a batch vector of wrong length, dtype or order; ``k < 1``; ``k``
            larger than the candidates of a sample (the message names the sample and
            its number of points); an unknown or unavailable backend.

    Shapes:
        - x: ``[N, d]``, y: ``[M, d]`` (floating, finite)
        - batch_x: ``[N]``, batch_y: ``[M]`` (integer, sorted)
        - output: ``[2, M * k]``

    Example:
        >>> edge = knn(pos, pos, 16, batch, batch)   # kNN graph, self loops included
    """
    fn = "knn"
    ptr_x, ptr_y = _prepare(x, y, batch_x, batch_y, fn)
    k = check_int(k, "k", fn, minimum=1)
    for b in range(len(ptr_y) - 1):
        n_cand = ptr_x[b + 1] - ptr_x[b]
        if ptr_y[b + 1] > ptr_y[b] and k > n_cand:
            raise MeshError(f"{fn}: k={k} exceeds the number of candidate points: "
                            f"sample {b} of x has {n_cand} points")
    name = resolve_backend("knn", backend, x.device, fn)
    return get_backend(name).knn(x, y, k, ptr_x, ptr_y)


def radius(x: Tensor, y: Tensor, r: float, batch_x: Optional[Tensor] = None,
           batch_y: Optional[Tensor] = None, max_num_neighbors: int = 32, *,
           backend: Optional[str] = None) -> Tensor:
    """For every point of ``y``, the points of ``x`` within distance ``r`` (inclusive).

    Same signature and layout as ``torch_cluster.radius``: row 0 indexes ``y``, row 1
    indexes ``x``; edges are ordered by ``y`` index, then by increasing distance.
    When more than ``max_num_neighbors`` points lie within ``r``, the **nearest**
    ``max_num_neighbors`` are returned (torch_cluster returns an arbitrary subset; the
    deterministic choice makes all backends agree, ties at the cut aside). A point
    at distance exactly ``r`` is included. Neighbours never cross samples.

    Args:
        x: Candidate points.
        y: Query points (may be ``x``; each point then finds itself at distance 0).
        r: Radius, finite and ``>= 0``.
        batch_x: Sorted sample index of ``x``, or None for one sample.
        batch_y: Sorted sample index of ``y``, or None for one sample.
        max_num_neighbors: Maximum number of neighbours per query point (``>= 1``).
        backend: ``"scipy"``, ``"torch"``, ``"torch_cluster"`` or None for the default.

    Returns:
        LongTensor ``[2, E]`` of ``(y index, x index)`` pairs on ``y.device``.

    Raises:
        MeshError: The input errors of :func:`knn`; ``r`` negative or not finite;
            ``max_num_neighbors < 1``.

    Shapes:
        - x: ``[N, d]``, y: ``[M, d]``
        - batch_x: ``[N]``, batch_y: ``[M]``
        - output: ``[2, E]`` with ``E <= M * max_num_neighbors``
    """
    fn = "radius"
    ptr_x, ptr_y = _prepare(x, y, batch_x, batch_y, fn)
    r = check_real(r, "r", fn)
    if r < 0:
        raise MeshError(f"{fn}: r must be >= 0, got {r}")
    max_num_neighbors = check_int(max_num_neighbors, "max_num_neighbors", fn, minimum=1)
    name = resolve_backend("radius", backend, x.device, fn)
    return get_backend(name).radius(x, y, r, max_num_neighbors, ptr_x, ptr_y)
