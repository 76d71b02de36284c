"""Conditioning of a model on a per-sample parameter vector (FiLM).

A parametric study has, besides the mesh and its fields, a few numbers per sample
(angle of attack, Reynolds number, material constants): ``data.params [B, K]``
(:mod:`meshops.datasets.params`). Repeating them as constant fields at every point makes the
model rediscover at each point that they are constant, and costs ``K`` channels of
every point. Here they condition the model once per sample, by feature-wise linear
modulation (FiLM; Perez et al., "FiLM: Visual Reasoning with a General Conditioning
Layer", AAAI 2018):

1. the parameters are standardised with statistics of the training samples (a
   :class:`~meshops.UnitGaussianNormalizer` inside this module, saved with the
   model), ``p -> (p - mean) / std``;
2. an MLP embeds them, ``e = MLP(p~) [B, 64]``;
3. at each of ``sites`` places of the model (the lifted features, the processor's
   tokens before every block, the decoder's features) a linear map of ``e`` gives a
   per-channel scale and shift, applied to every point ``i`` of sample ``b(i)``:
   ``h_i <- h_i * (1 + gamma_s(e)_b(i)) + beta_s(e)_b(i)``.

The last linear map starts at zero, so a conditioned model starts as the same
function as the unconditioned one, and it is built after every other layer of the
model, so their initial weights do not change either. Pointwise in space: the
conditioning is as mesh-independent as the model it modulates.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.nn.mlp import MLP
from meshops.utils.checks import checking

__all__ = ["ParamConditioning", "fit_param_normalizer", "input_means", "read_params",
           "sample_conditions"]

#: Width of the parameter embedding.
EMBED = 64


class ParamConditioning(nn.Module):
    """FiLM conditioning on ``params [B, K]`` at ``sites`` places of width ``width``.

    Args:
        param_channels (int): ``K``, the number of conditions (``>= 1``).
        width (int): channels of the modulated features.
        sites (int): number of places modulated (each with its own scale and shift).
        given (int, optional): how many of the ``K`` are ``data.params`` (the first
            ones; default all); the rest are input means (:func:`sample_conditions`),
            which :func:`fit_param_normalizer` leaves unscaled.

    Shapes:
        - :meth:`embed`: ``params [B, K] -> [B, 64]``
        - :meth:`forward`: ``h [N, width]``, embedding ``[B, 64]``, ``batch [N]`` or
          None (one sample), site index -> ``[N, width]``
    """

    def __init__(self, param_channels: int, width: int, sites: int,
                 given: Optional[int] = None) -> None:
        super().__init__()
        self.param_channels, self.width, self.sites = param_channels, width, sites
        # The first ``given`` conditions are ``data.params`` (standardised with fitted
        # statistics); the others are means of normalised inputs, already standardised.
        self.given = param_channels if given is None else given
        # "_normalizer" in the name: checkpoints check such statistics (positive scales)
        self.params_normalizer = UnitGaussianNormalizer(param_channels)
        self.embedding = MLP(param_channels, EMBED, EMBED, layers=2, activation="gelu",
                             out_activation=True)
        self.film = nn.Linear(EMBED, sites * 2 * width)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def reset_parameters(self) -> None:
        self.embedding.reset_parameters()
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def embed(self, params: Tensor) -> Tensor:
        """Standardise and embed the raw parameters: ``[B, K] -> [B, sites, 2, width]``
        (each site's scale and shift). The standardisation runs in float64 (a
        timestamp-like 1.7e9 + 100 a is quantised in float32), then the model's dtype."""
        z = self.params_normalizer.encode(params.to(torch.float64))
        e = self.embedding(z.to(self.film.weight.dtype))
        return self.film(e).view(params.shape[0], self.sites, 2, self.width)

    def forward(self, h: Tensor, film: Tensor, batch: Optional[Tensor], site: int) -> Tensor:
        """``h * (1 + gamma) + beta`` with site ``site``'s scale and shift of each
        point's sample (``film`` from :meth:`embed`)."""
        gb = film[:, site]  # [B, 2, width]
        if batch is None or gb.shape[0] == 1:
            # one sample: broadcast its row rather than copy it to every point (the
            # gather and its backward's scatter took 3.5 % of a profiled batch-1 step
            # of the airfoil default)
            return h * (1 + gb[0, 0]) + gb[0, 1]
        gb = gb[batch]                                                   # [N, 2, width]
        return h * (1 + gb[:, 0]) + gb[:, 1]

    def extra_repr(self) -> str:
        extra = ("" if self.given == self.param_channels
                 else f", given={self.given}")
        return (f"param_channels={self.param_channels}, width={self.width}, "
                f"sites={self.sites}{extra}")


def input_means(inp) -> Tensor:
    """The quadrature-weighted mean of each input channel over each sample of ``inp``
    (a :class:`~meshops.models.inputs.MeshInputs`): ``[B, C]``; for inputs constant
    over each mesh, the inputs themselves."""
    w = inp.weight.to(inp.x.dtype)
    if inp.batch is None:
        return ((w[:, None] * inp.x).sum(0) / w.sum())[None]
    num = inp.x.new_zeros(inp.num_graphs, inp.x.shape[1]).index_add_(0, inp.batch,
                                                                      w[:, None] * inp.x)
    den = w.new_zeros(inp.num_graphs).index_add_(0, inp.batch, w)
    return num / den[:, None]


def sample_conditions(data, inp, param_channels: int, on_inputs: bool) -> Tensor:
    """What a model conditions on: ``data.params [B, K]`` (when ``param_channels``),
    then the input means ``[B, C]`` (when ``on_inputs``), concatenated: ``[B, K (+ C)]``
    in float64 (:meth:`ParamConditioning.embed` standardises them in float64) on the
    inputs' device."""
    parts = []
    if param_channels:
        parts.append(read_params(data, param_channels, inp.num_graphs, inp.x.device))
    if on_inputs:
        parts.append(input_means(inp).to(torch.float64))
    return torch.cat(parts, dim=1)


def read_params(data, param_channels: int, num_graphs: int, device) -> Tensor:
    """``data.params`` as ``[B, K]`` in float64 on ``device``: parameters are
    standardised in float64 (:meth:`ParamConditioning.embed`) before the model's dtype.

    Raises:
        ValueError: missing params, a shape other than ``[B, K]`` (a single sample may
            give ``[K]``), or (when :func:`~meshops.utils.checks.checking`) a NaN or infinite value.
    """
    p = getattr(data, "params", None)
    if p is None:
        raise ValueError(f"data.params is missing; the model was built with param_channels="
                         f"{param_channels} and needs params [B, {param_channels}] per batch "
                         f"(one [1, {param_channels}] row per sample)")
    if not isinstance(p, Tensor):
        p = torch.as_tensor(p)
    if p.dim() == 1 and num_graphs == 1:
        p = p[None]
    if p.dim() != 2 or p.shape[0] != num_graphs or p.shape[1] != param_channels:
        raise ValueError(f"data.params must be [B={num_graphs}, K={param_channels}], got "
                         f"{tuple(p.shape)}")
    p = p.to(device=device, dtype=torch.float64)
    if checking() and not bool(torch.isfinite(p).all()):
        raise ValueError("data.params contains NaN or inf")
    return p


@torch.no_grad()
def fit_param_normalizer(model, samples) -> bool:
    """Fit the parameter statistics of ``model`` (a model with ``param_channels > 0``)
    on the training ``samples`` (each with ``params [1, K]``), once: each sample counts
    once. Returns whether anything was fitted (False: no conditioning, or already
    fitted, e.g. a resumed or loaded model)."""
    cond = getattr(model, "conditioning", None)
    if cond is None or bool(cond.params_normalizer.fitted):
        return False
    from torch_geometric.data import Data

    norm = cond.params_normalizer
    if cond.given == 0:  # input means only: already standardised by the input normaliser
        norm.fitted.fill_(True)
        return True
    rows = []
    for s in samples:
        p = getattr(s, "params", None)
        if p is None:
            raise ValueError(f"sample {getattr(s, 'source', '') or ''!r} has no params; the model "
                             f"was built with param_channels={cond.given}")
        rows.append(Data(params=torch.as_tensor(p).reshape(1, -1).to(torch.float64),
                         weight=torch.ones(1, dtype=torch.float64)))
    fitted = UnitGaussianNormalizer(cond.given).fit(rows, "params")
    norm.mean[:cond.given] = fitted.mean
    norm.std[:cond.given] = fitted.std
    norm.fitted.fill_(True)
    return True
