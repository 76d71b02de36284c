"""The parameter vector of a sample in a parametric study.

A user brings parameters either as a vector per sample (``params [1, K]`` on each
:class:`~meshops.MeshData`) or, as most FEM exports do, as input fields that are
constant over the mesh (``--inputs kappa,wind_x``). Both describe the same thing; the
second is read as the quadrature-weighted mean of each input channel.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

# Inputs whose spread over a mesh is below this fraction of their size are constant
# (float32 files round a parameter the same way at every node, so the spread is 0;
# the tolerance only absorbs writers that store values with their own rounding).
CONST_RTOL = 1e-6


def input_ranges(sample) -> tuple[list[float], list[float], list[float]] | None:
    """``(spread, magnitude, smallest)`` of each input channel over the sample's mesh
    (largest minus smallest value, largest absolute value, smallest value); ``None``
    without input channels. What :func:`constant_channels` and :func:`global_channels`
    read, recorded by the lazy cache per sample."""
    x = getattr(sample, "x", None)
    if x is None or x.numel() == 0:
        return None
    x = x.reshape(x.shape[0], -1).to(torch.float64)
    low = x.min(0).values
    return ((x.max(0).values - low).tolist(), x.abs().max(0).values.tolist(),
            low.tolist())


def constant_channels(ranges: Sequence) -> list[bool] | None:
    """Which input channels are constant over every mesh: a channel's spread over each
    mesh within :data:`CONST_RTOL` of its largest magnitude over all samples (relative,
    so that the answer does not depend on the inputs' units). ``ranges``: each sample's
    :func:`input_ranges`; ``None`` when a sample has no inputs or the samples differ
    in their number of channels.

    A channel constant over each mesh is a global input (a load, a speed, a material
    value): the defaults condition the whole model on it."""
    if not ranges or any(r is None for r in ranges) or len({len(r[0]) for r in ranges}) > 1:
        return None
    spreads = torch.tensor([r[0] for r in ranges], dtype=torch.float64)
    scale = torch.tensor([r[1] for r in ranges], dtype=torch.float64).max(0).values
    return (~(spreads > CONST_RTOL * scale).any(0)).tolist()


def global_channels(ranges: Sequence) -> list[bool] | None:
    """Which input channels are global inputs: constant over every mesh
    (:func:`constant_channels`) and not the same in every sample (a channel of one
    value everywhere says nothing about any sample). ``ranges`` and ``None`` as there."""
    constant = constant_channels(ranges)
    if constant is None:
        return None
    low = torch.tensor([r[2] for r in ranges], dtype=torch.float64)
    scale = torch.tensor([r[1] for r in ranges], dtype=torch.float64).max(0).values
    varies = (low.max(0).values - low.min(0).values) > CONST_RTOL * scale
    return [bool(c and v) for c, v in zip(constant, varies.tolist())]


def constant_inputs(samples: Sequence) -> bool:
    """Whether every sample has input channels and each is constant over its mesh
    (:func:`constant_channels`)."""
    channels = constant_channels([input_ranges(s) for s in samples])
    return channels is not None and all(channels)


def _has_params(s) -> bool:
    p = getattr(s, "params", None)
    return isinstance(p, Tensor) and p.numel() > 0


def sample_parameters(samples: Sequence) -> tuple[Tensor | None, str]:
    """The ``[S, K]`` float64 parameter matrix of ``samples``, and where it came from.

    Each sample's ``params`` (when every sample carries one) followed by the
    quadrature-weighted mean of each input channel, when every input is constant over
    its mesh (:func:`constant_inputs`); ``(None, why not)`` when inputs vary over the
    mesh (a model of the parameters alone would ignore them) or there are no
    parameters at all.

    Shapes:
        each sample ``params [1, K1]`` and ``x [N, K2]`` -> ``[S, K1 + K2]``
    """
    if len(samples) == 0:
        return None, "no samples"
    has_x = any(getattr(s, "x", None) is not None and s.x.numel() > 0 for s in samples)
    if has_x and not constant_inputs(samples):
        return None, "the inputs vary over the mesh (not per-sample constants)"
    parts, why = [], []
    if all(_has_params(s) for s in samples):
        rows = [s.params.reshape(-1).to(torch.float64) for s in samples]
        if len({r.numel() for r in rows}) > 1:
            return None, "the samples' parameter vectors differ in length"
        parts.append(torch.stack(rows))
        why.append(f"the {rows[0].numel()} parameter(s) of each sample")
    if has_x:
        rows = [_means(s.x.reshape(s.x.shape[0], -1), s.weight,
                       torch.zeros(s.x.shape[0], dtype=torch.long), 1)[0] for s in samples]
        parts.append(torch.stack(rows))
        why.append(f"the {rows[0].numel()} input channel(s), constant over each mesh")
    if not parts:
        return None, "no sample carries params and there are no input fields"
    return torch.cat(parts, 1), " and ".join(why)


#: Two standardised parameter columns closer than this everywhere are one parameter.
SAME_COLUMN_ATOL = 1e-9


def informative_columns(params: Tensor) -> list[int]:
    """The columns of a parameter matrix ``[S, K]`` that a regression can use: those that
    vary over the samples, less any that repeats an earlier one once standardised (a
    parameter given both in ``params`` and as a constant input field; the same column
    twice makes a spline's polynomial part singular).

    Shapes:
        ``[S, K]`` -> the kept column indices
    """
    if params.shape[0] < 2:
        return []
    p = params.to(torch.float64)
    spread = p.std(0)
    kept: list[int] = []
    for k in torch.nonzero(spread > 0).flatten().tolist():
        z = (p[:, k] - p[:, k].mean()) / spread[k]
        if not any(float((z - (p[:, j] - p[:, j].mean()) / spread[j]).abs().max())
                   <= SAME_COLUMN_ATOL for j in kept):
            kept.append(k)
    return kept


def batch_parameters(data, num_graphs: int) -> Tensor:
    """The ``[B, K]`` parameters of a batch inside a model's forward, as
    :func:`sample_parameters` makes them: ``data.params`` when present, then the
    quadrature-weighted mean of each channel of ``data.x`` per sample.

    Raises:
        ValueError: a channel of ``data.x`` that is not constant over its sample
            (:func:`varying_input`): as in training, it is no parameter.

    Shapes:
        ``params [B, K1]``, ``x [N, K2]``, ``weight [N]``, ``batch [N]`` -> ``[B, K1 + K2]``
        float64
    """
    parts = []
    p = getattr(data, "params", None)
    if isinstance(p, Tensor) and p.numel() > 0:
        parts.append(p.reshape(num_graphs, -1).to(torch.float64))
    x = data.x.reshape(data.x.shape[0], -1)
    if x.shape[1] == 0:
        return torch.cat(parts, 1)
    batch = getattr(data, "batch", None)
    if batch is None:
        batch = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    # Its mean would answer another question. A check that depends on the values
    # cannot be traced: an exported program leaves it to the code that feeds it
    # (meshops.inference.predict.RunSpec.check_mesh makes it for predict and evaluate).
    bad = None if torch.compiler.is_compiling() else varying_input(x, batch, num_graphs)
    if bad is not None:
        raise ValueError(f"input channel {bad[0]} varies over sample {bad[1]}: the inputs of "
                         f"a reduced basis are parameters, one value per sample")
    return torch.cat(parts + [_means(x, data.weight, batch, num_graphs)], 1)


def varying_input(x: Tensor, batch: Tensor, num_graphs: int) -> tuple[int, int] | None:
    """``(channel, sample)`` of the first input channel that is not constant over a
    sample (spread above :data:`CONST_RTOL` of its largest magnitude there), or None.

    Shapes:
        ``x [N, C]``, ``batch [N]``
    """
    x = x.reshape(x.shape[0], -1).to(torch.float64)
    if x.numel() == 0:
        return None
    index = batch[:, None].expand_as(x)
    shape = (num_graphs, x.shape[1])
    hi = x.new_full(shape, -torch.inf).scatter_reduce(0, index, x, "amax")
    lo = x.new_full(shape, torch.inf).scatter_reduce(0, index, x, "amin")
    size = x.new_zeros(shape).scatter_reduce(0, index, x.abs(), "amax")
    bad = (hi - lo > CONST_RTOL * size).nonzero()
    return (int(bad[0, 1]), int(bad[0, 0])) if bad.numel() else None


def _means(x: Tensor, w: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
    """The quadrature-weighted mean of each channel of ``x`` per sample, in float64,
    about each sample's first point: ``x_0 + sum w (x - x_0) / sum w``, so that a
    constant channel gives its value exactly (a plain weighted sum of 1.7e9 at a
    thousand points rounds it by 1e-5).

    Shapes:
        ``x [N, C]``, ``w [N]``, ``batch [N]`` -> ``[B, C]``
    """
    x, w = x.to(torch.float64), w.to(torch.float64)
    index = torch.arange(x.shape[0], device=x.device)
    first = torch.full((num_graphs,), x.shape[0], dtype=torch.long, device=x.device)
    first = first.scatter_reduce(0, batch, index, "amin")
    d = x - x[first][batch]
    num = torch.zeros(num_graphs, x.shape[1], dtype=x.dtype, device=x.device)
    den = torch.zeros(num_graphs, dtype=x.dtype, device=x.device)
    num.index_add_(0, batch, w[:, None] * d)
    den.index_add_(0, batch, w)
    return x[first] + num / den[:, None]


#: A global input the targets are proportional to: the log-log slope of each target
#: channel's size against it within this of 1 ...
PROPORTIONAL_SLOPE_TOL = 0.1
#: ... explaining at least this fraction of the variance of the log sizes ...
PROPORTIONAL_R2 = 0.8
#: ... over inputs that span at least this ratio (a narrower range cannot tell).
PROPORTIONAL_SPAN = 2.0


def _log_fit(u: Tensor, v: Tensor) -> tuple[float, float]:
    """Slope and R^2 of the least-squares line through ``(u, v)``."""
    du, dv = u - u.mean(), v - v.mean()
    slope = float((du * dv).sum() / (du * du).sum())
    resid = dv - slope * du
    total = float((dv * dv).sum())
    return slope, 1.0 - float((resid * resid).sum()) / total if total > 0 else 1.0


def proportional_channel(means: Tensor, sizes: Tensor, channels: Sequence[bool] | None
                         ) -> tuple[int, float] | None:
    """The global input the targets are proportional to (a load in linear elasticity,
    a source in a linear heat problem), and the fitted exponent; ``None`` when none is.

    For each global input channel ``k`` (``channels``: :func:`global_channels`) whose
    values keep one sign and span a ratio of :data:`PROPORTIONAL_SPAN`: the root mean
    square (quadrature-weighted) of every target channel against ``|c_k|`` on a log-log
    scale has a slope within :data:`PROPORTIONAL_SLOPE_TOL` of 1 and an ``R^2`` of
    :data:`PROPORTIONAL_R2` (channels that are 0 everywhere left out). The first such
    channel is returned. A model then learns the answer per unit of it
    (:class:`~meshops.datasets.normalizer.UnitGaussianNormalizer`'s ``scale_by``).

    Args:
        means: Each sample's input means ``[S, C_in]`` (:func:`means_and_sizes`).
        sizes: Each sample's target root mean squares ``[S, C_out]``.
        channels: Which input channels are global inputs.
    """
    if not channels or not any(channels) or len(means) < 3:
        return None
    c, size = means.to(torch.float64), sizes.to(torch.float64)
    live = (size > 0).all(0)
    for k in (i for i, g in enumerate(channels) if g):
        ck = c[:, k]
        same_sign = bool((ck > 0).all() or (ck < 0).all())
        if not same_sign or float(ck.abs().max() / ck.abs().min()) < PROPORTIONAL_SPAN:
            continue
        fits = [_log_fit(ck.abs().log(), size[:, j].log()) for j in range(size.shape[1])
                if live[j]]
        if fits and all(abs(a - 1) <= PROPORTIONAL_SLOPE_TOL and r2 >= PROPORTIONAL_R2
                        for a, r2 in fits):
            return k, sum(a for a, _ in fits) / len(fits)
    return None


def means_and_sizes(samples: Sequence) -> tuple[Tensor, Tensor]:
    """Each sample's input means ``[S, C_in]`` and target root mean squares ``[S, C_out]``
    (what :func:`proportional_channel` reads)."""
    means = torch.stack([s.x.to(torch.float64).mean(0) for s in samples])
    return means, torch.stack([_rms(s) for s in samples])


def _rms(sample) -> Tensor:
    """Quadrature-weighted root mean square of each target channel ``[C_out]`` (at the
    query points when the sample has them, weighted uniformly there)."""
    y = sample.y.reshape(sample.y.shape[0], -1).to(torch.float64)
    w = sample.weight.to(torch.float64) if y.shape[0] == sample.weight.shape[0] \
        else torch.ones(y.shape[0], dtype=torch.float64)
    return ((w[:, None] * y * y).sum(0) / w.sum()).sqrt()
