"""Moving fields from a reference mesh to other points of the same geometry.

A reduced basis lives on the mesh it was computed on. On another mesh of the same
domain (a refined copy, another export) its modes are evaluated by **moving least
squares**: at a point ``y``, the quadratic polynomial in ``x - y`` fitted to the ``k``
nearest reference values with weights ``theta_j = 1 / (d_j^2 + eps h^2)`` (``d_j``
the distances, ``h`` the farthest neighbour's) gives the value, its constant term.
The rule reproduces quadratic fields exactly, so it is third-order accurate on smooth
fields (linear MLS, ``degree=1``, is second order like P1 interpolation), needs no
cells (point clouds work), and a point on a reference node takes that node's value.
"""

from __future__ import annotations

import torch
from torch import Tensor

from meshops.search import knn

#: Relative regularisation of the inverse-square weights.
_EPS = 1e-6


def _monomials(rel: Tensor, degree: int) -> Tensor:
    """``[..., d] -> [..., P]``: 1, the coordinates and, for degree 2, their products."""
    cols = [torch.ones_like(rel[..., :1]), rel]
    if degree == 2:
        d = rel.shape[-1]
        cols += [rel[..., i:i + 1] * rel[..., j:j + 1] for i in range(d) for j in range(i, d)]
    return torch.cat(cols, -1)


def mls_weights(src: Tensor, dst: Tensor, k: int | None = None, degree: int = 2
                ) -> tuple[Tensor, Tensor]:
    """Indices and weights of the moving-least-squares values at ``dst``.

    ``value(y_i) = sum_j w[i, j] f(src[idx[i, j]])``, exact for every polynomial ``f`` of
    degree ``degree`` (1 or 2).

    Args:
        src: Reference points.
        dst: Where the values are wanted.
        k: Neighbours per point (default twice the polynomial's coefficients: 12 in 2-D
            and 20 in 3-D for degree 2).
        degree: Of the local polynomial: 2 (default, third-order accurate on smooth
            fields) or 1 (second order, a smaller stencil).

    Shapes:
        src ``[N, d]``, dst ``[M, d]`` -> ``(idx [M, k], w [M, k])``
    """
    d = src.shape[1]
    terms = _monomials(src.new_zeros(1, d), degree).shape[-1]
    k = min(k or 2 * terms, src.shape[0])
    src64, dst64 = src.to(torch.float64), dst.to(torch.float64)
    edge = knn(src64, dst64, k)
    idx = edge[1].reshape(-1, k)
    rel = src64[idx] - dst64[:, None]                                  # [M, k, d]
    dist2 = rel.square().sum(-1)                                        # [M, k]
    h2 = dist2.max(1, keepdim=True).values.clamp_min(torch.finfo(torch.float64).tiny)
    theta = 1.0 / (dist2 + _EPS * h2)
    # Coordinates relative to the stencil's size keep the normal equations scaled.
    basis = _monomials(rel / h2.sqrt()[..., None], degree)              # [M, k, P]
    gram = torch.einsum("mk,mki,mkj->mij", theta, basis, basis)         # [M, P, P]
    e1 = torch.zeros(gram.shape[0], terms, 1, dtype=gram.dtype)
    e1[:, 0] = 1.0
    # Least-squares solve: a degenerate neighbourhood (collinear points in 2-D) falls
    # back to the minimum-norm solution instead of failing.
    coef = torch.linalg.lstsq(gram, e1).solution                        # [M, P, 1]
    w = theta * (basis @ coef)[..., 0]                                  # [M, k]
    # On a reference node: that node's value, exactly.
    on_node = dist2[:, 0] <= (1e-12 * h2[:, 0])
    if bool(on_node.any()):
        w[on_node] = 0.0
        w[on_node, 0] = 1.0
    return idx, w.to(dst.dtype)


def transfer(values: Tensor, idx: Tensor, w: Tensor) -> Tensor:
    """Apply :func:`mls_weights`: ``values [..., N, C] -> [..., M, C]``."""
    return torch.einsum("mk,...mkc->...mc", w.to(values.dtype), values[..., idx, :])
