"""`NextStep`: a time stepper made of any registered neural operator, rolled out.

The model advances a state ``u`` (the target fields) by one time step of a series,

    u(t + dt) = u(t) + dt * (m_r + s_r * F),
    F = sum_r a_r(c) * (G_r(norm(u(t)), norm(f(t)), e(c); x) + T_r(x)) / sqrt(R)

where ``G`` is any registered operator (PiT, TransformerNO, ...) with ``R * C_state``
output channels, ``f(t)`` optional input point fields known at every step (a
forcing), ``c = (t, dt, params)`` the step's conditions, ``m_r``, ``s_r`` the mean and
standard deviation of the rate ``(u(t + dt) - u(t)) / dt`` over the training series,
and

* ``e(c)``: an MLP of the normalised conditions (``t`` with sinusoids of learnable
  frequencies, :class:`TimeFeatures`), whose ``condition_width`` outputs enter ``G`` as
  input channels constant over each sample's points;
* ``a(c)``: a second MLP of them, the coefficients of the ``R = modes`` output modes: a
  product of a function of the conditions and a function of space, which an operator
  that sees the conditions only as constant channels learns very slowly (a forcing
  ``g(x) sin(w t)``, a decay ``exp(-kappa t)``);
* ``T(x)``: a trunk net, a pointwise MLP of the position (with sinusoids of it), for
  patterns that do not depend on the state, as a DeepONet learns its basis.

The residual form makes "nothing happens" the zero output and scales the increment
with ``dt``. ``modes=0`` gives ``F = G`` (``C_state`` outputs, no ``a`` and ``T``).

A forward pass rolls out ``K`` steps, ``K`` being the number of conditions a sample
carries (``data.cond [B, K, C_cond]``), and returns every predicted state. In
training, :attr:`NextStep.push_forward` (Brandstetter, Worrall & Welling, "Message
passing neural PDE solvers", ICLR 2022, sec. 2.3) runs the first ``K - 1`` steps
without gradient and back-propagates through the last step only; otherwise the
gradient flows through the whole unrolled chain (back-propagation through time).

The conditioning is the minimum that works with every registered operator; an
operator with its own parameter conditioning could take the conditions there instead
(:meth:`NextStep.condition` is the one place to change).
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Optional

import torch
from torch import Tensor

from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.models.base import (
    MODELS,
    NeuralOperator,
    check_positive_int,
    get_model,
    register_model,
)
from meshops.nn.fourier_features import FourierFeatures
from meshops.nn.mlp import MLP

__all__ = ["NextStep", "condition_channels"]

# The operator's arguments that NextStep sets itself.
_INFERRED = ("in_channels", "out_channels", "pos_dim")


def condition_channels(time_input: bool, param_channels: int) -> int:
    """The number of per-step conditions: ``t`` (when ``time_input``), ``dt`` and the
    parameters."""
    return int(time_input) + 1 + param_channels


class TimeFeatures(torch.nn.Module):
    r"""The (normalised) time with sinusoids of learnable frequencies,
    :math:`[t, \sin(\omega_j t + \phi_j), \cos(\omega_j t + \phi_j)]_{j < F}`,
    :math:`\omega_j` starting at :math:`\pi 2^{j/2}` (half octaves) and
    :math:`\phi_j = 0`. A forcing periodic in time is then a simple function of the
    features once a frequency has moved onto its period, whatever the period is in
    units of the normalised time (fixed octaves would have to be mixed into it).

    Shapes:
        ``[B, 1] -> [B, 1 + 2 F]``
    """

    def __init__(self, frequencies: int) -> None:
        super().__init__()
        self.frequencies = frequencies
        self.out_channels = 1 + 2 * frequencies
        self.phase = torch.nn.Linear(1, frequencies) if frequencies else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.phase is None:
            return
        with torch.no_grad():
            j = torch.arange(self.frequencies, dtype=torch.float64)
            self.phase.weight.copy_(math.pi * 2.0 ** (j / 2)[:, None])
            self.phase.bias.zero_()

    def forward(self, t: Tensor) -> Tensor:
        if not self.frequencies:
            return t
        arg = self.phase(t)
        return torch.cat([t, arg.sin(), arg.cos()], dim=-1)

    def extra_repr(self) -> str:
        return f"frequencies={self.frequencies}"


@register_model("next_step")
class NextStep(NeuralOperator):
    """A next-step model ``u(t) -> u(t + dt)`` rolled out over ``K`` steps.

    Args:
        model: Name of the registered operator ``G`` (``"pit"``, ``"transformer_no"``, ...).
        state_channels: Channels ``C`` of the state (the target fields).
        pos_dim: Spatial dimension.
        input_channels: Channels of the input fields given at every step (a forcing);
            0 for none.
        param_channels: Number of scalar parameters per series.
        time_input: Whether the model sees the time ``t`` (for non-autonomous problems,
            e.g. a time-dependent forcing); ``dt`` and the parameters it always sees.
        model_config: Further arguments of ``G`` (its width, depth, ...).
        condition_width: Width of the conditioning MLP (3 layers) and the number of
            channels it adds to ``G``'s input; 0 gives ``G`` the normalised conditions
            themselves.
        modes: ``R``, the output modes (0: ``F = G``).
        time_frequencies: Learnable frequencies of :class:`TimeFeatures` (0: ``t``
            alone).
        trunk: Add the trunk net ``T(x)`` to the modes.

    Attributes:
        operator: ``G``.
        push_forward: In training, back-propagate through the last step only
            (default False: through all steps).
        state_normalizer, forcing_normalizer, condition_normalizer, rate_normalizer:
            Statistics of the training series (see :meth:`set_statistics`), saved with
            the model.

    Shapes:
        data: ``x [N, C]`` (the state at the first step, physical units), ``cond [B, K,
        C_cond]`` (per step ``(t, dt, params)``, or ``(dt, params)`` without
        ``time_input``), ``step_inputs [N, K, C_in]`` when ``input_channels``, ``pos``,
        ``weight``, ``batch``  ->  ``[N, K * C]``: the states after steps ``1..K``,
        step-major (columns ``k*C .. k*C + C - 1`` are step ``k + 1``).

    Example:
        >>> import torch
        >>> from meshops.mesh.data import MeshData
        >>> from meshops.models import NextStep
        >>> model = NextStep("pit", state_channels=1, param_channels=2,
        ...                  model_config={"width": 16, "latent": "input"})
        >>> sample = MeshData(pos=torch.rand(50, 2), weight=torch.full((50,), 0.02),
        ...                   x=torch.rand(50, 1), cond=torch.rand(1, 3, 4))  # K = 3 steps
        >>> model(sample).shape                                          # [N, K * C]
        torch.Size([50, 3])
    """

    def __init__(self, model: str, state_channels: int, pos_dim: int = 2,
                 input_channels: int = 0, param_channels: int = 0, time_input: bool = True,
                 model_config: Optional[dict] = None, condition_width: int = 32,
                 modes: int = 16, time_frequencies: int = 8, trunk: bool = True) -> None:
        super().__init__()
        check_positive_int(state_channels, "state_channels")
        check_positive_int(condition_width, "condition_width", minimum=0)
        check_positive_int(modes, "modes", minimum=0)
        check_positive_int(input_channels, "input_channels", minimum=0)
        check_positive_int(param_channels, "param_channels", minimum=0)
        if model not in MODELS or MODELS[model] is NextStep:
            raise ValueError(f"model must be a registered operator, got {model!r}; available: "
                             f"{sorted(k for k in MODELS if k != 'next_step')}")
        config = dict(model_config or {})
        given = sorted(set(config) & set(_INFERRED))
        if given:
            raise ValueError(f"model_config: {given} are set by NextStep; leave them out")
        self.state_channels, self.input_channels = state_channels, input_channels
        self.param_channels, self.time_input = param_channels, bool(time_input)
        self.cond_channels = condition_channels(self.time_input, param_channels)
        self.dt_index = int(self.time_input)  # conditions: (t?, dt, params...)
        # the normalised time with sinusoids of it (a forcing periodic in t is then a
        # simple function of the features, not a wiggly one of t)
        self.time_features = TimeFeatures(time_frequencies if self.time_input else 0)
        features = self.cond_channels - 1 + self.time_features.out_channels \
            if self.time_input else self.cond_channels
        self.condition_net = (MLP(features, condition_width, condition_width, layers=3)
                              if condition_width else None)
        self.modes = modes
        # modes > 0: F = sum_r a_r(c) G_r(u, x), the operator giving G and an MLP of the
        # conditions the coefficients a (a product a function of the conditions and one of
        # space, which a pointwise lift of constant channels makes only slowly).
        self.coefficient_net = (MLP(features, max(condition_width, 32),
                                    state_channels * modes, layers=3) if modes else None)
        # modes > 0 and trunk: G_r(u, x) + T_r(x), T a pointwise MLP of the position (with
        # sinusoids of it): patterns that do not depend on the state (a forcing) are
        # learned directly, as a DeepONet's trunk net learns its basis
        self.pos_features = FourierFeatures(pos_dim, 3) if modes and trunk else None
        self.trunk = (MLP(self.pos_features.out_channels, 64, state_channels * modes,
                          layers=3) if self.pos_features is not None else None)
        self.operator = get_model(model, in_channels=state_channels + input_channels
                                  + (condition_width or features),
                                  out_channels=state_channels * max(modes, 1), pos_dim=pos_dim,
                                  **config)
        self.pos_dim = pos_dim
        self.state_normalizer = UnitGaussianNormalizer(state_channels)
        self.forcing_normalizer = UnitGaussianNormalizer(input_channels)
        self.condition_normalizer = UnitGaussianNormalizer(self.cond_channels)
        self.rate_normalizer = UnitGaussianNormalizer(state_channels)
        self.push_forward = False

    # ----------------------------------------------------------------- statistics
    @torch.no_grad()
    def set_statistics(self, stats: dict[str, tuple[Tensor, Tensor]]) -> "NextStep":
        """Set the normalisers from ``{"state" | "forcing" | "condition" | "rate": (mean,
        std)}`` (see :func:`meshops.training.rollout.series_statistics`)."""
        for key, (mean, std) in stats.items():
            norm = getattr(self, f"{key}_normalizer")
            norm.mean.copy_(mean)
            norm.std.copy_(std)
            norm.fitted.fill_(True)
        return self

    # -------------------------------------------------------------------- forward
    def mesh_transform(self):
        """The operator's mesh transform (see :meth:`NeuralOperator.mesh_transform`),
        applied to a sample whose ``x`` has the operator's channel count."""
        inner = self.operator.mesh_transform()
        if inner is None:
            return None
        channels = self.operator.config["in_channels"]

        def transform(sample):
            probe = copy.copy(sample)
            probe.x = sample.pos.new_zeros(sample.pos.shape[0], channels)
            probe = inner(probe)
            for key in probe.keys():
                if key not in sample.keys():
                    sample[key] = probe[key]
            return sample

        return transform

    def condition_features(self, cond: Tensor) -> Tensor:
        """The normalised conditions, the time replaced by its Fourier features.

        Shapes:
            ``[B, C_cond] -> [B, C_cond - 1 + (1 + 2 * time_frequencies)]`` (with ``t``)
        """
        c = self.condition_normalizer.encode(cond)
        if not self.time_input:
            return c
        return torch.cat([self.time_features(c[:, :1]), c[:, 1:]], dim=1)

    def condition(self, data, u: Tensor, forcing: Optional[Tensor], cond: Tensor,
                  batch: Tensor):
        """The operator's input for one step: a shallow copy of ``data`` whose ``x`` is
        the normalised state, forcing and the embedded conditions (repeated over each
        sample's points).

        Shapes:
            u ``[N, C]``, forcing ``[N, C_in]`` or None, cond ``[B, C_cond]``, batch
            ``[N]`` -> ``x [N, C + C_in + condition_width]``
        """
        parts = [self.state_normalizer.encode(u)]
        if forcing is not None:
            parts.append(self.forcing_normalizer.encode(forcing))
        c = self.condition_features(cond)
        if self.condition_net is not None:
            c = self.condition_net(c)
        parts.append(c[batch])
        step = copy.copy(data)
        step.x = torch.cat(parts, dim=1)
        return step

    def normalized_rate(self, data, u: Tensor, forcing: Optional[Tensor], cond: Tensor,
                        batch: Tensor) -> Tensor:
        """``F``: the rate ``(u(t + dt) - u(t)) / dt`` in the units of the rate
        normaliser (shapes as :meth:`condition`, -> ``[N, C]``)."""
        out = self.operator(self.condition(data, u, forcing, cond, batch))
        if self.coefficient_net is None:
            return out
        if self.trunk is not None:
            out = out + self.trunk(self.pos_features(data.pos.to(out.dtype)))
        coef = self.coefficient_net(self.condition_features(cond))[batch]
        out = (out * coef).view(u.shape[0], self.state_channels, self.modes).sum(2)
        return out / self.modes ** 0.5

    def step(self, data, u: Tensor, forcing: Optional[Tensor], cond: Tensor,
             batch: Tensor) -> Tensor:
        """One step: ``u(t) -> u(t + dt)`` (shapes as :meth:`condition`)."""
        rate = self.rate_normalizer.decode(self.normalized_rate(data, u, forcing, cond, batch))
        return u + cond[:, self.dt_index][batch][:, None] * rate

    def forward(self, data) -> Tensor:
        u = data.x
        cond = getattr(data, "cond", None)
        if u is None or u.dim() != 2 or u.shape[1] != self.state_channels:
            shape = None if u is None else tuple(u.shape)
            raise ValueError(f"data.x must be the state [N, {self.state_channels}], got {shape}")
        if cond is None or cond.dim() != 3 or cond.shape[2] != self.cond_channels:
            shape = None if cond is None else tuple(cond.shape)
            raise ValueError(f"data.cond must be [B, K, {self.cond_channels}] (per step "
                             f"{'t, ' if self.time_input else ''}dt and "
                             f"{self.param_channels} parameters), got {shape}")
        if getattr(data, "query_pos", None) is not None:
            raise ValueError("NextStep predicts the state at the mesh points; query_pos "
                             "is not supported")
        forcing = getattr(data, "step_inputs", None)
        if self.input_channels:
            if forcing is None or forcing.shape[0] != u.shape[0] or \
                    tuple(forcing.shape[1:]) != (cond.shape[1], self.input_channels):
                shape = None if forcing is None else tuple(forcing.shape)
                raise ValueError(f"data.step_inputs must be [N, K={cond.shape[1]}, "
                                 f"{self.input_channels}], got {shape}")
        batch = getattr(data, "batch", None)
        if batch is None:
            batch = torch.zeros(u.shape[0], dtype=torch.long, device=u.device)
        dtype = self.state_normalizer.mean.dtype
        u, cond = u.to(dtype), cond.to(dtype)
        steps = cond.shape[1]
        out = []
        for k in range(steps):
            frozen = self.training and self.push_forward and k < steps - 1
            with torch.no_grad() if frozen else contextlib.nullcontext():
                u = self.step(data, u, None if not self.input_channels
                              else forcing[:, k].to(dtype), cond[:, k], batch)
            out.append(u)
        return torch.cat(out, dim=1)

    def extra_repr(self) -> str:
        return (f"state_channels={self.state_channels}, input_channels={self.input_channels}, "
                f"param_channels={self.param_channels}, time_input={self.time_input}")

    @property
    def operator_config(self) -> dict[str, Any]:
        """The operator's full configuration without the channels NextStep sets."""
        return {k: v for k, v in self.operator.config.items() if k not in _INFERRED}
