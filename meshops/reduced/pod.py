"""Proper orthogonal decomposition in a mesh's quadrature inner product.

Snapshots ``y_s`` (fields on one set of points) are centred on their mean and
decomposed in the inner product the error metric uses,
``<u, v> = sum_i w_i u_i . v_i`` (``w`` the quadrature weights, all channels of a
point sharing its weight): the SVD of ``(Y - mean) W^{1/2}`` gives modes ``phi_k``
orthonormal in that inner product, so a field's weighted L2 norm is the Euclidean
norm of its modal coefficients ``c_k = <y - mean, phi_k>``. The rank is the smallest
``r`` whose discarded energy ``sum_{k > r} sigma_k^2 / sum_k sigma_k^2`` is at most
``tol`` (the relative projection error of the training snapshots is then at most
``sqrt(tol)`` in the mean-square sense).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: Default discarded energy: the modes keep all but 1e-10 of the snapshots' variance
#: (a relative projection error of 1e-5), far below any regression error seen.
ENERGY_TOL = 1e-10


@dataclass
class PODBasis:
    """A reduced basis: ``mean [M, C]``, ``modes [r, M, C]`` (orthonormal in the
    weighted inner product), ``singular_values [min(S, M C)]`` of all snapshots, and
    ``captured``, the fraction of the centred snapshots' energy the ``r`` modes keep."""

    mean: Tensor
    modes: Tensor
    singular_values: Tensor
    captured: float

    @property
    def rank(self) -> int:
        return int(self.modes.shape[0])

    def coefficients(self, y: Tensor, weight: Tensor) -> Tensor:
        """Modal coefficients ``<y - mean, phi_k>`` of fields ``y [S, M, C]`` -> ``[S, r]``."""
        d = (y.to(self.mean.dtype) - self.mean) * weight.to(self.mean.dtype)[:, None]
        return torch.einsum("smc,rmc->sr", d, self.modes)

    def expand(self, coefficients: Tensor) -> Tensor:
        """Fields ``mean + sum_k c_k phi_k``: ``[S, r] -> [S, M, C]``."""
        return self.mean + torch.einsum("sr,rmc->smc", coefficients.to(self.modes.dtype),
                                        self.modes)

    def describe(self) -> str:
        return (f"{self.rank} POD mode(s), {100 * self.captured:.8g} % of the training "
                f"snapshots' energy")


def pod_basis(y: Tensor, weight: Tensor, tol: float = ENERGY_TOL,
              max_rank: int | None = None) -> PODBasis:
    """The weighted POD of snapshots ``y`` (see the module docstring), in float64.

    Args:
        y: Snapshots ``[S, M, C]`` (``S`` samples of ``C`` channels at ``M`` points).
        weight: Quadrature weights ``[M]`` (positive).
        tol: Largest discarded energy fraction.
        max_rank: Upper bound on the rank (default: no bound but the data's).

    Raises:
        ValueError: Fewer than 2 snapshots, weights of the wrong size or not positive,
            non-finite values.

    Shapes:
        y ``[S, M, C]``, weight ``[M]`` -> mean ``[M, C]``, modes ``[r, M, C]``
    """
    if y.dim() != 3 or y.shape[0] < 2:
        raise ValueError(f"pod_basis: need snapshots [S >= 2, M, C], got {tuple(y.shape)}")
    if weight.shape != (y.shape[1],) or not bool((weight > 0).all()):
        raise ValueError(f"pod_basis: need {y.shape[1]} positive weights, got "
                         f"{tuple(weight.shape)}" + ("" if weight.shape != (y.shape[1],)
                                                     else " with some <= 0"))
    if not (0 <= tol < 1):
        raise ValueError(f"pod_basis: tol must be in [0, 1), got {tol}")
    y = y.to(torch.float64)
    if not bool(torch.isfinite(y).all()):
        raise ValueError("pod_basis: the snapshots have non-finite values")
    s, m, c = y.shape
    mean = y.mean(0)
    sqrt_w = weight.to(torch.float64).sqrt()[:, None]
    scaled = ((y - mean) * sqrt_w).reshape(s, m * c)
    _, sv, vt = torch.linalg.svd(scaled, full_matrices=False)
    energy = sv.square()
    total = float(energy.sum())
    if total == 0.0:  # every snapshot the same: the mean is the whole answer
        return PODBasis(mean, y.new_zeros(0, m, c), sv, 1.0)
    discarded = 1.0 - torch.cumsum(energy, 0) / total
    rank = int((discarded > tol).sum()) + 1
    rank = min(rank, int((sv > sv[0] * 1e-12).sum()), max_rank or rank)
    modes = (vt[:rank].reshape(rank, m, c) / sqrt_w)
    return PODBasis(mean, modes, sv, float(energy[:rank].sum()) / total)
