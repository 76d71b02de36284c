"""Weighted sums over the edges of a graph without one message per edge.

The local layers end with ``out_i = sum_{e: dst_e = i} alpha_e v_{src_e}`` per head.
Written as ``scatter(alpha[:, :, None] * v[src], dst)`` it materialises an
``[E, H, c]`` message tensor: with PiT's balls (k ~ 1000 neighbours of 2k latent
points) that is 2M x 64 floats, and gathering it costs most of the layer. It is a
sparse-matrix product ``A_h @ v_h`` with ``A_h[dst_e, src_e] = alpha_e[h]``, which
:func:`torch.sparse.mm` on a CSR matrix computes without the messages.

The backward pass forms no messages either:

* ``dv_h = A_h^T @ grad_h`` is the same product with the CSR matrix of the
  transpose (edges ordered by source: one counting pass over the edges, shared by
  all heads);
* ``dalpha[e, h] = <grad[dst_e, h], v[src_e, h]>`` is the product ``grad_h @ v_h^T``
  sampled on the edges (SDDMM, :func:`torch.sparse.sampled_addmm`).

Both are sparse kernels over the E edges with ``c`` channels each, like the forward
pass, so the backward costs about two forward passes (``benchmarks/edge_sum.py``).
"""

from __future__ import annotations

import warnings
from typing import Optional, Tuple

import numpy as np
import scipy.sparse
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def _csr_rows(dst: Tensor, n_dst: int) -> Tensor:
    crow = torch.zeros(n_dst + 1, dtype=torch.long, device=dst.device)
    crow[1:] = torch.bincount(dst, minlength=n_dst).cumsum(0)
    return crow


def _csr(crow: Tensor, col: Tensor, values: Tensor, shape) -> Tensor:
    return torch.sparse_csr_tensor(crow, col, values, shape, dtype=values.dtype,
                                   device=values.device)


def _spmm_into(out: Tensor, crow: Tensor, col: Tensor, values: Tensor, dense: Tensor) -> None:
    """``out = A @ dense`` for the CSR matrix ``A`` (``[out rows, dense rows]``), written
    in place: ``torch.sparse.mm`` would zero a new result and copy it (as long as the
    product itself)."""
    a = _csr(crow, col, values, (out.shape[0], dense.shape[0]))
    torch.addmm(out, a, dense, beta=0.0, out=out)


def _sddmm(crow: Tensor, col: Tensor, left: Tensor, right: Tensor) -> Tensor:
    """``(left @ right^T)[row_e, col_e]`` on the edges of the CSR pattern, ``[E]``."""
    # beta=0 still reads the pattern's values (0 * NaN is NaN): give it zeros
    pattern = _csr(crow, col, left.new_zeros(col.shape[0]), (left.shape[0], right.shape[0]))
    return torch.sparse.sampled_addmm(pattern, left, right.t(), beta=0.0).values()


def _transpose_scipy(crow: Tensor, col: Tensor, n_src: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The transpose's CSR structure (CPU): row pointers over the sources, the
    destination of each entry, and the permutation of the edges into that order (the
    edges of one source in destination order)."""
    # scipy's CSR -> CSC is one counting pass over the edges; sorting the E edges by
    # source (torch.sort) takes 10-20x longer on CPU, as long as the whole backward
    m = scipy.sparse.csr_matrix((np.arange(col.shape[0], dtype=np.int64), col.numpy(),
                                 crow.numpy()), shape=(crow.shape[0] - 1, n_src)).tocsc()
    return (torch.from_numpy(m.indptr).long(), torch.from_numpy(m.indices).long(),
            torch.from_numpy(m.data).long())


def _transpose_sort(crow: Tensor, col: Tensor, n_src: int) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`_transpose_scipy` for tensors on any device, by a stable sort."""
    perm = torch.argsort(col, stable=True)
    rows = torch.repeat_interleave(torch.arange(crow.shape[0] - 1, device=col.device),
                                   crow.diff(), output_size=col.shape[0])
    return _csr_rows(col, n_src), rows[perm], perm


class _EdgeSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, alpha: Tensor, v: Tensor, dst: Tensor, src: Tensor, n_dst: int) -> Tensor:
        E, H = alpha.shape
        order: Optional[Tensor] = None
        if E > 1 and not bool((dst[1:] >= dst[:-1]).all()):
            order = torch.argsort(dst, stable=True)
            dst, src, alpha = dst[order], src[order], alpha[order]
        crow = _csr_rows(dst, n_dst)
        out = v.new_empty(n_dst, H, v.shape[-1])
        with warnings.catch_warnings():
            # "Sparse CSR tensor support is in beta": the products we use are long stable
            warnings.simplefilter("ignore", UserWarning)
            for h in range(H):
                _spmm_into(out[:, h], crow, src, alpha[:, h].contiguous(), v[:, h].contiguous())
        ctx.order = order
        ctx.save_for_backward(alpha, v, crow, src)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        alpha, v, crow, src = ctx.saved_tensors
        H = grad.shape[1]
        g_alpha = g_v = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if ctx.needs_input_grad[0]:
                g_alpha = grad.new_empty(src.shape[0], H)
                for h in range(H):
                    g_alpha[:, h] = _sddmm(crow, src, grad[:, h].contiguous(),
                                           v[:, h].contiguous())
                if ctx.order is not None:
                    g_alpha = torch.empty_like(g_alpha).index_copy_(0, ctx.order, g_alpha)
            if ctx.needs_input_grad[1]:
                transpose = _transpose_scipy if src.device.type == "cpu" else _transpose_sort
                t_crow, t_col, perm = transpose(crow, src, v.shape[0])
                t_alpha = alpha[perm]
                g_v = grad.new_empty(v.shape)
                for h in range(H):
                    _spmm_into(g_v[:, h], t_crow, t_col, t_alpha[:, h].contiguous(),
                               grad[:, h].contiguous())
        return g_alpha, g_v, None, None, None


def edge_sum(alpha: Tensor, v: Tensor, dst: Tensor, src: Tensor, n_dst: int) -> Tensor:
    """``out[i, h] = sum_{e: dst[e] = i} alpha[e, h] * v[src[e], h]``.

    Differentiable in ``alpha`` and ``v`` (once). Edges may come in any order.
    Half precision (which sparse kernels do not all take) and :func:`torch.compile`
    go through the plain gather-and-scatter form.

    Shapes:
        alpha ``[E, H]``, v ``[N_src, H, c]``, dst/src ``[E]`` -> ``[n_dst, H, c]``
    """
    if v.dtype not in (torch.float32, torch.float64) or alpha.dtype != v.dtype \
            or torch.compiler.is_compiling():
        # torch.compile cannot trace the sparse kernels (nor their host-side sorting):
        # the compiler fuses this gather-and-scatter form instead.
        out = v.new_zeros(n_dst, v.shape[1], v.shape[2])
        return out.index_add(0, dst, alpha.unsqueeze(-1).to(v.dtype) * v[src])
    return _EdgeSum.apply(alpha, v, dst, src, n_dst)
