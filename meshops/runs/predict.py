"""Predicting with a run (``meshops predict``, :meth:`meshops.runs.Run.predict` and
:meth:`~meshops.runs.Run.predict_files`): a trained model's predictions on one mesh, or
written into copies of meshes."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from meshops.datasets.fields import optional_field_names
from meshops.datasets.layout import SampleLayout
from meshops.datasets.samples import mesh_files
from meshops.errors import UsageError
from meshops.inference import predict as inference  # tests replace predict_mesh there
from meshops.inference.predict import RunSpec, mesh_sample
from meshops.inference.trust import predict_ensemble
from meshops.runs import trust_reports
from meshops.runs.report import Report
from meshops.utils.progress import NOTE, progress

log = logging.getLogger(__name__)


def _suffix(fmt: str | None, path: Path) -> str:
    if not fmt:
        return path.suffix
    return fmt if fmt.startswith(".") else "." + fmt


@dataclass
class PredictOptions:
    """What ``meshops predict`` and :meth:`meshops.runs.Run.predict_files` are asked.

    Args:
        meshes: Mesh files or folders of them (time-series runs: series).
        output: The folder the predicted copies are written to.
        format: Output format by suffix (``.vtu``); default the input's.
        overwrite: Replace files that exist in ``output`` (never the inputs).
        chunk_size: Meshes of more points are predicted this many output points at a
            time (0: never in chunks; default that of :func:`predict_mesh`).
        inputs, targets: Field names, for checkpoints that do not record them.
        rollout, start: Time-series runs: roll each series out ``rollout`` steps from
            its step ``start``.
    """

    meshes: Sequence[str]
    output: str
    format: str | None = None
    overwrite: bool = False
    chunk_size: int | None = None
    inputs: Sequence[str] | str | None = None
    targets: Sequence[str] | str | None = None
    rollout: int | None = None
    start: int = 0


class Predictor:
    """A run ready to predict on meshes as training read them: the spec, the layout
    (points or cells, parameters, boundary tags), the ensemble's members and the
    training set the distances are measured to."""

    def __init__(self, model, ckpt, meta: dict, members: Sequence = (), inputs=None,
                 targets=None) -> None:
        self.model, self.meta = model, meta
        self.spec = RunSpec(model, ckpt, meta, optional_field_names(inputs),
                            optional_field_names(targets))
        self.train_set, self.why = trust_reports.training_set_of(
            meta, self.spec.inputs, self.spec.targets)
        # an ensemble run (meshops train --ensemble K): every member predicts
        self.members = [model, *members]
        self.layout = SampleLayout.from_run(meta, self.spec.inputs, self.spec.targets,
                                            model, ckpt)

    def fields(self, mesh, path, chunking: dict | None = None) -> tuple[dict, dict]:
        """``(point_data, cell_data)`` to write with ``mesh`` (read from ``path``):
        ``<target>_pred`` (and ``_std`` of an ensemble), the distances to the training
        set; a non-finite prediction raises :class:`UsageError`."""
        import torch

        spec, layout = self.spec, self.layout
        sample = layout.view(mesh, path, need_targets=False)
        spec.check_mesh(sample, path)
        if len(self.members) > 1:
            out, std = predict_ensemble(self.members, spec, sample)
        else:
            out, std = inference.predict_mesh(self.model, spec, sample, **(chunking or {})), None
        bad = (~torch.isfinite(out)).nonzero()
        if bad.numel():  # the inputs are finite (checked above): the model is at fault
            raise UsageError(f"{path}: the model in {spec.ckpt} predicts a non-finite value "
                             f"({out[bad[0, 0], bad[0, 1]].item()}) at "
                             f"{layout.location[:-1]} {int(bad[0, 0])} although the inputs "
                             f"are finite; nothing written for this file")
        fields = {f"{k}_pred": v for k, v in spec.split(out).items()}
        if std is not None:
            fields.update({f"{k}_std": v for k, v in spec.split(std).items()})
        # a cell target's prediction is written as cell data
        point_data, cell_data = layout.prediction_data(mesh, fields)
        if self.train_set is not None:
            dist = self.train_set.distance(mesh_sample(self.model, spec, sample).cpu())
            trust_reports.warn_extrapolation(path, dist)
            n = int(mesh.pos.shape[0])
            point_data.update({name: torch.full((n,), dist[key], dtype=torch.float64)
                               for key, name in trust_reports.DISTANCE_FIELDS.items()})
        return point_data, cell_data

    def field_names(self) -> list[str]:
        """The names of the fields :meth:`fields` gives."""
        t = self.spec.targets
        std = [f"{k}_std" for k in t] if len(self.members) > 1 else []
        distances = list(trust_reports.DISTANCE_FIELDS.values()) if self.train_set else []
        return [f"{k}_pred" for k in t] + std + distances


def _destinations(files: Sequence[Path], opts: PredictOptions) -> dict:
    """Input file -> output file; refused before the first is written when an output
    would overwrite an input, two inputs one output, or a file of the user's without
    ``overwrite``."""
    out_dir = Path(opts.output)
    targets = {}
    for f in files:
        dest = out_dir / (f.stem + _suffix(opts.format, f))
        if dest.resolve() == f.resolve():
            raise UsageError(f"{f}: the output would overwrite the input; choose another -o "
                             f"folder or --format")
        if dest in targets.values():
            raise UsageError(f"{f}: two inputs would both be written to {dest}")
        targets[f] = dest
    existing = [d for d in targets.values() if d.exists() or d.is_symlink()]
    if existing and not opts.overwrite:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise UsageError(f"{existing[0]}: exists{more}; predict does not replace files it "
                         f"did not write: pass --overwrite to replace them, or choose "
                         f"another -o folder")
    return targets


def predict_files(model, ckpt, meta: dict, members: Sequence, opts: PredictOptions) -> Report:
    """Predict on every mesh of ``opts.meshes`` and write each, with the predicted fields
    added, to ``opts.output``; a time-series run's rollouts
    (:func:`meshops.runs.series.predict_series`). The report says what was written."""
    if opts.rollout is not None or meta.get("series"):
        from meshops.runs.series import predict_series

        return predict_series(model, ckpt, meta, opts)
    from meshops.mesh.io import read_mesh, write_mesh

    run = Predictor(model, ckpt, meta, members, opts.inputs, opts.targets)
    if run.train_set is None:
        log.info(f"no distance to the training set ({run.why})", extra=NOTE)
    targets = _destinations(mesh_files(opts.meshes), opts)
    chunking = chunk_options(opts.chunk_size)
    written = []
    for f in progress(list(targets), desc="predicting", unit="mesh"):
        mesh = read_mesh(f)
        point_data, cell_data = run.fields(mesh, f, chunking)
        if cell_data:
            mesh = copy.copy(mesh)
            mesh.cell_data = {**(getattr(mesh, "cell_data", None) or {}), **cell_data}
        written.append(write_mesh(targets[f], mesh, point_data=point_data))
    return Report({"written": [str(w) for w in written], "fields": run.field_names(),
                   "output": str(Path(opts.output)), "members": len(run.members)}, _written_lines)


def _written_lines(r: dict) -> list[str]:
    return [f"wrote {len(r['written'])} file(s) with {', '.join(r['fields'])} to "
            f"{r['output']}/" + (f" (mean and standard deviation of {r['members']} ensemble "
                                 f"members)" if r["members"] > 1 else "")]


def chunk_options(chunk_size: int | None) -> dict:
    """``predict_mesh``'s chunk options where they differ from its defaults: meshes of
    more than ``chunk_size`` points (0: none; None: the default) are predicted in chunks,
    with a progress bar on a terminal."""
    from meshops.utils.progress import on_terminal

    kw = {}
    if chunk_size is not None:
        if chunk_size < 0:
            raise UsageError(f"--chunk-size must be >= 0 (0: no chunks), got {chunk_size}")
        kw["chunk_size"] = chunk_size or None
    if on_terminal():
        kw["progress"] = True
    return kw
