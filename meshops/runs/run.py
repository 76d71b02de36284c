"""A trained run in Python: :func:`load_run` opens one (:func:`meshops.fit` trains one
and returns it), and a :class:`Run` predicts, evaluates and
exports as ``meshops predict``, ``evaluate`` and ``export`` do, with the same defaults,
files and numbers (the commands are thin shells over these functions). Every method
returns a :class:`~meshops.runs.report.Report`: its entries, ``to_json()`` and the
command's text, ``table()``. Nothing is printed: progress goes to the ``meshops``
loggers (INFO), warnings at WARNING (:mod:`logging`)."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from meshops.errors import UsageError
from meshops.inference.predict import load_model
from meshops.runs.choice import Choice
from meshops.runs.evaluate import EvaluateOptions, evaluate_run
from meshops.runs.export import ExportOptions, export_run
from meshops.runs.predict import PredictOptions, Predictor, chunk_options, predict_files
from meshops.runs.report import Report
from meshops.utils.progress import verbosity


class Run:
    """A trained run: the model of its ``best.pt`` with what training recorded.

    Args:
        path: The run folder (``RUN/best.pt`` is used) or a checkpoint file.
        device: Where the model runs (default ``cuda`` when available).

    Attributes:
        model: The :class:`~meshops.models.NeuralOperator` (or reduced basis).
        checkpoint: The checkpoint file it was loaded from.
        metadata: What training recorded: fields, shapes, data files, split, config.
        history: The Trainer's records, one per epoch (``epoch``, ``train_loss``,
            ``val_l2``, ``val``, ``lr``, ``time_s``): those of :func:`meshops.fit`, or the run
            folder's ``history.json``; empty for a fitted model (a reduced or trajectory
            basis, whose candidates are in ``choice``).
        choice: The :class:`~meshops.runs.choice.Choice`: which model ``best.pt``
            holds, why (the options chosen from the data; said by :func:`meshops.fit` only,
            not recorded in the folder), and the validation figures it was kept by.

    Every method returns a :class:`~meshops.runs.report.Report` (a read-only mapping
    with ``to_json()`` and ``table()``) and takes ``verbose``: ``False`` hides its
    progress records and bars (:func:`meshops.fit`).

    Example::

        run = meshops.load_run("runs/poisson")
        fields = run.predict("case.vtu")           # fields["u_pred"]: a tensor [N, ...]
        report = run.evaluate("test/")              # per field and sample, baselines
        text = report.table()                       # what meshops evaluate prints
    """

    def __init__(self, path, device: str | None = None) -> None:
        self.path, self.device = Path(path), device
        self.model, self.checkpoint, self.metadata = load_model(path, device)
        self.history: list[dict[str, Any]] = _recorded_history(self.checkpoint)
        self.choice: Choice = Choice.from_metadata(self.model.model_name, self.metadata)

    # ------------------------------------------------------------------ predict
    @cached_property
    def _members(self) -> list:
        """The other members of an ensemble run (``meshops train --ensemble K``), loaded
        once."""
        from meshops.inference.trust import ensemble_members

        members = ensemble_members(self.path, self.metadata)[1:]
        return [load_model(m, self.device)[0] for m in members]

    @cached_property
    def _predictor(self) -> Predictor:
        """The run set up to predict (its layout, training set and members), once."""
        return Predictor(self.model, self.checkpoint, self.metadata, self._members)

    def predict(self, mesh, *, chunk_size: int | None = None, verbose: bool = True
                ) -> Report:
        """The fields ``meshops predict`` writes into a copy of ``mesh``.

        Args:
            mesh: A mesh file, or a :class:`~meshops.mesh.data.MeshData` with the run's
                input fields (and parameters, boundary tags as in training); numpy
                fields are taken as tensors, and a missing ``weight`` is computed from
                its cells as for a file (:func:`~meshops.mesh.io.in_memory_mesh`).
            chunk_size: Predict meshes of more points this many at a time (0: never).
            verbose: ``False``: no progress records or bars.

        Returns:
            A :class:`~meshops.runs.report.Report` of what ``meshops predict`` adds to
            the file, by name: ``<target>_pred`` for every target (a tensor ``[N]`` or
            ``[N, C]`` over the points; for a run trained on cell data, the cell data as
            written: one array per cell block, NaN on boundary cells), ``<target>_std``
            of an ensemble, and the mesh's distances to the training set
            (``train_distance``, ``..._params``, ``..._geometry``, constant over the
            points) where the run recorded its training set. ``table()`` names them
            with their shapes; ``to_json()`` gives the values as lists.
        """
        from meshops.mesh.io import in_memory_mesh, read_mesh

        if self.metadata.get("series"):
            raise UsageError(f"{self.checkpoint}: a time-series run predicts rollouts: "
                             f"Run.predict_files(series, output, rollout=N)")
        with verbosity(verbose):
            if isinstance(mesh, (str, Path)):
                path, mesh = mesh, read_mesh(mesh)
            else:
                path = getattr(mesh, "source", None) or "the mesh"
                mesh = in_memory_mesh(mesh, str(path))
            point_data, cell_data = self._predictor.fields(mesh, path,
                                                           chunk_options(chunk_size))
        return Report({**point_data, **cell_data}, _field_lines, _field_values)

    def predict_files(self, meshes, output, *, verbose: bool = True, **options) -> Report:
        """``meshops predict``: every mesh of ``meshes`` (files or folders) written to the
        folder ``output`` with the predicted fields; a time-series run's rollouts with
        ``rollout=N``. ``options`` are :class:`~meshops.runs.predict.PredictOptions`'
        fields. The report's entries: ``written`` (the files), ``fields``, ``output``."""
        meshes = [meshes] if isinstance(meshes, (str, Path)) else list(meshes)
        opts = PredictOptions([str(m) for m in meshes], str(output), **options)
        with verbosity(verbose):
            return predict_files(self.model, self.checkpoint, self.metadata, self._members,
                                 opts)

    # ----------------------------------------------------------------- evaluate
    def evaluate(self, data, *, verbose: bool = True, **options) -> Report:
        """``meshops evaluate``: the errors on the folder ``data`` per target field and
        sample, beside the baselines that need no training. ``options`` are
        :class:`~meshops.runs.evaluate.EvaluateOptions`' fields (``plot``, ``refine``,
        ``integrals``, ``baselines``, ...). ``report["fields"][field]["l2"]["mean"]``
        is a number; ``report.table()`` the command's table; ``report.to_json()`` its
        ``--json``."""
        with verbosity(verbose):
            return evaluate_run(self.model, self.checkpoint, self.metadata,
                                EvaluateOptions(str(data), **options))

    # ------------------------------------------------------------------- export
    def export(self, output, *, verbose: bool = True, **options) -> Report:
        """``meshops export``: the model as a ``.pt2`` or ``.onnx`` program of tensors,
        written only once it reproduces the run's prediction. ``options`` are
        :class:`~meshops.runs.export.ExportOptions`' fields (``mesh``, ``dynamic``,
        ``overwrite``). The report's entries: ``output``, ``difference``,
        ``tolerance`` and the program's signature."""
        with verbosity(verbose):
            return export_run(self.path, ExportOptions(str(output), **options))

    def __repr__(self) -> str:
        m = self.metadata
        return (f"Run({str(self.path)!r}: {self.model.model_name}, inputs "
                f"{list(m.get('inputs') or [])} -> targets {list(m.get('targets') or [])})")


def _recorded_history(checkpoint: Path) -> list[dict]:
    """The Trainer's records in the ``history.json`` beside ``checkpoint`` (none for a
    fitted model, whose history.json holds its candidates, or a file without one)."""
    path = Path(checkpoint).parent / "history.json"
    try:
        history = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return history if isinstance(history, list) else []


def _field_lines(fields: dict) -> list[str]:
    """The fields of a prediction, one line each, with their shapes."""
    def shape(v) -> str:
        if isinstance(v, (list, tuple)):  # cell data: one array per cell block
            return " + ".join(str(list(getattr(b, "shape", ()))) for b in v)
        return str(list(getattr(v, "shape", ())))

    return [f"{name} {shape(v)}" for name, v in fields.items()]


def _field_values(fields: dict) -> dict:
    """The fields of a prediction as JSON lists."""
    import numpy as np

    def plain(v):
        if isinstance(v, (list, tuple)):
            return [plain(b) for b in v]
        return np.asarray(v, dtype=np.float64).tolist()

    return {name: plain(v) for name, v in fields.items()}


def load_run(path, device: str | None = None) -> Run:
    """The run of a folder written by ``meshops train`` or :func:`meshops.fit` (or a checkpoint
    file); see :class:`Run`."""
    return Run(path, device)
