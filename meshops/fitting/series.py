"""Fitting a time-series run (:func:`meshops.fit` with ``series=True``): read the
series, fit a trajectory basis on one mesh (:mod:`~meshops.fitting.series_choice`), train
the next-step model on windows of ``rollout_train`` steps and keep the better.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from meshops.errors import UsageError
from meshops.fitting.config import FIT, option_name, plural
from meshops.fitting.outcome import Training
from meshops.runs.series import SERIES_KEY, read_folder
from meshops.training.distributed import is_main_rank

#: Options of meshops train that a time-series run does not take, with the values that
#: leave them off (their defaults; ``--logger none`` too).
_NOT_FOR_SERIES = {"tags": ([],), "ensemble": (1,), "lazy": (None,), "cache": (None,),
                   "workers": (None,), "shards": (None,), "compile": (False,),
                   "checkpoint_blocks": (False,), "logger": (None, [])}


def _shapes(series, fields) -> dict:
    return {k: [int(n) for n in series.fields[k].shape[2:]] for k in fields}


def _mean_dt(series) -> float:
    import torch

    return float(torch.cat([s.times[1:] - s.times[:-1] for s in series]).mean())


def _common_dt(series) -> float | None:
    """The time step of the series when it is one and the same everywhere."""
    import torch

    dts = torch.cat([s.times[1:] - s.times[:-1] for s in series])
    lo, hi = float(dts.min()), float(dts.max())
    return lo if hi - lo <= 1e-9 * max(abs(hi), 1e-300) else None


@dataclass
class SeriesData:
    """The series of a ``train --series`` run: the training and validation split, the
    fields' shapes, the dimension, the parameter names and the fingerprints the run
    records (:func:`_record_files`)."""

    train: list
    val: list
    shapes: dict
    dim: int
    params: list
    record: dict


def train_series(cfg, request, dtype, resumed: dict | None) -> Training:
    """``meshops train --series``: read the series; on one mesh, fit a trajectory basis
    (:mod:`meshops.fitting.series_choice`); train the next-step model on windows of
    ``--rollout-train`` steps, validating on full rollouts; keep the candidate with the
    lower validation error (``resumed``: the metadata of the run being resumed, or
    None)."""
    from meshops.fitting import series_choice
    from meshops.fitting.out_folder import clear_run_files
    from meshops.fitting.training_run import check_writable_folder, run_training
    from meshops.inference.predict import field_channels
    from meshops.training.rollout import RolloutLoss

    _check_series_options(cfg, request.source)
    data = _read_series(cfg, resumed, request.source)
    plan = series_choice.plan(cfg, data, resumed, request.dry_run, request.source)
    if plan.mode == "only":
        return series_choice.fit_only_run(
            request, cfg, data, plan, lambda resolved: series_metadata(cfg, data, resolved, True))
    cfg, model, windows, val_samples, chosen, thread_check = _next_step_setup(cfg, data, plan,
                                                                              dtype)
    # every option, with the operator's full hyperparameters: what config.yaml records
    cfg = dataclasses.replace(cfg, model_config=dict(model.operator_config))
    train, val = data.train, data.val
    c_state = sum(field_channels(data.shapes[k]) for k in cfg.targets)
    summary = _summary(cfg, model, train, val, len(windows), c_state, data.dim)
    metadata = dict(series_metadata(cfg, data, cfg.render(), cfg.time_input),
                    **plan.metadata())
    out = Path(cfg.out)

    def begin() -> dict:
        check_writable_folder(out)
        if is_main_rank() and resumed is None:
            clear_run_files(out)  # a new run leaves no best.pt of an earlier one behind
        if is_main_rank():
            plan.begin(out, resumed is not None, metadata)
        return metadata

    # mse: in units of the typical change of one step, rate spread times the mean dt
    scale = (model.rate_normalizer.std.detach().double().cpu() * _mean_dt(train)
             if cfg.rollout_loss == "mse" else None)
    training = run_training(
        request, cfg, model, windows, val_samples, chosen, summary, begin, thread_check,
        loss=RolloutLoss(c_state, last_only=model.push_forward, quadrature=cfg.quadrature_loss,
                         scale=scale),
        # the model carries its own statistics; validation rollouts of different
        # lengths cannot share a batch; the loggers' baselines are those of one-step
        # samples, not of rollouts: none
        normalize=False, val_batch_size=cfg.batch_size if len({len(s) for s in val}) <= 1
        else 1,
        callbacks=[])
    if not training.dry_run and is_main_rank():
        training.choice = plan.choose(out, data, metadata, training.choice)
    return training


def _next_step_setup(cfg, data: SeriesData, plan, dtype):
    """The next-step model of a series run and what it trains on: ``(cfg with the
    options the data chose, model, training windows, validation rollouts, the reasons
    said, the thread check of the epochs' plan)``; the epochs fit the time the
    trajectory basis left."""
    from meshops.fitting.training_run import epochs_to_fit
    from meshops.inference.predict import field_channels
    from meshops.training.rollout import rollout_sample, rollout_windows

    train, val = data.train, data.val
    K = cfg.rollout_train
    c_state = sum(field_channels(data.shapes[k]) for k in cfg.targets)
    c_in = sum(field_channels(data.shapes[k]) for k in cfg.inputs)
    windows = rollout_windows(train, cfg.targets, cfg.inputs, K, cfg.time_input, dtype)
    val_samples = [rollout_sample(s, cfg.targets, cfg.inputs, 0, len(s) - 1, cfg.time_input,
                                  dtype) for s in val] or None
    cfg, reason = _options_from_data(cfg, train)
    model = _next_step_model(cfg, train, c_state, c_in, data.dim, dtype)
    # A validation rollout of T - 1 steps costs (T - 1) / K training windows' forwards.
    val_equiv = sum(math.ceil((len(s) - 1) / K) for s in val)
    # the epochs fit the time the trajectory basis left; the run records --minutes
    cfg, fitted, thread_check = epochs_to_fit(plan.budget(cfg), model, windows, val_equiv)
    cfg = cfg.with_options("defaults", minutes=plan.minutes)
    return cfg, model, windows, val_samples, "; ".join(
        c for c in (reason, fitted, plan.note) if c), thread_check


def _options_from_data(cfg, train: list):
    """The config with the options nobody set chosen from the training series, and why."""
    from meshops.training.rollout import series_options

    options, reason = series_options(train, cfg.model, cfg.model_config, cfg.batch_size,
                                     cfg.lr)
    return cfg.with_options("defaults", **options), reason


def _metadata(cfg, train: list, val: list) -> dict:
    """What a series run records of its fields, options, time step and split."""
    return {"inputs": list(cfg.inputs), "targets": list(cfg.targets),
            "params": list(cfg.params or []), "data": str(cfg.data),
            "val_data": cfg.val_data, "time_input": cfg.time_input,
            "rollout_train": cfg.rollout_train, "rollout_grad": cfg.rollout_grad,
            "rollout_loss": cfg.rollout_loss, "dt": _common_dt(train),
            "split": {"train": [s.name for s in train], "val": [s.name for s in val]}}


def series_metadata(cfg, data: SeriesData, resolved: str, time_input: bool) -> dict:
    """The checkpoint metadata of a time-series run (``resolved``: its rendered config;
    ``time_input``: whether its model sees the time)."""
    import yaml

    from meshops.inference.predict import field_channels

    return {SERIES_KEY: True, "field_shapes": data.shapes,
            "in_channels": sum(field_channels(data.shapes[k]) for k in cfg.inputs),
            "out_channels": sum(field_channels(data.shapes[k]) for k in cfg.targets),
            "pos_dim": data.dim, **_metadata(cfg, data.train, data.val),
            "time_input": time_input,
            # --resume compares the options with these (meshops.fitting.out_folder)
            "train_config": yaml.safe_load(resolved), **data.record}


def _check_series_options(cfg, source: str) -> None:
    """Options that a time-series run does not take, refused (in ``source``'s words)."""
    given = [k for k, off in _NOT_FOR_SERIES.items() if getattr(cfg, k) not in off]
    if given:
        who = "fit(series=True)" if source == FIT else "train --series"
        raise UsageError(f"{who}: {', '.join(option_name(k, source) for k in given)} "
                         f"{'does' if len(given) == 1 else 'do'} not apply to time series")


def _next_step_model(cfg, train: list, c_state: int, c_in: int, dim: int, dtype):
    """The :class:`~meshops.models.NextStep` model of the run, with the statistics of
    the training series, in ``dtype``."""
    from meshops.fitting.training_run import build_model
    from meshops.models.next_step import NextStep, condition_channels
    from meshops.training.distributed import check_device
    from meshops.training.rollout import series_statistics

    c_cond = condition_channels(cfg.time_input, len(cfg.params or []))
    # Built once through the CLI's model builder, which names a bad model_config key;
    # NextStep then builds its operator from that full configuration.
    operator = build_model(cfg.model, cfg.model_config, c_state + c_in + c_cond, c_state, dim,
                           0, dtype, check_device(cfg.device))
    model = NextStep(cfg.model, c_state, dim, c_in, len(cfg.params or []), cfg.time_input,
                     {k: v for k, v in operator.config.items()
                      if k not in ("in_channels", "out_channels", "pos_dim")})
    del operator
    model.set_statistics(series_statistics(train, cfg.targets, cfg.inputs, cfg.time_input))
    model.push_forward = cfg.rollout_grad == "last"
    if dtype.is_floating_point and dtype != next(model.parameters()).dtype:
        model = model.to(dtype)
    return model


def _read_series(cfg, resumed: dict | None, source: str) -> SeriesData:
    """The training and validation series (``--val-data``, or a split of ``--data`` by
    series, never by time step), their field shapes and dimension, and the fingerprints
    the run records (:func:`_record_files`, which refuses a resume on changed data)."""
    from meshops.fitting.training_run import split_files

    fields_read = {"targets": cfg.targets, "inputs": cfg.inputs, "params": cfg.params}
    series = read_folder(cfg.data, fields_read, "reading series")
    fields = list(cfg.targets) + list(cfg.inputs)
    shapes = _shapes(series[0], fields)
    dim = int(series[0].mesh.pos.shape[1])
    params = list(cfg.params or [])
    if cfg.val_data:
        val = read_folder(cfg.val_data, fields_read, "reading val series")
        vs, vd = _shapes(val[0], fields), int(val[0].mesh.pos.shape[1])
        if vs != shapes or vd != dim:
            raise UsageError(f"{val[0].source}: fields {vs} ({vd}-D) but {shapes} ({dim}-D) in "
                           f"{series[0].source}")
        return SeriesData(series, val, shapes, dim, params,
                          _record_files(cfg, series, val, resumed))
    record = _record_files(cfg, series, None, resumed)
    train_idx, val_idx = split_files(len(series), cfg.val_fraction, cfg.seed, cfg.data,
                                     source)
    return SeriesData([series[i] for i in train_idx], [series[i] for i in val_idx], shapes,
                      dim, params, record)


def _summary(cfg, model, train: list, val: list, windows: int, c_state: int,
             dim: int) -> str:
    """One line: the model, its size, the series, the windows, the loss, the fields."""
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    steps = sorted({len(s) for s in train})
    params = list(cfg.params or [])
    return (f"next-step {cfg.model} ({n_params:,} parameters) on {len(train)} series of "
            f"{cfg.data} ({steps[0]}{'' if len(steps) == 1 else f'-{steps[-1]}'} time "
            f"steps, {windows} windows of {plural(cfg.rollout_train, 'step')}, gradient "
            f"through {'the last step' if model.push_forward else 'all steps'}, "
            f"{'relative L2' if cfg.rollout_loss == 'relative' else 'scaled mse'} loss), "
            f"validating on "
            + (f"{len(val)} full rollouts" if val else "none")
            + f"; state {', '.join(cfg.targets)} ({plural(c_state, 'channel')})"
            + (f", inputs {', '.join(cfg.inputs)}" if cfg.inputs else "")
            + (f", parameters {', '.join(params)}" if params else "")
            + f", {'t, ' if cfg.time_input else ''}dt; {dim}-D")


def _record_files(cfg, series: list, val: list | None, resumed: dict | None) -> dict:
    """The fingerprints a series run records (``data_files``, ``val_files``: every file
    of every series and the parameter file,
    :func:`~meshops.runs.run_folder.series_fingerprint`); resuming, a series added or
    removed or a file changed since the run was trained is refused (it would
    redraw the split or train on other data)."""
    from meshops.runs.run_folder import refuse_changed, series_changes, series_fingerprint

    if resumed is not None and resumed.get("data_files") is not None:
        split = resumed.get("split") or {}
        names = list(split.get("train", [])) + ([] if cfg.val_data else
                                                list(split.get("val", [])))
        diff = series_changes(resumed["data_files"], cfg.data, names)
        if cfg.val_data and resumed.get("val_files") is not None:
            diff += series_changes(resumed["val_files"], cfg.val_data, split.get("val", []))
        refuse_changed(diff, Path(cfg.out) / "last.pt")
    return {"data_files": series_fingerprint(cfg.data, series, "fingerprinting series"),
            "val_files": series_fingerprint(cfg.val_data, val, "fingerprinting val series")
            if val is not None else None}


