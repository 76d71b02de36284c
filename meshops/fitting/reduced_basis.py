"""Fitting a :class:`~meshops.models.ReducedBasis`: three regressions, the one with the
lowest validation error kept, then refitted on every training sample.

1. The training split's snapshots give a weighted POD basis
   (:func:`~meshops.reduced.pod_basis`) and modal coefficients.
2. Each regression from the standardised parameters to the coefficients is fitted on
   the training split and scored on the validation split with the metric of every
   meshops run (per-sample relative L2 error, quadrature-weighted, the mean over the
   target fields):
   the thin-plate spline (POD + RBF, the classical model), Gaussian processes, an
   ensemble of MLPs whose size fills its share of the time budget, and the mean of
   the last two.
3. The best is refitted, with the same settings, on the training and validation
   samples together: a reduced basis gains from every snapshot, and the selection was
   made before.

Validation samples on another mesh of the geometry (``--val-data`` meshed otherwise)
are scored on their own points, the basis carried over by moving least squares as at
prediction (:meth:`~meshops.models.ReducedBasis.basis_at`); they are left out of the
refit, whose snapshots are values at the training mesh's nodes.
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

from meshops.datasets.fields import TargetFields, field_mean
from meshops.reduced.ensemble import MLPEnsemble, train_ensemble
from meshops.reduced.parameters import informative_columns, sample_parameters
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
    num_refit: int | None = None     # default: every training and validation sample

    def lines(self) -> list[str]:
        out = [f"reduced basis: {self.rank} POD mode(s) ({100 * self.captured:.8g} % of the "
               f"energy) of {self.num_train} training samples; parameters: {self.parameters}"]
        for c in self.candidates:
            how = ", ".join(f"{k} {v}" for k, v in c.settings.items())
            out.append(f"  candidate {c.name:<6} validation rel. L2 mean {c.mean:.4e} "
                       f"(median {np.median(c.errors):.4e}, worst {np.max(c.errors):.4e})"
                       f"  {c.seconds:.0f} s" + (f"  [{how}]" if how else ""))
        total = self.num_train + self.num_val
        refit = total if self.num_refit is None else self.num_refit
        where = (f"all {total} samples" if refit == total else
                 f"the {refit} samples on the training mesh (the {total - refit} validation "
                 f"samples are on other meshes)")
        out.append(f"chosen: {self.chosen} (lowest mean validation error on {self.num_val} "
                   f"samples), refitted on {where}")
        return out


def _parameters(samples: Sequence) -> tuple[Tensor, str]:
    """The ``[S, K]`` parameters of ``samples`` and where they came from
    (:func:`sample_parameters`)."""
    params, source = sample_parameters(samples)
    if params is None:
        raise ValueError(f"a reduced basis needs a parameter vector per sample: {source}")
    return params, source


def _arrays(samples: Sequence) -> tuple[Tensor, Tensor, Tensor, str]:
    """Parameters ``[S, K]``, snapshots ``[S, M, C]`` and weights ``[M]`` of samples on
    one mesh, and where the parameters came from."""
    from meshops.training.baselines import target_points

    params, source = _parameters(samples)
    y = torch.stack([s.y.to(torch.float64) for s in samples])
    weight = torch.stack([target_points(s)[1].to(torch.float64) for s in samples]).mean(0)
    return params, y, weight, source


def _relative_errors(pred: Sequence[Tensor], samples: Sequence,
                     fields: TargetFields | None) -> np.ndarray:
    """Per-sample relative L2 errors ``[S]`` of the predictions ``[m, C]`` against their
    samples' ``y``, with each sample's own quadrature weights (its points need not be
    the training mesh's): each field's, averaged over the target ``fields`` (``None``:
    all channels pooled), as :func:`meshops.training.loss.relative_lp` computes them."""
    from meshops.training.baselines import target_points

    parts = [slice(None)] if fields is None else list(fields.slices().values())
    rows = []
    for p, s in zip(pred, samples):
        y, w = s.y.to(torch.float64), target_points(s)[1].to(torch.float64)[:, None]
        p = p.reshape(y.shape)
        rows.append(torch.stack([((w * (p[:, sl] - y[:, sl]).square()).sum()
                                  / (w * y[:, sl].square()).sum()).sqrt() for sl in parts]))
    return field_mean(torch.stack(rows), fields).numpy()


def _standardiser(params: Tensor) -> tuple[list[int], Tensor, Tensor]:
    if params.shape[0] < 2:
        raise ValueError("a reduced basis needs several training samples, whose parameters "
                         "vary; there is one")
    spread = params.std(0)
    index = informative_columns(params)
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
                      fields: TargetFields | None = None,
                      score: Callable[[Sequence[Tensor], Sequence], np.ndarray] | None = None):
    """Fit a :class:`~meshops.models.ReducedBasis` (see the module docstring).

    Args:
        train: Training samples on one mesh (or corresponding grids), each with a
            parameter vector (``params`` or constant input fields) and ``y``.
        val: Validation samples, the same way; on the training mesh, or on any other
            mesh of the geometry, where the candidates are scored on the sample's own
            points (the basis carried over as :meth:`ReducedBasis.basis_at` does).
        minutes: Time budget; the MLP ensemble's size is chosen so that the fit,
            refits included, ends within :data:`BUDGET_SHARE` of it (from a timed probe,
            so it depends on the machine's speed).
        seed: Seed of the MLPs' initial weights and of the GP's fitting subset.
        regressors: The candidates.
        members: The MLP ensemble's size instead of the budget's: with the same seed
            the fit is then repeated exactly on one machine. The global random state
            is left as it was either way.
        log: Called with a line per finished candidate.
        fields: The target fields whose mean relative error scores the candidates
            (:mod:`meshops.datasets.fields`; ``None``: all channels pooled).
        score: The validation error per sample that chooses the regression instead,
            ``score(pred, val) -> [V]``, ``pred`` the ``[m, C]`` predictions at each
            validation sample's target points (default: the relative L2 error of
            ``fields`` above, quadrature-weighted).

    Returns:
        ``(model, report)``: the chosen regression refitted on ``train`` and the
        validation samples on the training mesh, and a :class:`FitReport`.

    Raises:
        ValueError: No parameter vectors, parameters that do not vary, no validation
            samples, a validation grid of another size than the training grids.
    """
    if not val:
        raise ValueError("a reduced basis chooses its regression on validation samples; "
                         "none were given")
    # The fit draws from its own seed and leaves the caller's random state as it was:
    # a model built next (a series run's next-step model) must not depend on how many
    # MLPs the clock allowed here.
    with torch.random.fork_rng(devices=[]):
        return _fit(train, val, minutes, seed, regressors, members, log, fields, score)


def _fit(train, val, minutes, seed, regressors, members, log, fields, score):
    """:func:`fit_reduced_basis` after its checks (the same arguments)."""
    start = time.perf_counter()
    p_tr, y_tr, w, source = _arrays(train)
    p_val, _ = _parameters(val)
    if score is None:
        def score(pred, samples):
            return _relative_errors(pred, samples, fields)
    fit = _Candidates(train, val, p_tr, y_tr, w, p_val, seed, log, score)
    fit.run(regressors, members, start + BUDGET_SHARE * 60 * minutes, minutes)
    if not fit.candidates:
        raise ValueError("no regression could be fitted to these parameters")
    best = min(fit.candidates, key=lambda c: (math.isnan(c.mean), c.mean))
    # The validation samples on the training mesh are snapshots too; the others only
    # served the choice (transferred, their values are not the basis' nodes').
    everything = list(train) + [v for v, same in zip(val, fit.on_mesh) if same]
    p_all, y_all, w_all, _ = _arrays(everything)
    model, basis = _build(best.name, everything, p_all, y_all, w_all, best.settings, seed)
    report = FitReport(fit.candidates, best.name, basis.rank, basis.captured, source,
                       len(train), len(val), time.perf_counter() - start, len(everything))
    return model, report


class _Candidates:
    """The candidate regressions fitted on the training samples and scored on the
    validation samples, each on its own points."""

    def __init__(self, train, val, p_tr, y_tr, w, p_val, seed, log, score) -> None:
        self.train, self.val, self.p_tr, self.y_tr, self.w = train, val, p_tr, y_tr, w
        self.p_val, self.seed, self.log, self.score = p_val, seed, log, score
        self.candidates: list[Candidate] = []
        self.predictions: dict[str, list[Tensor]] = {}
        self.bases: list | None = None      # (mean, modes) at each validation sample
        self.on_mesh: list[bool] = []

    def _score(self, model) -> list[Tensor]:
        """The predictions of ``model`` on the validation samples' points."""
        if self.bases is None:   # the POD basis is the same for every candidate
            self.bases = _validation_bases(model, self.val)
            self.on_mesh = [mean is model.mean for mean, _ in self.bases]
        with torch.no_grad():
            coef = model.coefficients(self.p_val)
        return [mean + torch.einsum("r,rmc->mc", c, modes)
                for c, (mean, modes) in zip(coef, self.bases)]

    def _add(self, name: str, pred: list[Tensor], seconds: float, settings: dict) -> None:
        self.predictions[name] = pred
        self.candidates.append(Candidate(name, self.score(pred, self.val),
                                         seconds, settings))
        if self.log:
            self.log(FitReport(self.candidates[-1:], "", 0, 0, "", 0, 0, 0).lines()[1])

    def run(self, regressors, members, deadline: float, minutes: float) -> None:
        # The MLP candidate comes last and gets what is left, planned so that the worst
        # case fits: it is chosen together with the GP, and both are refitted.
        for name in sorted(regressors, key=lambda r: r == "mlp"):
            t0 = time.perf_counter()
            settings = {}
            if name == "mlp":
                settings = self._mlp(members, deadline, t0)
                if settings is None:
                    if self.log:
                        self.log(f"  candidate mlp: not fitted (no time left in the "
                                 f"{minutes:g}-minute budget)")
                    continue
            try:
                model, _ = _build(name, self.train, self.p_tr, self.y_tr, self.w, settings,
                                  self.seed)
            except ValueError as e:  # e.g. a spline through repeated parameter vectors
                if self.log:
                    self.log(f"  candidate {name}: not available ({e})")
                continue
            self._add(name, self._score(model), time.perf_counter() - t0, settings)
        if "gp" in self.predictions and "mlp" in self.predictions:
            # Their mean: the two err in different ways (smooth interpolation against a
            # fitted network), so averaging often beats both; it costs no new fit here.
            blend = [(a + b) / 2 for a, b in zip(self.predictions["gp"],
                                                 self.predictions["mlp"])]
            settings = next(c.settings for c in self.candidates if c.name == "mlp")
            self._add("gp+mlp", blend, 0.0, settings)

    def _mlp(self, members, deadline: float, t0: float) -> dict | None:
        """The MLP ensemble's settings: ``members`` given, or what the time left fits."""
        if members:
            return {"members": members, "epochs": MLP_EPOCHS}
        gp = sum(c.seconds for c in self.candidates if c.name == "gp")
        left = (deadline - t0 - REFIT_FACTOR * gp) / (1 + REFIT_FACTOR)
        with _one_thread():
            rank = pod_basis(self.y_tr, self.w).rank
        return _mlp_settings(left, len(self.train), rank, self.p_tr.shape[1])


def _validation_bases(model, val: Sequence) -> list[tuple[Tensor, Tensor]]:
    """The basis (mean ``[m, C]``, modes ``[r, m, C]``) at each validation sample's
    target points: as stored on the training mesh, carried over elsewhere."""
    from meshops.training.baselines import target_points

    out = []
    for s in val:
        try:
            out.append(model.basis_at(target_points(s)[0]))
        except ValueError as e:  # a grid of another size
            name = getattr(s, "source", None) or "a validation sample"
            raise ValueError(f"{name}: {e}") from None
    return out
