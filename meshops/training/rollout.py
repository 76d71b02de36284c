"""Training samples of time series for :class:`~meshops.models.next_step.NextStep`:
windows of ``K`` steps, the normalisation statistics, the rollout loss, and rollouts.

A window of series ``s`` starting at step ``k`` is one :class:`~meshops.MeshData`:

* ``x [N, C]``: the state (the target fields) at step ``k``, in physical units;
* ``y [N, K * C]``: the states at steps ``k + 1 .. k + K``, step-major;
* ``cond [1, K, C_cond]``: per step ``(t, dt, params...)`` (``t`` left out without
  ``time_input``), so that a batch holds ``[B, K, C_cond]``;
* ``step_inputs [N, K, C_in]``: the input fields at steps ``k .. k + K - 1``, when
  there are any;
* ``pos``, ``weight``: the series' mesh (one tensor shared by all its windows, so the
  model's mesh structures are built once per mesh); ``params [1, P]`` (the library's
  contract for parameter vectors); ``source``: ``"<series> @ step k"``.

Training on windows of ``K`` steps is rollout training: the model's own predictions are
its inputs after the first step (push-forward: see
:attr:`~meshops.models.next_step.NextStep.push_forward` for where the gradient flows).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from meshops.datasets.series import SeriesError, TimeSeries
from meshops.mesh.data import MeshData
from meshops.training.loss import relative_lp

__all__ = ["RolloutLoss", "rollout", "rollout_sample", "rollout_windows",
           "series_conditions", "series_statistics"]


def series_conditions(series: TimeSeries, time_input: bool,
                      times: Optional[Tensor] = None) -> Tensor:
    """The conditions of the steps ``k -> k + 1``: ``(t_k, dt_k, params...)``.

    Args:
        series: The series (its ``times`` and ``params``).
        time_input: Include ``t_k``.
        times: Times to use instead of the series' (e.g. extended past its end).

    Shapes:
        -> ``[T - 1, C_cond]`` float64
    """
    t = series.times if times is None else times
    dt = t[1:] - t[:-1]
    cols = ([t[:-1, None]] if time_input else []) + [dt[:, None]]
    if series.params is not None:
        cols.append(series.params.to(torch.float64).expand(dt.shape[0], -1))
    return torch.cat(cols, dim=1)


def _weighted_moments(series: Sequence[TimeSeries], values) -> tuple[Tensor, Tensor]:
    """Quadrature-weighted mean and standard deviation per channel of ``values(s)``
    (``[T', N, C]`` float64 on series ``s``'s mesh) over all series, in two passes."""
    total, s1 = 0.0, 0.0
    for s in series:
        x, w = values(s), s.mesh.weight.to(torch.float64)[None, :, None]
        s1 = s1 + (w * x).sum((0, 1))
        total += float(w.sum()) * x.shape[0]
    mean = s1 / total
    s2 = 0.0
    for s in series:
        x, w = values(s), s.mesh.weight.to(torch.float64)[None, :, None]
        s2 = s2 + (w * (x - mean) ** 2).sum((0, 1))
    return mean, (s2 / total).sqrt()


def _scale(mean: Tensor, std: Tensor) -> Tensor:
    """A usable scale: a channel that does not vary in the training data (a constant
    ``dt``, a parameter shared by all series) gets ``max(|mean|, 1)``, so that another
    value at prediction time maps to a moderate number, not ``1e6`` times it."""
    fallback = mean.abs().clamp_min(1.0)
    return torch.where(std > 1e-6 * fallback, std, fallback)


@torch.no_grad()
def series_statistics(series: Sequence[TimeSeries], targets: Sequence[str],
                      inputs: Sequence[str], time_input: bool) -> dict:
    """Normalisation statistics of the training series for
    :meth:`~meshops.models.next_step.NextStep.set_statistics`: the quadrature-weighted
    mean and standard deviation over all steps of the state, the input fields and the
    rate ``(u_{k+1} - u_k) / dt_k``, and the plain ones of the conditions.

    Returns:
        ``{"state" | "forcing" | "condition" | "rate": (mean [C], std [C])}`` float64.
    """
    if not series:
        raise ValueError("series_statistics: no training series")

    def rate(s: TimeSeries) -> Tensor:
        u = s.channels(targets)
        return (u[1:] - u[:-1]) / (s.times[1:] - s.times[:-1])[:, None, None]

    out = {"state": _weighted_moments(series, lambda s: s.channels(targets))}
    if inputs:
        out["forcing"] = _weighted_moments(series, lambda s: s.channels(inputs))
    out["rate"] = _weighted_moments(series, rate)
    cond = torch.cat([series_conditions(s, time_input) for s in series])
    out["condition"] = (cond.mean(0), cond.std(0, unbiased=False))
    return {k: (m, _scale(m, sd)) for k, (m, sd) in out.items()}


def rollout_sample(series: TimeSeries, targets: Sequence[str], inputs: Sequence[str],
                   start: int, steps: int, time_input: bool, dtype: torch.dtype,
                   with_targets: bool = True, times: Optional[Tensor] = None,
                   mesh: Optional[tuple[Tensor, Tensor]] = None,
                   state: Optional[Tensor] = None) -> MeshData:
    """The sample that rolls ``series`` out from step ``start`` for ``steps`` steps (see
    the module docstring for its layout).

    Args:
        series, targets, inputs: The series and its state / input field names.
        start, steps: The first step and the number of steps.
        time_input: Whether the conditions include ``t``.
        dtype: Floating dtype of the sample.
        with_targets: Include ``y`` (the series must then hold the steps).
        times: The times of steps ``0 .. start + steps`` when they go past the series'
            end (a prediction beyond the data); default the series' own.
        mesh: ``(pos, weight)`` in ``dtype`` to share between samples of one series.
        state: ``[T, N, C]`` states of the series in ``dtype`` (shared likewise).

    Raises:
        SeriesError: the steps go past the series' end where targets or input fields
            are needed, naming the series and the step.
    """
    t = series.times if times is None else times
    last = start + steps
    if start < 0 or steps < 1 or last >= t.shape[0]:
        raise SeriesError(f"{series.source}: cannot roll out {steps} step(s) from time step "
                          f"{start}: it has {t.shape[0]} time steps")
    need = last if with_targets else start
    if inputs:
        need = max(need, last - 1)
    if need >= len(series):
        raise SeriesError(f"{series.source}: time step {need} is needed ("
                          f"{'the target' if with_targets else 'the input fields'} of the "
                          f"rollout) but the series ends at time step {len(series) - 1}")
    pos, weight = mesh if mesh is not None else (series.mesh.pos.to(dtype),
                                                 series.mesh.weight.to(dtype))
    u = state if state is not None else series.channels(targets, dtype)
    n, c = u.shape[1], u.shape[2]
    cond = series_conditions(series, time_input, t[:last + 1])[start:last]
    sample = MeshData(pos=pos, weight=weight, x=u[start], cond=cond[None].to(dtype),
                      source=f"{series.name} @ step {start}")
    if with_targets:
        sample.y = u[start + 1:last + 1].permute(1, 0, 2).reshape(n, steps * c)
    if inputs:
        sample.step_inputs = series.channels(inputs, dtype)[start:last].permute(1, 0, 2)
    if series.params is not None:
        sample.params = series.params.to(dtype)
    return sample


def rollout_windows(series: Sequence[TimeSeries], targets: Sequence[str],
                    inputs: Sequence[str], steps: int, time_input: bool,
                    dtype: torch.dtype) -> list[MeshData]:
    """Every window of ``steps`` steps of every series, as training samples.

    Raises:
        SeriesError: a series shorter than ``steps + 1`` time steps.
    """
    out = []
    for s in series:
        if len(s) < steps + 1:
            raise SeriesError(f"{s.source}: {len(s)} time steps, too few for windows of "
                              f"{steps} step(s) (--rollout-train {steps})")
        mesh = (s.mesh.pos.to(dtype), s.mesh.weight.to(dtype))
        state = s.channels(targets, dtype)
        forcing = s.channels(inputs, dtype) if inputs else None
        for k in range(len(s) - steps):
            w = rollout_sample(s, targets, (), k, steps, time_input, dtype, mesh=mesh,
                               state=state)
            if forcing is not None:
                w.step_inputs = forcing[k:k + steps].permute(1, 0, 2)
            out.append(w)
    return out


class RolloutLoss(torch.nn.Module):
    """The mean over the unrolled steps of each step's error, averaged over the samples;
    with ``last_only`` the last step's error alone (push-forward training, where only
    the last step carries a gradient).

    The error of a step is its relative L2 error (quadrature-weighted by default), or,
    with ``scale``, its mean square error over the domain in units of ``scale``,
    ``sum_i w_i |pred_i - y_i|^2 / (sum_i w_i * scale^2)`` (``scale`` e.g. the typical
    change of the state in one step). The relative error is the metric; the scaled
    square error weighs every step alike, where the relative one is dominated by the
    steps whose state is nearly zero (an oscillation crossing zero), and trains a next
    step model faster.

    Args:
        channels: State channels ``C`` (predictions and targets are ``[N, K * C]``).
        last_only: Only the last step counts.
        quadrature: Weight the norms with the quadrature weights.
        scale: ``[C]`` or a number: use the scaled mean square error.

    Shapes:
        pred, target ``[N, K * C]``, weight ``[N]``, batch ``[N]`` -> ``[]``
    """

    def __init__(self, channels: int, last_only: bool = False, quadrature: bool = True,
                 scale=None) -> None:
        super().__init__()
        self.channels, self.last_only, self.quadrature = channels, last_only, quadrature
        self.register_buffer("scale", None if scale is None else
                             torch.as_tensor(scale, dtype=torch.float64).reshape(-1))

    def forward(self, pred: Tensor, target: Tensor, weight: Optional[Tensor] = None,
                batch: Optional[Tensor] = None) -> Tensor:
        c = self.channels
        steps = pred.shape[1] // c
        if pred.shape[1] != steps * c or steps < 1:
            raise ValueError(f"RolloutLoss: predictions have {pred.shape[1]} columns, not a "
                             f"multiple of the {c} state channels")
        w = weight if self.quadrature else None
        ks = [steps - 1] if self.last_only else range(steps)
        if self.scale is None:
            errs = [relative_lp(pred[:, k * c:(k + 1) * c], target[:, k * c:(k + 1) * c], w,
                                batch, reduction="none") for k in ks]
            return torch.stack(errs, 1).mean()
        if batch is None:
            batch = torch.zeros(pred.shape[0], dtype=torch.long, device=pred.device)
        w = torch.ones_like(pred[:, 0]) if w is None else w.to(pred.dtype)
        scale = self.scale.to(pred).expand(c)
        sq = torch.stack([(((pred[:, k * c:(k + 1) * c] - target[:, k * c:(k + 1) * c])
                            / scale) ** 2).sum(1) for k in ks], 1).mean(1)
        num = torch.zeros(int(batch.max()) + 1, dtype=pred.dtype, device=pred.device)
        den = torch.zeros_like(num)
        num.index_add_(0, batch, w * sq)
        den.index_add_(0, batch, w)
        return (num / den).mean()

    def extra_repr(self) -> str:
        return (f"channels={self.channels}, last_only={self.last_only}, "
                f"quadrature={self.quadrature}, scaled={self.scale is not None}")


@torch.no_grad()
def rollout(model, sample: MeshData, chunk: int = 0) -> Tensor:
    """The model's rollout of ``sample`` in physical units.

    Args:
        model: A :class:`~meshops.models.next_step.NextStep` or a
            :class:`~meshops.models.trajectory_basis.TrajectoryBasis`.
        sample: From :func:`rollout_sample` (``cond [1, K, C_cond]``).
        chunk: Roll out this many steps per forward call (0: all at once); the state
            carries over, so the result is the same.

    Shapes:
        -> ``[K, N, C]`` on the CPU
    """
    from meshops.inference.predict import model_tensor

    param = model_tensor(model)
    c = model.state_channels
    data = sample.clone().to(param.device)
    steps = data.cond.shape[1]
    chunk = chunk or steps
    out = []
    for a in range(0, steps, chunk):
        part = data.clone()
        part.cond = data.cond[:, a:a + chunk]
        if getattr(data, "step_inputs", None) is not None:
            part.step_inputs = data.step_inputs[:, a:a + chunk]
        if out:
            part.x = out[-1][-1].to(param.device)
        pred = model.predict(part).to(torch.float64).cpu()
        n = pred.shape[0]
        out.append(pred.reshape(n, -1, c).permute(1, 0, 2))
    return torch.cat(out, 0)


#: The operator a next-step model gets by default: a small PiT (a step of a smooth
#: evolution is a small change to carry; see docs/time-series.md for the figures).
SERIES_PIT = {"width": 64, "heads": 2, "blocks": 2, "latent": "fps", "num_latent": 128}
SERIES_TRAIN = {"batch_size": 16, "lr": 3e-3}


def series_options(series: Sequence[TimeSeries], model: str | None = None,
                   model_config: dict | None = None, batch_size: int | None = None,
                   lr: float | None = None) -> tuple[dict, str]:
    """The options of a ``meshops train --series`` run that nobody gave (``None``): the
    operator (PiT) and its size under the given ``model_config``, the batch size and the
    learning rate.

    Returns:
        ``(options, reason)``: ``options`` has ``model``, ``model_config``,
        ``batch_size`` and ``lr`` (the given ones kept); ``reason`` says what was
        chosen, or ``""`` when nothing was.
    """
    model_config = dict(model_config or {})
    out = {"model": model, "model_config": model_config, "batch_size": batch_size, "lr": lr}
    before = dict(out)
    points = min(int(s.mesh.pos.shape[0]) for s in series)
    if out["model"] is None:
        out["model"] = "pit"
    if out["model"] == "pit":
        chosen = dict(SERIES_PIT, num_latent=min(SERIES_PIT["num_latent"], points))
        out["model_config"] = {**chosen, **model_config}
    for key, value in SERIES_TRAIN.items():
        if out[key] is None:
            out[key] = value
    if out == before:
        return out, ""
    return out, (f"time series: a small {out['model']} "
                 f"({', '.join(f'{k}={v}' for k, v in out['model_config'].items())}), batch "
                 f"{out['batch_size']}, lr {out['lr']:g}")
