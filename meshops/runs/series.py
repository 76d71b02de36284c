"""Time series: rollouts of a time-series run (``Run.predict_files(..., rollout=N)``)
and its evaluation (error against horizon), beside the single-mesh
:mod:`~meshops.runs.predict` and :mod:`~meshops.runs.evaluate`.

The run is a :class:`~meshops.models.next_step.NextStep` model or a trajectory basis;
its checkpoint metadata says ``series: true`` and records the state fields
(``targets``), the input fields, the parameter names, whether the model sees the time,
the training series and the common time step of the training data (or null).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

from meshops.datasets.fields import optional_field_names
from meshops.errors import CheckpointError, MeshError, UsageError
from meshops.runs.report import Report
from meshops.runs.run_folder import NEURAL

#: Stored in the checkpoint metadata of a time-series run.
SERIES_KEY = "series"
log = logging.getLogger(__name__)


def read_folder(root, fields: dict, desc: str, names=None) -> list:
    """The series of folder ``root`` with the fields of ``fields`` (a run's metadata, or
    the ``targets``, ``inputs`` and ``params`` of its config)."""
    from meshops.datasets.series import read_series_folder

    names_read = list(fields["targets"]) + list(fields["inputs"])
    return read_series_folder(root, names_read, fields["params"] or (), names, desc)


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
    from meshops.training.rollout import rollout_sample
    from meshops.utils.progress import progress

    _check_rollout_args(opts, ckpt, meta)
    spec = RunSpec(model, ckpt, meta, optional_field_names(opts.inputs),
                   optional_field_names(opts.targets))
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
    from meshops.training.rollout import rollout_sample
    from meshops.utils.progress import progress

    _check_series_run(ckpt, meta, "--horizon/--start")
    if (opts.horizon is not None and opts.horizon < 1) or opts.start < 0:
        raise UsageError(f"--horizon must be >= 1 and --start >= 0, got {opts.horizon} and "
                         f"{opts.start}")
    RunSpec(model, ckpt, meta, optional_field_names(opts.inputs),
            optional_field_names(opts.targets))
    test = read_folder(opts.data, meta, "reading series")
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

    from meshops.runs.horizon import step_errors

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
    from meshops.runs.horizon import nearest_trajectory, persistence

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

    from meshops.runs.horizon import horizon_statistics

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
        from meshops.runs.run_folder import changes, listing, series_keys

        diff = changes(meta["data_files"], root, series_keys(meta["data_files"], names),
                       new_files=False)
        if diff:
            return None, (f"n/a: the training series in {root} changed since the run was "
                          f"trained ({listing(diff)})")
    try:
        return read_folder(root, meta, "reading training series", names), ""
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
