"""Time series: ``fit(series=True)`` (``meshops train --series``), rollouts
(``Run.predict_files(..., rollout=N)``, ``meshops predict --rollout N``) and the
evaluation of a time-series run (error against horizon).

The run is a :class:`~meshops.models.next_step.NextStep` model; its checkpoint
metadata says ``series: true`` and records the state fields (``targets``), the input
fields, the parameter names, whether the model sees the time, the training series and
the common time step of the training data (or null).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

from meshops.errors import CheckpointError, MeshError, UsageError
from meshops.runs.common import is_main_rank, optional_names, plural
from meshops.runs.config import FIT, option_name
from meshops.runs.outcome import Training
from meshops.runs.report import Report

#: Stored in the checkpoint metadata of a time-series run.
SERIES_KEY = "series"
log = logging.getLogger(__name__)


def _read_folder(root, fields: dict, desc: str, names=None) -> list:
    """The series of folder ``root`` with the fields of ``fields`` (a run's metadata, or
    the ``targets``, ``inputs`` and ``params`` of its config)."""
    from meshops.datasets.series import read_series_folder

    names_read = list(fields["targets"]) + list(fields["inputs"])
    return read_series_folder(root, names_read, fields["params"] or (), names, desc)


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


def _warn_other_dt(series, meta: dict) -> None:
    """A warning per series whose time steps are not the one the run was trained on
    (the model extrapolates in dt then; a series numbered by step index against one
    stored with physical times is the usual cause)."""
    dt = meta.get("dt")
    if dt is None:
        return
    for s in series:
        if len(s) < 2:
            continue
        steps = s.times[1:] - s.times[:-1]
        if float((steps - dt).abs().max()) > 1e-6 * abs(dt):
            log.warning(f"{s.source}: time steps {float(steps.min()):g}.."
                        f"{float(steps.max()):g}, but the run was trained on time step {dt:g}")


# ---------------------------------------------------------------------- training
#: Options of meshops train that a time-series run does not take, with the values that
#: leave them off (their defaults; ``--logger none`` too).
_NOT_FOR_SERIES = {"tags": ([],), "ensemble": (1,), "lazy": (None,), "cache": (None,),
                   "workers": (None,), "shards": (None,), "compile": (False,),
                   "checkpoint_blocks": (False,), "logger": (None, [])}


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
    (:mod:`meshops.runs.series_choice`); train the next-step model on windows of
    ``--rollout-train`` steps, validating on full rollouts; keep the candidate with the
    lower validation error (``resumed``: the metadata of the run being resumed, or
    None)."""
    from meshops.inference.predict import field_channels
    from meshops.runs import series_choice
    from meshops.runs.run_folder import clear_run_files
    from meshops.runs.training_run import check_writable_folder, run_training
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
    from meshops.inference.predict import field_channels
    from meshops.runs.training_run import epochs_to_fit
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
            # --resume compares the options with these (meshops.runs.run_folder)
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
    from meshops.models.next_step import NextStep, condition_channels
    from meshops.runs.training_run import build_model
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
    from meshops.runs.training_run import split_files

    fields_read = {"targets": cfg.targets, "inputs": cfg.inputs, "params": cfg.params}
    series = _read_folder(cfg.data, fields_read, "reading series")
    fields = list(cfg.targets) + list(cfg.inputs)
    shapes = _shapes(series[0], fields)
    dim = int(series[0].mesh.pos.shape[1])
    params = list(cfg.params or [])
    if cfg.val_data:
        val = _read_folder(cfg.val_data, fields_read, "reading val series")
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
    :func:`~meshops.runs.provenance.series_fingerprint`); resuming, a series added or
    removed or a file changed since the run was trained is refused (it would
    redraw the split or train on other data)."""
    from meshops.runs.provenance import refuse_changed, series_changes, series_fingerprint

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


def _check_series_run(ckpt, meta: dict, options: str) -> None:
    if not meta.get(SERIES_KEY):
        raise UsageError(f"{ckpt}: not a time-series run (trained without --series); "
                       f"{options} apply to time-series runs")
    if not isinstance(meta.get("targets"), list) or not isinstance(meta.get("inputs"), list):
        raise CheckpointError(f"{ckpt}: a time-series run without its state and input "
                              f"field names in the metadata")


# ------------------------------------------------------------- the run's model
def _model_name(model) -> str:
    operator = getattr(model, "operator", None)
    return operator.model_name if operator is not None else model.model_name


def describe_model(model) -> str:
    """How a series run's model predicts, as ``evaluate`` names it."""
    if getattr(model, "operator", None) is not None:
        return f"{model.operator.model_name} next-step rollout"
    basis = model.basis
    return (f"trajectory basis ({basis.modes.shape[0]} POD modes of whole trajectories, "
            f"{basis.regressor_name} regression on the "
            f"{'parameters' if model.identity == 'params' else 'first state'})")


def model_rollout(model, sample, series, targets, ckpt: Path):
    """:func:`~meshops.training.rollout.rollout` of a series run's model: a trajectory
    basis that tells series apart by their first state gets it (``series``' step 0);
    a time it cannot predict is one line naming the series (and the run's next-step
    model, when ``ckpt`` has one beside it)."""
    from meshops.runs.series_choice import NEURAL
    from meshops.training.rollout import rollout

    if getattr(model, "identity", None) == "initial":
        sample.initial = series.channels(targets, sample.x.dtype)[0]
        sample.initial_time = series.times[:1].to(sample.x.dtype)
    try:
        return rollout(model, sample)
    except ValueError as e:
        other = Path(ckpt).parent / NEURAL
        hint = f"; {other} is this run's next-step model" if other.is_file() else ""
        raise UsageError(f"{series.source}: {e}{hint}") from None


# ------------------------------------------------------------------- prediction
def _initial(path: Path, meta: dict) -> list:
    """The series (or the one-file initial state) a ``predict --rollout`` argument
    names: a mesh file, a series, or a folder of series."""
    from meshops.datasets.series import list_series, read_series, read_state

    params = meta.get("params") or ()
    if path.is_file() and path.suffix.lower() not in (".pvd", ".xdmf", ".xmf"):
        return [read_state(path, list(meta["targets"]) + list(meta["inputs"]), params)]
    return [read_series(p, None, params) for p in list_series(path)]


def _future_times(series, start: int, steps: int, dt_run):
    """The times of steps ``0 .. start + steps``: the series' own, extended past its end
    by its last time step (or the run's, for a one-step series)."""
    import torch

    t = series.times
    last = start + steps
    if last < len(t):
        return t[:last + 1]
    dt = float(t[-1] - t[-2]) if len(t) > 1 else dt_run
    if dt is None:
        raise UsageError(f"{series.source}: one time step and a run trained on varying time "
                       f"steps: give a series of at least two steps, whose last step "
                       f"sets dt")
    extra = t[-1] + dt * torch.arange(1, last - len(t) + 2, dtype=torch.float64)
    return torch.cat([t, extra])


def _not_a_rollout(folder: Path, name: str, series) -> str:
    """Why ``folder`` (``OUT/<name>/``, which a rollout replaces) is not a folder an
    earlier rollout of this name wrote; ``""`` when it is one."""
    if not folder.is_dir() or folder.is_symlink():
        return "exists and is not a folder of a rollout"
    inputs = [Path(p).resolve() for p in series.steps] + [Path(series.source).resolve()]
    here = folder.resolve()
    if any(p == here or here in p.parents for p in inputs):
        return f"holds the input series {series.source}"
    own = re.compile(rf"^{re.escape(name)}_\d+\.vtu$")
    other = sorted(p.name for p in folder.iterdir() if not own.match(p.name))
    if other:
        more = f" and {len(other) - 1} more" if len(other) > 1 else ""
        return f"holds files that predict did not write ({other[0]}{more})"
    return ""


def _check_rollout_outputs(out_dir: Path, todo: list, overwrite: bool) -> None:
    """Before anything is written: a rollout replaces ``OUT/<name>.pvd`` and the folder
    ``OUT/<name>/`` of its steps. An existing one needs ``overwrite``; a folder that no
    rollout wrote (the input series itself, a user's folder) is never deleted; two
    series of one name are refused."""
    names = [s.name for s in todo]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"two series named {dup[0]!r} would both be written to "
                       f"{out_dir / (dup[0] + '.pvd')}")
    exists = []
    for s in todo:
        pvd, folder = out_dir / f"{s.name}.pvd", out_dir / s.name
        if pvd.resolve() == Path(s.source).resolve():
            raise UsageError(f"{pvd}: is the input series; a rollout would replace it: "
                           f"choose another -o")
        if folder.exists() or folder.is_symlink():
            why = _not_a_rollout(folder, s.name, s)
            if why:
                raise UsageError(f"{folder}: {why}; a rollout replaces this folder with its "
                               f"steps, so nothing was written: choose another -o")
        found = [p for p in (pvd, folder) if p.exists()]
        if found:
            exists.append(found[0])
    if exists and not overwrite:
        raise UsageError(f"{exists[0]}: already exists ({len(exists)} of the {len(todo)} "
                       f"series have an earlier rollout there); pass --overwrite to replace "
                       f"them, or choose another -o")


def _check_rollout_args(opts, ckpt, meta: dict) -> None:
    _check_series_run(ckpt, meta, "--rollout")
    if opts.rollout is None:
        raise UsageError(f"{ckpt}: a time-series run predicts rollouts: pass --rollout N (the "
                       f"number of steps to predict)")
    if opts.rollout < 1 or opts.start < 0:
        raise UsageError(f"--rollout must be >= 1 and --start >= 0, got {opts.rollout} and "
                       f"{opts.start}")
    if opts.format not in (None, "vtu", ".vtu"):
        raise UsageError(f"--format {opts.format}: a rollout is written as a .pvd series of "
                       f".vtu files")
    if opts.chunk_size is not None:
        raise UsageError("--chunk-size does not apply to rollouts")


def predict_series(model, ckpt, meta, opts) -> Report:
    """``meshops predict RUN SERIES... --rollout N -o OUT``: roll each series out from
    its step ``--start`` and write ``OUT/<name>.pvd`` with one ``.vtu`` per step."""
    import torch

    from meshops.datasets.series import write_series
    from meshops.inference.predict import RunSpec
    from meshops.mesh.data import MeshData
    from meshops.runs.common import progress
    from meshops.training.rollout import rollout_sample

    _check_rollout_args(opts, ckpt, meta)
    spec = RunSpec(model, ckpt, meta, optional_names(opts.inputs), optional_names(opts.targets))
    steps, start = opts.rollout, opts.start
    out_dir = Path(opts.output)
    todo = []
    for arg in opts.meshes:
        todo += _initial(Path(arg), meta)
    _warn_other_dt(todo, meta)
    _check_rollout_outputs(out_dir, todo, opts.overwrite)
    dtype = spec.dtype
    written = []
    for s in progress(todo, desc="rolling out", unit="series"):
        if start >= len(s):
            raise UsageError(f"{s.source}: --start {start} but the series has {len(s)} time "
                           f"step(s)")
        step = MeshData(pos=s.mesh.pos, fields={k: v[start] for k, v in s.fields.items()})
        spec.check_mesh(step, s.label(start), roles=("targets",) + (
            ("inputs",) if spec.inputs else ()))
        times = _future_times(s, start, steps, meta.get("dt"))
        try:
            sample = rollout_sample(s, spec.targets, spec.inputs, start, steps,
                                    bool(meta.get("time_input", True)), dtype,
                                    with_targets=False, times=times)
        except MeshError as e:
            raise UsageError(str(e)) from None
        pred = model_rollout(model, sample, s, spec.targets, ckpt)  # [steps, N, C]
        bad = (~torch.isfinite(pred)).nonzero()
        if bad.numel():
            raise UsageError(f"{s.source}: the model in {ckpt} predicts a non-finite value at "
                           f"step {start + int(bad[0, 0]) + 1} of the rollout; nothing "
                           f"written for this series")
        state0 = s.channels(spec.targets)[start]
        frames = []
        for j in range(steps + 1):
            u = state0 if j == 0 else pred[j - 1]
            frame = {k: v[start + j] for k, v in s.fields.items()} \
                if start + j < len(s) else {}
            frame.update({f"{k}_pred": v for k, v in spec.split(u).items()})
            frames.append(frame)
        written.append(write_series(out_dir / f"{s.name}.pvd", s.mesh, frames,
                                    times[start:start + steps + 1].tolist()))
    return Report({"written": [str(w) for w in written], "steps": steps,
                   "fields": [f"{k}_pred" for k in spec.targets], "output": str(out_dir)},
                  _rollout_lines)


def _rollout_lines(r: dict) -> list[str]:
    return [f"wrote {len(r['written'])} series of {r['steps'] + 1} steps (the start and "
            f"{r['steps']} predicted) with {', '.join(r['fields'])} to {r['output']}/ (open "
            f"the .pvd files in ParaView)"]


# ------------------------------------------------------------------- evaluation
def evaluate_series(model, ckpt, meta, opts) -> Report:
    """``meshops evaluate`` of a time-series run: relative L2 error against the
    horizon, per step, beside persistence and the nearest training trajectory."""
    from meshops.inference.predict import RunSpec, model_tensor
    from meshops.runs.common import progress
    from meshops.training.rollout import rollout_sample

    _check_series_run(ckpt, meta, "--horizon/--start")
    if (opts.horizon is not None and opts.horizon < 1) or opts.start < 0:
        raise UsageError(f"--horizon must be >= 1 and --start >= 0, got {opts.horizon} and "
                         f"{opts.start}")
    RunSpec(model, ckpt, meta, optional_names(opts.inputs), optional_names(opts.targets))
    test = _read_folder(opts.data, meta, "reading series")
    _warn_other_dt(test, meta)
    start, lengths = opts.start, _horizons(test, opts)
    targets, inputs = list(meta["targets"]), list(meta["inputs"])
    dtype = model_tensor(model).dtype
    table = _step_table(test, lengths, start, targets)
    preds = []
    for s, h in progress(list(zip(test, lengths)), desc="rolling out", unit="series"):
        sample = rollout_sample(s, targets, inputs, start, h,
                                bool(meta.get("time_input", True)), dtype, with_targets=False)
        preds.append(model_rollout(model, sample, s, targets, ckpt))
    results = {"model": (table(preds), describe_model(model))}
    if opts.baselines:
        results.update(_series_baselines(meta, test, lengths, start, targets, table))
    report = {"checkpoint": str(ckpt), "model": _model_name(model), "data": str(opts.data),
              **_horizon_report(results, test, lengths, start, targets)}
    if opts.plot:
        _plot_horizon(report, opts.plot, f"{ckpt} on {opts.data}")
        report["plot"] = str(opts.plot)
    return Report(report, _horizon_lines, _json_report)


def _horizons(test: list, opts) -> list[int]:
    """The steps each test series is rolled out: to its end from ``opts.start``, at most
    ``opts.horizon``."""
    lengths = []
    for s in test:
        h = len(s) - 1 - opts.start
        if opts.horizon is not None:
            h = min(h, opts.horizon)
        if h < 1:
            raise UsageError(f"{s.source}: {len(s)} time steps leave no step to predict "
                             f"after --start {opts.start}")
        lengths.append(h)
    return lengths


def _step_table(test: list, lengths: list, start: int, targets: list):
    """``table(preds) -> [series, H]``: each rollout's relative L2 error per step (NaN
    past a series' end, or for a predictor with no rollout of it)."""
    import numpy as np

    from meshops.training.horizon import step_errors

    H = max(lengths)

    def table(preds) -> np.ndarray:
        e = np.full((len(test), H), np.nan)
        for i, (s, p, h) in enumerate(zip(test, preds, lengths)):
            if p is not None:
                e[i, :h] = step_errors(p[:h], s.channels(targets)[start + 1:start + 1 + h],
                                       s.mesh.weight)
        return e

    return table


def _series_baselines(meta, test, lengths, start, targets, table) -> dict:
    """``{name: (errors or None, note)}`` of persistence and the nearest training
    trajectory."""
    from meshops.training.horizon import nearest_trajectory, persistence

    out = {"persistence": (table([persistence(s, targets, start, h)
                                  for s, h in zip(test, lengths)]),
                           f"the state at time step {start}, held")}
    name = "nearest training trajectory"
    train, why = _training_series(meta)
    if train is None:
        return {**out, name: (None, why)}
    near, chosen, note = nearest_trajectory(train, test, targets, start, lengths)
    missing = sum(p is None for p in near)
    if missing == len(near):
        return {**out, name: (None, f"n/a: no training series reaches time step {start}")}
    if missing:
        note += (f" ({missing} test series have no training series that reaches time step "
                 f"{start})")
    return {**out, name: (table(near), note)}


def _horizon_report(results: dict, test: list, lengths: list, start: int,
                    targets: list) -> dict:
    """The report of the predictors' error tables (``results``: name -> (errors,
    note)): statistics per step, the mean over all steps, the steps each is below."""
    import numpy as np

    from meshops.training.horizon import horizon_statistics

    names, H = [s.name for s in test], max(lengths)
    report = {
        "n": len(test), "start": start, "horizon": H, "targets": targets,
        "metric": "relative L2 per step, quadrature-weighted, state channels pooled",
        "times": _times(test[int(np.argmax(lengths))], start, H),
        "predictors": {}, "series": names,
    }
    for name, (errors, note) in results.items():
        entry = {"note": note}
        if errors is not None:
            entry["steps"] = horizon_statistics(errors, names)
            entry["all_steps_mean"] = float(np.nanmean(errors))
            entry["errors"] = [[None if math.isnan(v) else float(v) for v in row]
                               for row in errors]
        report["predictors"][name] = entry
    report["below"] = _below(report["predictors"])
    return report


def _json_report(report: dict) -> dict:
    """``report`` with its non-finite numbers as null (JSON has no ``Infinity``), and a
    note saying so when there were any: an infinite error is a rollout that reached
    non-finite values."""
    from meshops.runs.report import json_number

    def finite(v) -> bool:
        if isinstance(v, dict):
            return all(finite(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return all(finite(x) for x in v)
        return not isinstance(v, float) or math.isfinite(v)

    out = json_number(report)
    if not finite(report):
        out["note"] = ("null marks an error or statistic that is not finite: a rollout "
                       "reached non-finite values (the model failed on that series)")
    return out


def _times(series, start: int, h: int) -> list[float]:
    t = series.times
    return [float(v) for v in t[start + 1:start + 1 + h]]


def _training_series(meta: dict):
    """The run's training series (``meta["data"]``, ``meta["split"]["train"]``), or
    ``(None, why not)``."""
    root, names = meta.get("data"), (meta.get("split") or {}).get("train")
    if not root or not names:
        return None, "n/a: the checkpoint does not record its training series"
    if not Path(root).exists():
        return None, f"n/a: the training data {root} is not here"
    if isinstance(meta.get("data_files"), dict):
        from meshops.runs.provenance import changes, listing, series_keys

        diff = changes(meta["data_files"], root, series_keys(meta["data_files"], names),
                       new_files=False)
        if diff:
            return None, (f"n/a: the training series in {root} changed since the run was "
                          f"trained ({listing(diff)})")
    try:
        return _read_folder(root, meta, "reading training series", names), ""
    except (MeshError, OSError) as e:
        return None, f"n/a: cannot read the training series ({e})"


def _below(predictors: dict) -> dict:
    """At how many steps the model's mean error is below each baseline's, and the
    steps where it is not."""
    model = predictors["model"].get("steps")
    out = {}
    for name, entry in predictors.items():
        if name == "model" or "steps" not in entry:
            continue
        both = [(m["step"], m["mean"], b["mean"]) for m, b in zip(model, entry["steps"])
                if m["mean"] is not None and b["mean"] is not None]
        not_below = [k for k, m, b in both if not m < b]
        out[name] = {"steps_below": len(both) - len(not_below), "steps": len(both),
                     "not_below": not_below}
    return out


def _horizon_lines(report: dict) -> list[str]:
    """The table of a time-series evaluation: each predictor's error per step."""
    preds = report["predictors"]
    out = [f"{report['checkpoint']} ({report['model']}) on {report['data']}: "
           f"{report['n']} series, rollouts of up to {report['horizon']} steps from time step "
           f"{report['start']}; {report['metric']}"]
    out += [f"{name}: {entry['note']}" for name, entry in preds.items()]
    shown = [n for n in preds if "steps" in preds[n]]
    fmt = lambda v: f"{v:9.3e}" if v is not None else f"{'-':>9}"  # noqa: E731
    out.append(f"{'step':>5} {'time':>9} " + " | ".join(f"{n[:29]:^29}" for n in shown))
    out.append(f"{'':>5} {'':>9} " + " | ".join(f"{'mean':>9} {'median':>9} {'worst':>9}"
                                               for _ in shown))
    for k in range(report["horizon"]):
        row = [preds[n]["steps"][k] for n in shown]
        out.append(f"{k + 1:>5} {report['times'][k]:>9.4g} " + " | ".join(
            f"{fmt(r['mean'])} {fmt(r['median'])} {fmt(r['worst'])}" for r in row))
    out.append("all steps: " + ", ".join(f"{n} {preds[n]['all_steps_mean']:.4e}"
                                         for n in shown))
    for name, b in report["below"].items():
        nb = b["not_below"]
        extra = (f" (not at steps {', '.join(map(str, nb[:20]))}{', ...' if len(nb) > 20 else ''})"
                 if nb else "")
        out.append(f"model mean below {name} at {b['steps_below']} of {b['steps']} steps"
                   f"{extra}")
    if "plot" in report:
        out.append(f"wrote {report['plot']}")
    return out


def _plot_horizon(report: dict, path, title: str) -> None:
    """Mean error per step of each predictor (lines) with the model's median and worst
    (thin lines), on a log scale."""
    from matplotlib.figure import Figure

    from meshops.utils.atomic import atomic_write

    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    t = report["times"]
    for name, entry in report["predictors"].items():
        if "steps" not in entry:
            continue
        mean = [s["mean"] if s["mean"] is not None else float("nan") for s in entry["steps"]]
        line, = ax.plot(t, mean, label=f"{name} (mean)", lw=1.8)
        if name == "model":
            for key, style in (("median", ":"), ("worst", "--")):
                ax.plot(t, [s[key] if s[key] is not None else float("nan")
                            for s in entry["steps"]], style, color=line.get_color(), lw=1,
                        label=f"model ({key})")
    ax.set_yscale("log")
    ax.set_xlabel("time")
    ax.set_ylabel("relative L2 error")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".") or "png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=120))
