"""Thin-plate-spline interpolation (:class:`ThinPlateSpline`), in torch.

The interpolant of scipy's ``RBFInterpolator(kernel="thin_plate_spline")`` (no
smoothing, a degree-1 polynomial tail):

.. math::
    f(x) = \\sum_i a_i\\, \\varphi(|x - x_i|) + b_0 + b^\\top x,
    \\qquad \\varphi(r) = r^2 \\log r,

with ``a`` and ``b`` solving ``[[K, P], [P^T, 0]] [a; b] = [y; 0]`` (``K_ij =
phi(|x_i - x_j|)``, ``P = [1, x]``): it passes through every training value and
reproduces linear functions exactly. Written in torch so that a model holding one
saves, loads and exports like any other module; the tests check it against scipy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from meshops.reduced.kernel import KernelRegression


def _tps(r: Tensor) -> Tensor:
    return torch.where(r > 0, r.square() * torch.log(r.clamp_min(1e-300)), torch.zeros_like(r))


class ThinPlateSpline(KernelRegression):
    """Thin-plate-spline interpolation from ``D`` inputs to ``R`` outputs (arguments and
    shapes: :class:`~meshops.reduced.kernel.KernelRegression`)."""

    def __init__(self, num_points: int, in_channels: int, out_channels: int) -> None:
        super().__init__(num_points, in_channels, out_channels)
        self.register_buffer("a", torch.zeros(num_points, out_channels, dtype=torch.float64))
        self.register_buffer("b", torch.zeros(in_channels + 1, out_channels, dtype=torch.float64))

    def fit(self, x: Tensor, y: Tensor) -> "ThinPlateSpline":
        """Solve for the interpolant through ``(x, y)``.

        Raises:
            ValueError: Fewer than ``D + 2`` points, or points that do not determine
                the interpolant (repeated points, all points on one hyperplane).

        Shapes:
            x ``[S, D]``, y ``[S, R]``
        """
        x, y = x.to(torch.float64), y.to(torch.float64)
        s, d = x.shape
        if s < d + 2:
            raise ValueError(f"thin-plate spline: {s} points cannot determine an interpolant "
                             f"in {d} dimension(s) (need at least {d + 2})")
        k = _tps(torch.cdist(x, x))
        p = torch.cat([x.new_ones(s, 1), x], 1)
        a = torch.cat([torch.cat([k, p], 1),
                       torch.cat([p.T, x.new_zeros(d + 1, d + 1)], 1)], 0)
        rhs = torch.cat([y, y.new_zeros(d + 1, y.shape[1])], 0)
        sol, info = torch.linalg.solve_ex(a, rhs)
        # A singular system (repeated or affinely dependent points) can also "solve" to
        # garbage without a zero pivot: check the residual.
        res = (a @ sol - rhs).abs().max() if not int(info) else torch.tensor(float("inf"))
        if int(info) or not bool(torch.isfinite(sol).all()) or \
                float(res) > 1e-6 * max(float(y.abs().max()), 1e-300):
            raise ValueError("thin-plate spline: the points do not determine an interpolant "
                             "(repeated parameter vectors, or all on one hyperplane)")
        self.inputs.copy_(x)
        self.a.copy_(sol[:s])
        self.b.copy_(sol[s:])
        return self

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(torch.float64)
        k = _tps(torch.cdist(x, self.inputs))
        return k @ self.a + self.b[0] + x @ self.b[1:]
