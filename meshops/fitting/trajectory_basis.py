"""Fitting a :class:`~meshops.models.trajectory_basis.TrajectoryBasis`: time series on
one mesh as a parametric study whose samples are whole trajectories.

1. :func:`trajectory_applies` says whether the series allow it: one mesh, the same
   time steps in every series, no input fields, and something that tells the
   trajectories apart (parameters, or first states that differ).
2. Each series becomes one sample (:func:`trajectory_samples`): ``y [N, T * C]``, its
   states stacked in time, and ``params [1, P]``, its identity.
3. :func:`meshops.fitting.reduced_basis.fit_reduced_basis` fits the POD basis and chooses the
   regression of its coefficients on the validation series, scored by the metric of a
   rollout (:func:`rollout_errors`: the relative L2 error of each predicted step, the
   first state left out, averaged over the steps), and refits it on every series.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from meshops.mesh.data import MeshData
from meshops.reduced.pod import pod_basis

__all__ = ["fit_trajectory_basis", "rollout_errors", "same_times", "trajectory_applies",
           "trajectory_samples"]

#: The first states' POD keeps at most this many coefficients as a series' identity
#: (without parameters), and the modes holding all but this fraction of their energy.
INITIAL_MAX_RANK = 8
INITIAL_ENERGY_TOL = 1e-8
#: The snapshots and modes may take at most this fraction of the available memory.
MEMORY_SHARE = 0.25


def same_times(series: Sequence) -> Tensor | None:
    """The common times ``[T]`` of the series, or None when they differ."""
    t0 = series[0].times.to(torch.float64)
    span = float(t0[-1] - t0[0]) if t0.numel() > 1 else 0.0
    for s in series[1:]:
        t = s.times.to(torch.float64)
        if t.shape != t0.shape or float((t - t0).abs().max()) > 1e-6 * max(span, 1e-300):
            return None
    return t0


def _on_one_mesh(series: Sequence) -> bool:
    from meshops.runs.horizon import same_points

    return all(same_points(series[0], s) for s in series[1:])


def trajectory_applies(train: Sequence, val: Sequence, inputs: Sequence[str]) -> str | None:
    """Why a trajectory basis does not apply to these series, or None when it does."""
    import psutil

    every = list(train) + list(val)
    if not val:
        return "no validation series to choose on"
    if inputs:
        return "input fields given at every step (a forcing the basis cannot see)"
    if not _on_one_mesh(every):
        return "the series are on different meshes"
    if same_times(every) is None:
        return "the series have different time steps"
    if len(every[0]) < 2:
        return "the series have one time step"
    s = every[0]
    # float64 snapshots [S, N * T * C], their centred copy and up to S modes
    per_series = len(s) * sum(v[0].numel() for v in s.fields.values())
    need = 8 * per_series * 3 * len(every)
    if need > MEMORY_SHARE * psutil.virtual_memory().available:
        return (f"the trajectories' snapshots and modes would take {need / 2 ** 30:.1f} GiB, "
                f"more than {MEMORY_SHARE:.0%} of the available memory")
    return None


def initial_basis(series: Sequence, targets: Sequence[str]):
    """The POD of the series' first states (the identity of series without
    parameters), or None when they are all the same."""
    first = torch.stack([s.channels(targets)[0] for s in series])
    basis = pod_basis(first, series[0].mesh.weight.to(torch.float64), tol=INITIAL_ENERGY_TOL,
                      max_rank=INITIAL_MAX_RANK)
    return basis if basis.rank else None


def trajectory_samples(series: Sequence, targets: Sequence[str], first=None
                       ) -> list[MeshData]:
    """One sample per series: ``y [N, T * C]`` (its states, step-major), ``x [N, 0]``
    and ``params [1, P]``: its parameters, or with ``first`` (the first states' POD,
    :func:`initial_basis`) the coefficients of its first state."""
    out = []
    for s in series:
        u = s.channels(targets)  # [T, N, C]
        w = s.mesh.weight.to(torch.float64)
        if first is None:
            ident = s.params.to(torch.float64).reshape(1, -1)
        else:
            ident = first.coefficients(u[:1], w)
        out.append(MeshData(pos=s.mesh.pos.to(torch.float64), weight=w,
                            x=w.new_zeros(w.shape[0], 0),
                            y=u.permute(1, 0, 2).reshape(u.shape[1], -1), params=ident))
    return out


def rollout_errors(channels: int) -> Callable[[Sequence[Tensor], Sequence], np.ndarray]:
    """The validation score of trajectories (predictions ``[N, T * C]`` of the samples
    of :func:`trajectory_samples`): per series, the mean over steps ``1 .. T - 1`` of
    the relative L2 error of each step (quadrature-weighted, channels pooled; steps
    whose true state is zero left out), as ``meshops evaluate`` reports a rollout from
    step 0."""

    def score(pred: Sequence[Tensor], samples: Sequence) -> np.ndarray:
        out = []
        for p, s in zip(pred, samples):
            n = s.y.shape[0]
            p = p.to(torch.float64).reshape(n, -1, channels)[:, 1:]
            t = s.y.to(torch.float64).reshape(n, -1, channels)[:, 1:]
            w = s.weight.to(torch.float64)[:, None, None]
            num = (w * (p - t).square()).sum((0, 2))
            den = (w * t.square()).sum((0, 2))
            err = (num / den).sqrt().numpy()
            err[den.numpy() == 0] = np.nan
            out.append(np.nanmean(err))
        return np.asarray(out)

    return score


def fit_trajectory_basis(train: Sequence, val: Sequence, targets: Sequence[str], *,
                         minutes: float, seed: int = 0, log: Callable[[str], None] | None = None,
                         regressors: Sequence[str] = ("rbf", "gp", "mlp"),
                         members: int | None = None):
    """Fit a :class:`~meshops.models.trajectory_basis.TrajectoryBasis` (see the module
    docstring) within ``minutes`` (``seed``, ``log``, ``regressors``, ``members``: as
    :func:`~meshops.fitting.reduced_basis.fit_reduced_basis`).

    Returns:
        ``(model, report)``: the model refitted on ``train + val`` and the
        :class:`~meshops.fitting.reduced_basis.FitReport` whose candidates' ``errors`` are the
        validation series' mean errors over the steps (:func:`rollout_errors`).

    Raises:
        ValueError: the series do not allow it (:func:`trajectory_applies`), or no
            parameters vary and the first states are all the same.
    """
    from meshops.fitting.reduced_basis import fit_reduced_basis
    from meshops.models.trajectory_basis import TrajectoryBasis

    why = trajectory_applies(train, val, ())
    if why:
        raise ValueError(f"a trajectory basis does not apply: {why}")
    every = list(train) + list(val)
    first = None if all(s.params is not None for s in every) else initial_basis(every, targets)
    if first is None and any(s.params is None for s in every):
        raise ValueError("a trajectory basis tells the series apart by their parameters or "
                         "first states: there are no parameters and the first states are "
                         "all the same")
    c = every[0].channels(targets).shape[2]
    basis, report = fit_reduced_basis(
        trajectory_samples(train, targets, first), trajectory_samples(val, targets, first),
        minutes=minutes, seed=seed, log=log, score=rollout_errors(c), regressors=regressors,
        members=members)
    s0 = every[0]
    model = TrajectoryBasis(
        c, int(s0.mesh.pos.shape[1]), same_times(every).tolist(),
        identity="params" if first is None else "initial",
        num_params=0 if s0.params is None else s0.params.numel(),
        initial_rank=0 if first is None else first.rank, num_points=int(s0.mesh.pos.shape[0]),
        basis=dict(basis.config))
    model.basis.load_state_dict(basis.state_dict())
    if first is not None:
        model.initial_mean.copy_(first.mean)
        model.initial_modes.copy_(first.modes)
    return model, report
