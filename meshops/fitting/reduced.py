"""The reduced fit: a run of a :class:`~meshops.models.ReducedBasis`, fitted in one go
(no epochs), its regression chosen on the validation split, written like any run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from meshops.errors import UsageError
from meshops.fitting.config import FIT, option_name
from meshops.fitting.outcome import Training
from meshops.inference.predict import RUN_CHECKPOINT
from meshops.runs.choice import Choice
from meshops.runs.run_folder import RUN_CONFIG
from meshops.utils.progress import NOTE

log = logging.getLogger(__name__)

# Options of gradient training that a fitted reduced basis does not use: a note (they
# are chosen from the data for the other models, and a config file may set them) ...
_TRAINING_ONLY = ("epochs", "batch_size", "lr")
# ... and options that would change what a run is, refused unless they leave it off (the
# values here; --logger none too, nothing to log): the reduced basis has no weights
# trained in steps to compile, checkpoint, log or average over seeds.
_REFUSED = {"ensemble": (1,), "amp": (None,), "compile": (False,),
            "checkpoint_blocks": (False,), "logger": (None, [])}


def fit_reduced_run(request, cfg, chosen: str, train_samples, val_samples, run) -> Training:
    """Fit, save ``best.pt``, ``config.yaml`` and ``history.json`` in the run folder, and
    say the candidates next to the baselines on the validation samples (``run``: the
    run's files, :class:`meshops.fitting.train._RunFiles`)."""
    from meshops.fitting.reduced_basis import fit_reduced_basis

    out = run.out
    _check_options(request, cfg, val_samples)
    unused = [option_name(k, request.source) for k in _TRAINING_ONLY
              if getattr(cfg, k) is not None]
    regressors, members = reduced_options(cfg.model_config)
    if request.dry_run:
        return Training(cfg, choice=Choice("reduced_basis", chosen), dry_run=True)
    metadata = run.metadata(cfg.render(), train_samples)
    run.prepare()
    if chosen:
        log.info(f"defaults from the data: {chosen}")
    if unused:
        log.info(f"{', '.join(unused)} do not apply to reduced_basis (it is fitted, not "
                 f"trained by epochs); {option_name('model', request.source, 'pit')} trains "
                 f"a neural operator", extra=NOTE)
    log.info(f"fitting reduced_basis on {len(train_samples)} meshes of {cfg.data}, choosing "
             f"on {len(val_samples)}, within {cfg.minutes:g} minutes; writing {out}/")
    try:
        model, report = fit_reduced_basis(train_samples, val_samples, minutes=cfg.minutes,
                                          seed=cfg.seed, regressors=regressors,
                                          members=members, log=log.info, fields=run.fields)
    except ValueError as e:
        raise UsageError(str(e)) from None
    lines = report.lines()
    log.info(lines[0])
    log.info(lines[-1])
    cfg = cfg.with_options("defaults", model_config=_options(cfg, report, members,
                                                             request.source))
    _write(out, cfg, model, metadata, report, lines[-1])
    best = next(c for c in report.candidates if c.name == report.chosen)
    log.info(validation_table(train_samples, val_samples, f"reduced_basis ({report.chosen})",
                              best.errors, run.fields))
    log.info(f"wrote {out / RUN_CHECKPOINT} ({report.seconds / 60:.1f} min)")
    return Training(cfg, choice=Choice(
        "reduced_basis", chosen, lines[-1], "l2_mean",
        {c.name: c.mean for c in report.candidates}))


def _options(cfg, report, members, source: str) -> dict:
    """The model_config that repeats the fit (the MLP ensemble's size the clock chose),
    said when the chosen regression has that ensemble."""
    options = dict(cfg.model_config)
    mlp = next((c for c in report.candidates if c.name == "mlp"), None)
    if mlp is not None and members is None:
        n = options["members"] = mlp.settings["members"]  # the choice repeats with it
        if "mlp" in report.chosen.split("+"):  # said only of a chosen ensemble
            again = (f'model_config={{"members": {n}}}' if source == FIT else
                     f"--model-config members={n}")
            log.info(f"the MLP ensemble's {n} member{'s fit' if n > 1 else ' fits'} the "
                     f"{cfg.minutes:g}-minute budget ({again} repeats this run exactly)")
    return options


def _write(out, cfg, model, metadata: dict, report, selected: str) -> None:
    """The run's files: config.yaml (the options, usable as --config, not the model's
    internals), best.pt and history.json."""
    from meshops.utils.atomic import atomic_write

    best = next(c for c in report.candidates if c.name == report.chosen)
    atomic_write(out / RUN_CONFIG, lambda tmp: Path(tmp).write_text(cfg.render()))
    model.save(out / RUN_CHECKPOINT, **metadata, epoch=None, metric="l2",
               val={"l2_mean": best.mean}, selected=selected)
    atomic_write(out / "history.json",
                 lambda tmp: Path(tmp).write_text(json.dumps(_history(report), indent=1)))


def _history(report) -> dict:
    """``history.json`` of a fit: every candidate's validation errors, the choice."""
    return {"candidates": [{"name": c.name, "val_l2": [float(e) for e in c.errors],
                            "val_l2_mean": c.mean, "seconds": c.seconds,
                            "settings": c.settings} for c in report.candidates],
            "chosen": report.chosen, "rank": report.rank, "captured": report.captured,
            "parameters": report.parameters, "seconds": report.seconds}


def _check_options(request, cfg, val_samples) -> None:
    """What a reduced basis cannot do, refused before anything is written."""
    say = lambda key, value=None: option_name(key, request.source, value)  # noqa: E731
    if request.resume:
        raise UsageError(f"{cfg.out}: a reduced basis is fitted in one go, there is nothing "
                         f"to resume; run again without {say('resume')} (and another "
                         f"{say('out')})")
    given = [k for k, off in _REFUSED.items() if getattr(cfg, k) not in off]
    if given:
        raise UsageError(f"{say(given[0])} does not apply to reduced_basis (it is fitted, not "
                         f"trained by epochs: nothing to compile, checkpoint, log or average "
                         f"over seeds); leave it out, or pass {say('model', 'pit')} to train "
                         f"a neural operator")
    if not val_samples:
        raise UsageError(f"the reduced_basis model chooses its regression on validation "
                         f"samples: use {say('val_fraction', 'F')} with F > 0 or "
                         f"{say('val_data', 'DIR')}")


def reduced_options(model_config: dict, model: str = "reduced_basis"
                    ) -> tuple[list[str], int | None]:
    """The reduced basis' options from ``model_config``: ``regressors`` (the candidates,
    a list or ``"a,b"``) and ``members`` (the MLP ensemble's size); ``model`` names the
    model in the errors (``reduced_basis`` or ``trajectory_basis``)."""
    REGRESSORS = ("rbf", "gp", "mlp")  # fitted; "gp+mlp" follows from gp and mlp

    extra = sorted(set(model_config) - {"regressors", "members"})
    if extra:
        raise UsageError(f"model_config for {model}: unknown key(s) {', '.join(extra)}; "
                       f"valid: regressors=A,B (from {', '.join(REGRESSORS)}), members=N")
    regressors = model_config.get("regressors", ["rbf", "gp", "mlp"])
    if isinstance(regressors, str):
        regressors = [r.strip() for r in regressors.split(",") if r.strip()]
    if not isinstance(regressors, list) or not regressors or \
            any(r not in REGRESSORS for r in regressors):
        raise UsageError(f"model_config for {model}: regressors must name some of "
                       f"{', '.join(REGRESSORS)}, got {regressors!r}")
    members = model_config.get("members")
    if members is not None and (isinstance(members, bool) or not isinstance(members, int)
                                or members < 1):
        raise UsageError(f"model_config for {model}: members must be an integer >= 1, "
                       f"got {members!r}")
    return regressors, members


def validation_table(train_samples, val_samples, name: str, errors, fields=None) -> str:
    """The model's validation errors next to the baselines fitted on the training split
    (the text table of :func:`meshops.training.baselines.format_table`), the mean over
    the target ``fields``."""
    from meshops.runs.comparison import standing
    from meshops.training.baselines import baselines, error_stats, format_table

    rows = [(name, error_stats(errors), "")]
    rows += [(b.name, error_stats(b.errors["l2"]) if b.available else None, b.note)
             for b in baselines(train_samples, val_samples, fields)]
    what = "rel. L2, quadrature-weighted" + (
        f", mean of the fields {', '.join(fields.names)}" if fields and len(fields) > 1 else "")
    means = {n: st["mean"] for n, st, _ in rows[1:] if st is not None}
    return (f"validation ({len(val_samples)} samples) against the baselines fitted on the "
            f"same {len(train_samples)} training samples:\n" + format_table(rows, what)
            + f"\n  mean: {standing(name, rows[0][1]['mean'], means)}")
