"""A reduced model of whole trajectories on one mesh (:class:`TrajectoryBasis`)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from meshops.mesh.data import MeshData
from meshops.models.base import NeuralOperator, check_positive_int, register_model
from meshops.models.reduced_basis import ReducedBasis

__all__ = ["IDENTITIES", "TrajectoryBasis"]

#: What tells the trajectories apart: their parameter vectors, or (series without
#: parameters) the leading POD coefficients of their first states.
IDENTITIES = ("params", "initial")
#: Two times are the same when they differ by at most this fraction of the time span.
TIME_RTOL = 1e-6


@register_model("trajectory_basis")
class TrajectoryBasis(NeuralOperator):
    r"""Whole trajectories of a family of time series on one mesh: a POD basis of the
    trajectories and a regression of its coefficients on what identifies a trajectory.

    Every training series has the same time steps :math:`t_0 < \dots < t_{T-1}`; its
    states, stacked in time, are one snapshot :math:`U = [u(t_0), \dots, u(t_{T-1})]`
    (``[N, T * C]``), so that

    .. math::
        U(\mu) = \bar U + \sum_{k=1}^{r} c_k(\mu)\, \Phi_k ,

    with the modes :math:`\Phi_k` of the snapshots' POD in the space-time inner
    product :math:`\sum_j \sum_i w_i\, u_i(t_j) \cdot v_i(t_j)` (the mesh's quadrature
    over every step) and :math:`c(\mu)` a regression of the identity :math:`\mu`: a
    :class:`~meshops.models.ReducedBasis` whose output channels are the ``T * C``
    columns of a trajectory (its regression chosen on validation series by
    :func:`meshops.fitting.trajectory_basis.fit_trajectory_basis`). The identity is the
    series' parameter vector (``identity="params"``) or, without parameters, the
    leading POD coefficients of its first state (``identity="initial"``).

    A state between two stored times is interpolated linearly in time; times outside
    ``[t_0, t_{T-1}]`` are refused (the model knows the training horizon only). The
    state a rollout starts from is not used (the trajectory is a function of its
    identity and the time), except as the first state of an ``"initial"`` model.

    Args:
        state_channels: ``C``, the state's channels.
        pos_dim: Spatial dimension.
        times: The ``T`` times of the training series.
        identity: ``"params"`` or ``"initial"``.
        num_params: Parameters per series (``"params"``).
        initial_rank: Coefficients of the first state used (``"initial"``).
        num_points: ``N``, the mesh's points.
        basis: The :class:`~meshops.models.ReducedBasis` configuration (its
            ``out_channels`` is ``T * C``).

    Shapes:
        data: ``x [N, C]`` (the start state), ``cond [B, K, 2 + P]`` (per step ``(t,
        dt, params)``), ``pos``, ``weight``, ``batch``; for ``"initial"`` also
        ``initial [N, C]`` and ``initial_time [B]`` (the series' first state and
        time) unless the rollout starts at ``t_0``  ->  ``[N, K * C]``: the states at
        ``t + dt`` of each step, step-major, as :class:`~meshops.models.NextStep`.
    """

    def __init__(self, state_channels: int, pos_dim: int, times: Sequence[float],
                 identity: str = "params", num_params: int = 0, initial_rank: int = 0,
                 num_points: int = 1, basis: Optional[dict] = None) -> None:
        super().__init__()
        check_positive_int(state_channels, "state_channels")
        check_positive_int(num_points, "num_points")
        if identity not in IDENTITIES:
            raise ValueError(f"identity must be one of {IDENTITIES}, got {identity!r}")
        times = [float(t) for t in times]
        if len(times) < 2 or any(b <= a for a, b in zip(times, times[1:])):
            raise ValueError("times must hold at least two increasing values")
        self.state_channels, self.identity = state_channels, identity
        self.num_params, self.initial_rank = num_params, initial_rank
        self.time_input = True  # the conditions carry t (meshops.training.rollout)
        self.register_buffer("times", torch.tensor(times, dtype=torch.float64))
        f64 = dict(dtype=torch.float64)
        rank = initial_rank if identity == "initial" else 0
        self.register_buffer("initial_mean", torch.zeros(num_points, state_channels, **f64))
        self.register_buffer("initial_modes", torch.zeros(rank, num_points, state_channels,
                                                          **f64))
        config = dict(basis or {})
        config.setdefault("in_channels", 0)
        config.setdefault("out_channels", len(times) * state_channels)
        config.setdefault("pos_dim", pos_dim)
        config.setdefault("num_points", num_points)
        config.setdefault("num_params", max(num_params if identity == "params" else rank, 1))
        if config["out_channels"] != len(times) * state_channels:
            raise ValueError(f"basis out_channels must be T * C = "
                             f"{len(times) * state_channels}, got {config['out_channels']}")
        self.basis = ReducedBasis(**config)

    # ------------------------------------------------------------------ identity
    def initial_coefficients(self, first: Tensor, weight: Tensor) -> Tensor:
        """The identity of a series without parameters: ``<u_0 - mean, phi_k>`` of its
        first state ``[N, C]`` -> ``[initial_rank]``."""
        d = (first.to(torch.float64) - self.initial_mean) * weight.to(torch.float64)[:, None]
        return torch.einsum("nc,rnc->r", d, self.initial_modes)

    def _identities(self, data, cond: Tensor, batch: Tensor) -> Tensor:
        """``[B, P]`` identities of the samples of a batch."""
        if self.identity == "params":
            return cond[:, 0, 2:].to(torch.float64)
        start = cond[:, 0, 0].to(torch.float64)
        first = getattr(data, "initial", None)
        if first is None:  # the rollout starts at t_0: its start state is the first one
            first_time, first = start, data.x
        else:
            first_time = getattr(data, "initial_time", start).reshape(-1).to(torch.float64)
        gap = (first_time - self.times[0]).abs().max()
        if float(gap) > TIME_RTOL * float(self.times[-1] - self.times[0]):
            raise ValueError(f"this trajectory basis tells series apart by their first "
                             f"state at t={float(self.times[0]):g}, but the series starts "
                             f"at t={float(first_time.reshape(-1)[0]):g}")
        return torch.stack([self.initial_coefficients(first[batch == b], data.weight[batch == b])
                            for b in range(cond.shape[0])])

    # ------------------------------------------------------------------- forward
    def time_weights(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Linear interpolation in time: indices ``lo, hi [M]`` of the stored times
        around ``t [M]`` and the weight ``a [M]`` of ``hi``.

        Raises:
            ValueError: a time outside the stored ones, naming it and the range.
        """
        grid, t = self.times, t.to(torch.float64)
        tol = TIME_RTOL * float(grid[-1] - grid[0])
        bad = (t < grid[0] - tol) | (t > grid[-1] + tol)
        if bool(bad.any()):
            raise ValueError(f"time {float(t[bad][0]):g} is outside the times of the training "
                             f"series ({float(grid[0]):g} to {float(grid[-1]):g}); a "
                             f"trajectory basis predicts within them only (a next-step model, "
                             f"--model pit, rolls out past them)")
        t = t.clamp(grid[0], grid[-1])
        hi = torch.searchsorted(grid, t).clamp(1, grid.numel() - 1)
        lo = hi - 1
        a = ((t - grid[lo]) / (grid[hi] - grid[lo])).clamp(0, 1)
        return lo, hi, a

    def forward(self, data) -> Tensor:
        cond = getattr(data, "cond", None)
        if cond is None or cond.dim() != 3 or cond.shape[2] != 2 + self.num_params:
            shape = None if cond is None else tuple(cond.shape)
            raise ValueError(f"data.cond must be [B, K, {2 + self.num_params}] (per step t, dt "
                             f"and {self.num_params} parameters), got {shape}")
        batch = getattr(data, "batch", None)
        n = data.pos.shape[0]
        if batch is None:
            batch = torch.zeros(n, dtype=torch.long, device=data.pos.device)
        # 1. Each sample's identity -> its whole trajectory [N, T, C].
        ids = self._identities(data, cond, batch)
        c = self.state_channels
        query = MeshData(pos=data.pos, weight=data.weight, batch=batch,
                         x=data.pos.new_zeros(n, 0), params=ids, num_graphs=cond.shape[0])
        traj = self.basis(query).to(torch.float64).reshape(n, -1, c)
        # 2. The states at the end of each step, t + dt, interpolated in time.
        t_end = (cond[:, :, 0] + cond[:, :, 1]).to(torch.float64)  # [B, K]
        lo, hi, a = self.time_weights(t_end.reshape(-1))
        k = cond.shape[1]
        lo, hi, a = lo.view(-1, k)[batch], hi.view(-1, k)[batch], a.view(-1, k)[batch]
        rows = torch.arange(n, device=traj.device)[:, None]
        out = (1 - a)[..., None] * traj[rows, lo] + a[..., None] * traj[rows, hi]
        return out.reshape(n, k * c).to(data.pos.dtype)

    def extra_repr(self) -> str:
        return (f"steps={self.times.numel()}, state_channels={self.state_channels}, "
                f"identity={self.identity!r}")
