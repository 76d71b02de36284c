"""Which model a time-series fit keeps: a trajectory basis or the next-step model.

For series on one mesh with the same time steps (and no input fields),
:class:`~meshops.models.trajectory_basis.TrajectoryBasis` (POD of whole trajectories,
coefficients regressed on the parameters or the first state) is fitted first, within
:data:`TRAJECTORY_SHARE` of ``--minutes``; the next-step model trains in the time left.
Both are scored on the validation series by the metric of ``meshops evaluate``: the
relative L2 error of every step of a rollout from step 0, averaged over the steps and
the series. The lower one becomes ``RUN/best.pt``; the other stays beside it:

* ``RUN/trajectory_basis.pt``: the trajectory basis, refitted on every series;
* ``RUN/next_step.pt``: the next-step model's best epoch, when the basis was chosen
  (``RUN/last.pt`` and ``--resume`` continue its training, and the choice is made
  again at the end);
* ``RUN/choice.json``: both validation errors per series and the choice.

With ``--epochs`` the basis' MLP ensemble has the most members the budget would give
(:data:`~meshops.fitting.reduced_basis.MLP_MAX_MEMBERS`), not what the clock allows,
so that the run repeats bit for bit with the same seed on any machine and whatever
``--minutes``.

``--model trajectory_basis`` fits the basis alone; ``--model NAME`` (an operator)
trains the next-step model alone; series on meshes that differ get the next-step model.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshops.errors import UsageError
from meshops.fitting.outcome import Training
from meshops.runs.choice import Choice
from meshops.runs.run_folder import CANDIDATE, CHOICE, NEURAL
from meshops.utils.progress import NOTE

#: The most of ``--minutes`` the trajectory basis may take before the next-step model.
TRAJECTORY_SHARE = 0.3
METRIC = ("mean over the steps and series of the relative L2 error of each step of the "
          "validation rollouts from step 0 (quadrature-weighted)")
log = logging.getLogger(__name__)


def series_errors(model, series, targets, inputs, time_input: bool) -> np.ndarray:
    """Per series, the mean over its steps of the relative L2 error of the model's
    rollout from step 0 (``[S]``; NaN steps, a true state of zero, left out)."""
    from meshops.inference.predict import model_tensor
    from meshops.runs.horizon import step_errors
    from meshops.training.rollout import rollout, rollout_sample

    dtype = model_tensor(model).dtype
    out = []
    for s in series:
        sample = rollout_sample(s, targets, inputs, 0, len(s) - 1, time_input, dtype,
                                with_targets=False)
        pred = rollout(model, sample)
        e = step_errors(pred, s.channels(targets)[1:], s.mesh.weight)
        e[~np.isfinite(pred.numpy()).all((1, 2))] = np.inf
        out.append(np.nanmean(e))
    return np.asarray(out)


def _not_applicable(cfg, data) -> str | None:
    from meshops.fitting.trajectory_basis import trajectory_applies

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return "a distributed run (torchrun)"
    return trajectory_applies(data.train, data.val, cfg.inputs)


@dataclass
class Plan:
    """The candidates of a run (``mode``: ``"none"`` the next-step model alone,
    ``"with"`` both, ``"only"`` the trajectory basis alone), the fitted basis and its
    validation errors per series, and the user's ``--minutes``."""

    mode: str
    minutes: float
    note: str = ""
    model: object = None
    errors: list = field(default_factory=list)
    selected: str = ""
    seconds: float = 0.0

    def fit(self, cfg, data, minutes: float, regressors=("rbf", "gp", "mlp"), members=None):
        """Fit the trajectory basis within ``minutes`` (saying its candidates)."""
        from meshops.fitting.trajectory_basis import fit_trajectory_basis

        log.info(f"fitting a trajectory basis on {len(data.train)} series of {cfg.data}, "
                 f"choosing its regression on {len(data.val)}, within {minutes:.3g} minutes")
        t0 = time.perf_counter()
        self.model, report = fit_trajectory_basis(
            data.train, data.val, cfg.targets, minutes=minutes, seed=cfg.seed, log=log.info,
            regressors=regressors, members=members)
        self.seconds = time.perf_counter() - t0
        lines = report.lines()
        log.info(lines[0])
        log.info(lines[-1])
        self.selected = lines[-1]
        best = next(c for c in report.candidates if c.name == report.chosen)
        self.errors = [float(e) for e in best.errors]
        return report

    def budget(self, cfg):
        """The config whose ``minutes`` is the time left for the next-step model."""
        if not self.seconds:
            return cfg
        left = max(cfg.minutes - self.seconds / 60, 0.05 * cfg.minutes)
        return cfg.with_options("defaults", minutes=float(f"{left:.3g}"))

    def metadata(self) -> dict:
        return {"candidates": ["trajectory_basis", "next_step"]} if self.mode == "with" else {}

    def candidate_metadata(self, metadata: dict) -> dict:
        """The basis' checkpoint metadata: the run's, with its own validation errors
        (its conditions always carry ``t``)."""
        mean = float(np.nanmean(self.errors))
        return dict(metadata, time_input=True, epoch=None, metric="rollout",
                    val={"rollout_mean": mean}, val_errors=self.errors,
                    selected=self.selected)

    def begin(self, out: Path, resuming: bool, metadata: dict) -> None:
        """Before training: a new run writes the basis (and removes an earlier run's
        candidates); a resumed one gives the next-step model its best.pt back."""
        from meshops.inference.predict import RUN_CHECKPOINT

        if self.mode != "with":
            return
        if resuming:
            if (out / NEURAL).is_file():
                os.replace(out / NEURAL, out / RUN_CHECKPOINT)
            return
        for name in (NEURAL, CHOICE):
            (out / name).unlink(missing_ok=True)
        self.model.save(out / CANDIDATE, **self.candidate_metadata(metadata))

    def choose(self, out: Path, data, metadata: dict, choice: Choice) -> Choice:
        """After training: score the next-step model's best epoch, keep the better
        (``choice``: the next-step model's, returned when there is no other)."""
        from meshops.inference.predict import RUN_CHECKPOINT
        from meshops.models import NeuralOperator

        if self.mode != "with":
            return choice
        neural = NeuralOperator.from_checkpoint(out / RUN_CHECKPOINT).eval()
        n_err = series_errors(neural, data.val, metadata["targets"], metadata["inputs"],
                              bool(metadata.get("time_input", True)))
        scores = {"trajectory_basis": float(np.nanmean(self.errors)),
                  "next_step": float(np.nanmean(n_err))}
        pick = min(scores, key=lambda k: (not np.isfinite(scores[k]), scores[k]))
        if pick == "trajectory_basis":
            os.replace(out / RUN_CHECKPOINT, out / NEURAL)
            self.model.save(out / RUN_CHECKPOINT, **self.candidate_metadata(metadata))
        _write_choice(out, pick, scores, data.val, self.errors, n_err, self.selected)
        name = getattr(neural.operator, "model_name", "")
        log.info(f"validation ({len(data.val)} series; {METRIC}):")
        log.info(f"  trajectory_basis  {scores['trajectory_basis']:.4e}  ({self.selected})")
        log.info(f"  next_step {name:<7} {scores['next_step']:.4e}")
        other = out / (NEURAL if pick == "trajectory_basis" else CANDIDATE)
        log.info(f"chosen: {pick} (the lower validation error): {out / RUN_CHECKPOINT}; the "
                 f"other: {other}")
        basis = pick == "trajectory_basis"
        return Choice(pick if basis else choice.model, choice.reason,
                      f"{pick} (the lower validation error)", "rollout", scores,
                      None if basis else choice.epoch)


def _write_choice(out: Path, pick: str, scores: dict, val, basis_errors, neural_errors,
                  selected: str) -> None:
    from meshops.utils.atomic import atomic_write

    record = {"chosen": pick, "metric": METRIC, "val_series": [s.name for s in val],
              "candidates": {
                  "trajectory_basis": {"val_mean": scores["trajectory_basis"],
                                       "val_errors": list(basis_errors), "fit": selected,
                                       "file": CANDIDATE},
                  "next_step": {"val_mean": scores["next_step"],
                                "val_errors": [float(e) for e in neural_errors],
                                "file": NEURAL if pick == "trajectory_basis" else "best.pt"}}}
    atomic_write(out / CHOICE, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1)))


def _resumed(out: Path, minutes: float, source: str) -> Plan:
    """The plan of a resumed run with both candidates: the basis read back (``source``:
    whose words the error uses)."""
    from meshops.errors import CheckpointError
    from meshops.fitting.config import option_name
    from meshops.models.trajectory_basis import TrajectoryBasis

    path = out / CANDIDATE
    try:
        model = TrajectoryBasis.from_checkpoint(path)
    except (FileNotFoundError, CheckpointError) as e:
        raise UsageError(f"{out}: {option_name('resume', source)} of a run with a trajectory "
                         f"basis, but {path} cannot be read ({e}); start a new run with "
                         f"another {option_name('out', source)}") from None
    meta = model.metadata
    return Plan("with", minutes, "", model, list(meta.get("val_errors") or []),
                str(meta.get("selected", "")))


def plan(cfg, data, resumed: dict | None, dry_run: bool, source: str = "command line"
         ) -> Plan:
    """The candidates of this run (see the module docstring); a new run with both fits
    the basis here (not with ``--dry-run``). ``source``: whose words the errors use
    (:func:`~meshops.fitting.config.option_name`)."""
    from meshops.fitting.config import option_name

    if cfg.model == "trajectory_basis":
        why = _not_applicable(cfg, data)
        if why:
            raise UsageError(f"{option_name('model', source, 'trajectory_basis')} does not "
                             f"apply to {cfg.data}: {why}")
        return Plan("only", cfg.minutes)
    if resumed is not None:
        if "trajectory_basis" in (resumed.get("candidates") or []):
            return _resumed(Path(cfg.out), cfg.minutes, source)
        return Plan("none", cfg.minutes)
    if cfg.model is not None:
        return Plan("none", cfg.minutes)
    from meshops.fitting.reduced_basis import MLP_MAX_MEMBERS

    why = _not_applicable(cfg, data)
    if why:
        return Plan("none", cfg.minutes, f"the next-step model alone (no trajectory basis: "
                                          f"{why})")
    p = Plan("with", cfg.minutes, "a trajectory basis first, then the next-step model; the "
                                  "lower validation error is kept")
    if dry_run:
        return p
    # --epochs fixes the run's length, so the basis' MLP ensemble gets a fixed size, not
    # what the clock allows: the run then repeats exactly whatever --minutes or machine.
    members = MLP_MAX_MEMBERS if cfg.epochs is not None else None
    try:
        p.fit(cfg, data, TRAJECTORY_SHARE * cfg.minutes, members=members)
    except ValueError as e:  # e.g. parameters that do not vary
        log.info(f"no trajectory basis ({e}); training the next-step model alone", extra=NOTE)
        return Plan("none", cfg.minutes)
    return p


def fit_only_run(request, cfg, data, p: Plan, metadata_of) -> Training:
    """``--model trajectory_basis``: fit the basis alone and write the run
    (``metadata_of(resolved config)``: the run's checkpoint metadata)."""
    from meshops.fitting.config import option_name
    from meshops.fitting.out_folder import clear_run_files
    from meshops.fitting.reduced import reduced_options
    from meshops.fitting.training_run import check_writable_folder
    from meshops.inference.predict import RUN_CHECKPOINT
    from meshops.runs.run_folder import RUN_CONFIG
    from meshops.utils.atomic import atomic_write

    out = Path(cfg.out)
    if request.resume:
        raise UsageError(f"{out}: a trajectory basis is fitted in one go, there is nothing to "
                         f"resume; run again without {option_name('resume', request.source)} "
                         f"(and another {option_name('out', request.source)})")
    regressors, members = reduced_options(cfg.model_config, "trajectory_basis")
    resolved = cfg.render()
    if request.dry_run:
        return Training(cfg, choice=Choice("trajectory_basis"), dry_run=True)
    check_writable_folder(out)
    clear_run_files(out)   # the candidates' files among them (run_folder.RUN_FILES)
    try:
        report = p.fit(cfg, data, cfg.minutes, regressors, members)
    except ValueError as e:
        raise UsageError(str(e)) from None
    metadata = metadata_of(resolved)
    atomic_write(out / RUN_CONFIG, lambda tmp: Path(tmp).write_text(resolved))
    p.model.save(out / RUN_CHECKPOINT, **p.candidate_metadata(metadata))
    history = {"candidates": [{"name": c.name, "val_errors": [float(e) for e in c.errors],
                               "val_mean": c.mean, "seconds": c.seconds,
                               "settings": c.settings} for c in report.candidates],
               "chosen": report.chosen, "rank": report.rank, "metric": METRIC}
    atomic_write(out / "history.json",
                 lambda tmp: Path(tmp).write_text(json.dumps(history, indent=1)))
    log.info(f"wrote {out / RUN_CHECKPOINT} ({p.seconds / 60:.1f} min)")
    return Training(cfg, choice=Choice("trajectory_basis", "", p.selected, "rollout",
                                       {c.name: c.mean for c in report.candidates}))
