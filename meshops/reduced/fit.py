"""Fitting a :class:`~meshops.models.ReducedBasis`: three regressions, the one with the
lowest validation error kept, then refitted on every training sample.

1. The training split's snapshots give a weighted POD basis
   (:func:`~meshops.reduced.pod_basis`) and modal coefficients.
2. Each regression from the standardised parameters to the coefficients is fitted on
   the training split and scored on the validation split with the metric of every
   meshops run (per-sample relative L2 error, quadrature-weighted, channels pooled):
   the thin-plate spline (POD + RBF, the classical model), Gaussian processes, an
   ensemble of MLPs whose size fills its share of the time budget, and the mean of
   the last two.
3. The best is refitted, with the same settings, on the training and validation
   samples together: a reduced basis gains from every snapshot, and the selection was
   made before.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from meshops.reduced.ensemble import MLPEnsemble, train_ensemble
from meshops.reduced.parameters import sample_parameters
from meshops.reduced.pod import pod_basis

#: MLP ensemble settings: epochs per member (fewer only when even one member would
#: not fit the time left), the most members, and the fewest epochs worth running.
MLP_EPOCHS = 3000
MLP_MAX_MEMBERS = 8
MLP_MIN_EPOCHS = 300
#: Share of the budget the fit plans for (reading the files and writing the run take
#: the rest), and how much longer a refit on train + validation samples may take than
#: the candidate's fit on the training split (1 / (1 - 0.2) with the default split).
BUDGET_SHARE = 0.85
REFIT_FACTOR = 1.25


@dataclass
class Candidate:
    """One regression's validation result: ``errors [V]`` per validation sample."""

    name: str
    errors: np.ndarray
    seconds: float
    settings: dict = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return float(np.mean(self.errors))


@dataclass
class FitReport:
    """What :func:`fit_reduced_basis` did: the candidates, the chosen one, the basis."""

    candidates: list[Candidate]
    chosen: str
    rank: int
    captured: float
    parameters: str
    num_train: int
    num_val: int
    seconds: float

    def lines(self) -> list[str]:
        out = [f"reduced basis: {self.rank} POD mode(s) ({100 * self.captured:.8g} % of the "
               f"energy) of {self.num_train} training samples; parameters: {self.parameters}"]
        for c in self.candidates:
            how = ", ".join(f"{k} {v}" for k, v in c.settings.items())
            out.append(f"  candidate {c.name:<6} validation rel. L2 mean {c.mean:.4e} "
                       f"(median {np.median(c.errors):.4e}, worst {np.max(c.errors):.4e})"
                       f"  {c.seconds:.0f} s" + (f"  [{how}]" if how else ""))
        out.append(f"chosen: {self.chosen} (lowest mean validation error on {self.num_val} "
                   f"samples), refitted on all {self.num_train + self.num_val} samples")
        return out


def _arrays(samples: Sequence) -> tuple[Tensor, Tensor, Tensor, str]:
    from meshops.training.baselines import target_points

    params, source = sample_parameters(samples)
    if params is None:
        raise ValueError(f"a reduced basis needs a parameter vector per sample: {source}")
    y = torch.stack([s.y.to(torch.float64) for s in samples])
    weight = torch.stack([target_points(s)[1].to(torch.float64) for s in samples]).mean(0)
    return params, y, weight, source


def _relative_errors(pred: Tensor, y: Tensor, weight: Tensor) -> np.ndarray:
    w = weight[None, :, None]
    num = (w * (pred - y).square()).sum((1, 2))
    den = (w * y.square()).sum((1, 2))
    return (num / den).sqrt().numpy()


def _standardiser(params: Tensor) -> tuple[list[int], Tensor, Tensor]:
    spread = params.std(0) if params.shape[0] > 1 else torch.zeros(params.shape[1])
    index = [int(i) for i in torch.nonzero(spread > 0).flatten()]
    if not index:
        raise ValueError("a reduced basis needs parameters that vary over the training "
                         "samples; every parameter is the same in all of them")
    return index, params[:, index].mean(0), spread[index]


def _build(name: str, samples: Sequence, params: Tensor, y: Tensor, weight: Tensor,
           settings: dict, seed: int):
    """A fitted :class:`ReducedBasis` with regressor ``name`` on these snapshots
    (``settings``: the MLP ensemble's ``members`` and ``epochs``)."""
    from meshops.models.reduced_basis import ReducedBasis
    from meshops.training.baselines import correspondence, target_points

    with _one_thread():
        basis = pod_basis(y, weight)
    index, shift, scale = _standardiser(params)
    s0 = samples[0]
    model = ReducedBasis(int(s0.x.shape[-1]), y.shape[2], int(s0.pos.shape[1]),
                         num_points=y.shape[1], rank=basis.rank, num_params=params.shape[1],
                         param_index=index, regressor=name, num_train=y.shape[0],
                         grid=correspondence(list(samples))[0] == "grid",
                         **{k: v for k, v in settings.items() if k != "epochs"})
    model.ref_pos.copy_(target_points(s0)[0].to(torch.float64))
    model.mean.copy_(basis.mean)
    model.modes.copy_(basis.modes)
    model.param_shift.copy_(shift)
    model.param_scale.copy_(scale)
    if basis.rank == 0:
        return model, basis
    x = model.standardise(params)
    coef = basis.coefficients(y, weight)
    names = name.split("+")
    parts = model.regressor.parts if len(names) > 1 else [model.regressor]
    # Small dense problems: one thread, which a shared machine's other processes cannot
    # stall (two threads spin-waiting on each other can, by 10x on a loaded machine).
    with _one_thread():
        for part, kind in zip(parts, names):
            if kind == "mlp":
                norm = (weight[None, :, None] * y.square()).sum((1, 2)).sqrt()
                train_ensemble(part, x, coef, norm, settings["epochs"], seed=seed)
            elif kind == "rbf":
                part.fit(x, coef)
            else:
                part.fit(x, coef, seed=seed)
    return model, basis


@contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _mlp_settings(seconds: float, num: int, rank: int, params: int) -> dict | None:
    """Members (and epochs) that fit ``seconds``, from a short timed run of a two-member
    ensemble; ``None`` when not even :data:`MLP_MIN_EPOCHS` of one member fit."""
    probe = MLPEnsemble(params, max(rank, 1), 2)
    x, c = torch.randn(num, params), torch.randn(num, max(rank, 1))
    t0 = time.perf_counter()
    with _one_thread():
        train_ensemble(probe, x, c, torch.ones(num), 20)
    per_epoch = (time.perf_counter() - t0) / 20 / 2
    members = int(min(MLP_MAX_MEMBERS, seconds // (per_epoch * MLP_EPOCHS)))
    if members >= 1:
        return {"members": members, "epochs": MLP_EPOCHS}
    epochs = int(seconds // per_epoch)
    return {"members": 1, "epochs": epochs} if epochs >= MLP_MIN_EPOCHS else None


def fit_reduced_basis(train: Sequence, val: Sequence, *, minutes: float = 10.0, seed: int = 0,
                      regressors: Sequence[str] = ("rbf", "gp", "mlp"),
                      members: int | None = None, log: Callable[[str], None] | None = None,
                      score: Callable[[Tensor, Tensor, Tensor], np.ndarray] | None = None):
    """Fit a :class:`~meshops.models.ReducedBasis` (see the module docstring).

    Args:
        train: Training samples on one mesh (or corresponding grids), each with a
            parameter vector (``params`` or constant input fields) and ``y``.
        val: Validation samples, the same way.
        minutes: Time budget; the MLP ensemble's size is chosen so that the fit,
            refits included, ends within :data:`BUDGET_SHARE` of it (from a timed probe,
            so it depends on the machine's speed).
        seed: Seed of the MLPs' initial weights and of the GP's fitting subset.
        regressors: The candidates.
        members: The MLP ensemble's size instead of the budget's: with the same seed
            the fit is then repeated exactly on one machine.
        log: Called with a line per finished candidate.
        score: The validation error per sample, ``score(pred [V, M, C], y [V, M, C],
            weight [M]) -> [V]``, that chooses the regression (default: the relative
            L2 error, quadrature-weighted, channels pooled).

    Returns:
        ``(model, report)``: the chosen regression refitted on ``train + val``, and a
        :class:`FitReport`.

    Raises:
        ValueError: No parameter vectors, parameters that do not vary, no validation
            samples.
    """
    if not val:
        raise ValueError("a reduced basis chooses its regression on validation samples; "
                         "none were given")
    start = time.perf_counter()
    deadline = start + BUDGET_SHARE * 60 * minutes
    p_tr, y_tr, w, source = _arrays(train)
    p_val, y_val, _, _ = _arrays(val)
    score = score or _relative_errors
    candidates, predictions = [], {}
    # The MLP candidate comes last and gets what is left, planned so that the worst
    # case fits: it is chosen together with the GP, and both are refitted.
    order = sorted(regressors, key=lambda r: r == "mlp")
    for name in order:
        t0 = time.perf_counter()
        settings = {}
        if name == "mlp":
            gp = sum(c.seconds for c in candidates if c.name == "gp")
            left = (deadline - t0 - REFIT_FACTOR * gp) / (1 + REFIT_FACTOR)
            with _one_thread():
                rank = pod_basis(y_tr, w).rank
            settings = {"members": members, "epochs": MLP_EPOCHS} if members else \
                _mlp_settings(left, len(train), rank, p_tr.shape[1])
            if settings is None:
                if log:
                    log(f"  candidate mlp: not fitted (no time left in the {minutes:g}-minute "
                        f"budget)")
                continue
        try:
            model, basis = _build(name, train, p_tr, y_tr, w, settings, seed)
        except ValueError as e:  # e.g. a spline through repeated parameter vectors
            if log:
                log(f"  candidate {name}: not available ({e})")
            continue
        with torch.no_grad():
            pred = basis.expand(model.coefficients(p_val))
        predictions[name] = pred
        candidates.append(Candidate(name, score(pred, y_val, w),
                                    time.perf_counter() - t0, settings))
        if log:
            log(FitReport(candidates[-1:], "", 0, 0, "", 0, 0, 0).lines()[1])
    if "gp" in predictions and "mlp" in predictions:
        # Their mean: the two err in different ways (smooth interpolation against a
        # fitted network), so averaging often beats both; it costs no new fit here.
        blend = (predictions["gp"] + predictions["mlp"]) / 2
        settings = next(c.settings for c in candidates if c.name == "mlp")
        candidates.append(Candidate("gp+mlp", score(blend, y_val, w), 0.0,
                                    settings))
        if log:
            log(FitReport(candidates[-1:], "", 0, 0, "", 0, 0, 0).lines()[1])
    if not candidates:
        raise ValueError("no regression could be fitted to these parameters")
    best = min(candidates, key=lambda c: (math.isnan(c.mean), c.mean))
    everything = list(train) + list(val)
    p_all, y_all, w_all, _ = _arrays(everything)
    model, basis = _build(best.name, everything, p_all, y_all, w_all, best.settings, seed)
    report = FitReport(candidates, best.name, basis.rank, basis.captured, source, len(train),
                       len(val), time.perf_counter() - start)
    return model, report
