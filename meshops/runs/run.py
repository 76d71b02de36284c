"""A trained run in Python: :func:`fit` trains one from a folder of meshes as ``meshops
train`` does, :func:`load_run` opens one, and a :class:`Run` predicts, evaluates and
exports as ``meshops predict``, ``evaluate`` and ``export`` do, with the same defaults,
files and numbers (the commands are thin shells over these functions)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Sequence

from meshops.errors import UsageError
from meshops.inference.predict import load_model
from meshops.runs.evaluate import EvaluateOptions, evaluate_run
from meshops.runs.export import ExportOptions, export_run
from meshops.runs.predict import PredictOptions, Predictor, chunk_options, predict_files
from meshops.runs.report import Report


class Run:
    """A trained run: the model of its ``best.pt`` with what training recorded.

    Args:
        path: The run folder (``RUN/best.pt`` is used) or a checkpoint file.
        device: Where the model runs (default ``cuda`` when available).

    Attributes:
        model: The :class:`~meshops.models.NeuralOperator` (or reduced basis).
        checkpoint: The checkpoint file it was loaded from.
        metadata: What training recorded: fields, shapes, data files, split, config.

    Example::

        run = meshops.load_run("runs/poisson")
        fields = run.predict("case.vtu")           # {"u_pred": tensor [N, ...], ...}
        report = run.evaluate("test/")              # per field and sample, baselines
        print(report.table())
    """

    def __init__(self, path, device: str | None = None) -> None:
        self.path, self.device = Path(path), device
        self.model, self.checkpoint, self.metadata = load_model(path, device)

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

    def predict(self, mesh, *, chunk_size: int | None = None) -> dict:
        """The fields ``meshops predict`` writes into a copy of ``mesh``.

        Args:
            mesh: A mesh file, or a :class:`~meshops.mesh.data.MeshData` with the run's
                input fields (and parameters, boundary tags as in training); numpy
                fields are taken as tensors, and a missing ``weight`` is computed from
                its cells as for a file (:func:`~meshops.mesh.io.in_memory_mesh`).
            chunk_size: Predict meshes of more points this many at a time (0: never).

        Returns:
            What ``meshops predict`` adds to the file, by name: ``<target>_pred`` for
            every target (a tensor ``[N]`` or ``[N, C]`` over the points; for a run
            trained on cell data, the cell data as written: one array per cell block,
            NaN on boundary cells), ``<target>_std`` of an ensemble, and the mesh's
            distances to the training set (``train_distance``, ``..._params``,
            ``..._geometry``, constant over the points) where the run recorded its
            training set.
        """
        from meshops.mesh.io import in_memory_mesh, read_mesh

        if self.metadata.get("series"):
            raise UsageError(f"{self.checkpoint}: a time-series run predicts rollouts: "
                             f"Run.predict_files(series, output, rollout=N)")
        if isinstance(mesh, (str, Path)):
            path, mesh = mesh, read_mesh(mesh)
        else:
            path = getattr(mesh, "source", None) or "the mesh"
            mesh = in_memory_mesh(mesh, str(path))
        point_data, cell_data = self._predictor.fields(mesh, path, chunk_options(chunk_size))
        return {**point_data, **cell_data}

    def predict_files(self, meshes, output, **options) -> Report:
        """``meshops predict``: every mesh of ``meshes`` (files or folders) written to the
        folder ``output`` with the predicted fields; a time-series run's rollouts with
        ``rollout=N``. ``options`` are :class:`~meshops.runs.predict.PredictOptions`'."""
        meshes = [meshes] if isinstance(meshes, (str, Path)) else list(meshes)
        opts = PredictOptions([str(m) for m in meshes], str(output), **options)
        return predict_files(self.model, self.checkpoint, self.metadata, self._members, opts)

    # ----------------------------------------------------------------- evaluate
    def evaluate(self, data, **options) -> Report:
        """``meshops evaluate``: the errors on the folder ``data`` per target field and
        sample, beside the baselines that need no training. ``options`` are
        :class:`~meshops.runs.evaluate.EvaluateOptions`' (``plot``, ``refine``,
        ``integrals``, ``baselines``, ...). ``report["fields"][field]["l2"]["mean"]``
        is a number; ``report.table()`` the command's table; ``report.to_json()`` its
        ``--json``."""
        return evaluate_run(self.model, self.checkpoint, self.metadata,
                            EvaluateOptions(str(data), **options))

    # ------------------------------------------------------------------- export
    def export(self, output, **options) -> Report:
        """``meshops export``: the model as a ``.pt2`` or ``.onnx`` program of tensors,
        written only once it reproduces the run's prediction. ``options`` are
        :class:`~meshops.runs.export.ExportOptions`' (``mesh``, ``dynamic``,
        ``overwrite``)."""
        return export_run(self.path, ExportOptions(str(output), **options))

    def __repr__(self) -> str:
        m = self.metadata
        return (f"Run({str(self.path)!r}: {self.model.model_name}, inputs "
                f"{list(m.get('inputs') or [])} -> targets {list(m.get('targets') or [])})")


def load_run(path, device: str | None = None) -> Run:
    """The run of a folder written by ``meshops train`` or :func:`fit` (or a checkpoint
    file); see :class:`Run`."""
    return Run(path, device)


def fit(data=None, inputs: Sequence[str] | str | None = None,
        targets: Sequence[str] | str | None = None, *, out=None, minutes: float | None = None,
        config=None, resume: bool = False, overwrite: bool = False, dry_run: bool = False,
        **options) -> Run | dict:
    """Train a run as ``meshops train`` does, with the same defaults, choices, files and
    printed report, and return it. Torch's thread count, which training sets, is the
    caller's again afterwards (also after an error).

    Args:
        data: Folder of training meshes (``--data``).
        inputs: Input fields (``[]`` or ``""``: geometry only; ``geo:distance`` ...).
        targets: Target fields; ``"u+v"`` joins the components of one vector field.
        out: The run folder (default ``./run``).
        minutes: The wall-clock budget (default 10).
        config: A YAML or TOML file of options, below the keywords.
        resume: Continue the run in ``out``.
        overwrite: Start a new run in a folder that holds another one.
        dry_run: Read the data and choose the options as ``meshops train --dry-run``
            does, train nothing and write nothing.
        **options: Any other option of ``meshops train`` by its long name (``model``,
            ``model_config`` as a mapping or a string as ``--model-config`` takes it,
            ``"width=64 layers=2"``, ``epochs``, ``seed``, ``params``, ``val_data``,
            ``series``, ...).

    Returns:
        The :class:`Run` of ``out`` (its ``best.pt``); with ``dry_run`` the resolved
        options instead, the mapping ``meshops train --dry-run`` prints as YAML.

    Raises:
        UsageError: options that contradict each other or the data, a run folder that
            would lose files; ``MeshError`` for meshes that cannot be read.

    Example::

        run = meshops.fit("data/", inputs=["f"], targets=["u"], minutes=2, out="runs/a")
    """
    import torch

    from meshops.runs.config import FIT, TrainConfig
    from meshops.runs.train import TrainRequest, train

    given = {"data": data, "inputs": inputs, "targets": targets, "out": out,
             "minutes": minutes, **options}
    request = TrainRequest({k: v for k, v in given.items() if v is not None},
                           None if config is None else str(config), resume, overwrite,
                           dry_run, source=FIT)
    threads = torch.get_num_threads()
    try:
        if dry_run:
            return _dry_run(request)
        train(request)
    finally:
        torch.set_num_threads(threads)
    return load_run(TrainConfig.resolve(request).out)


def _dry_run(request) -> dict:
    """The options :func:`meshops.runs.train.train` resolves for a dry run: what it
    prints to standard output (and only that there: ``--dry-run > config.yaml`` is a
    config file), read back."""
    import contextlib
    import io

    import yaml

    from meshops.runs.train import train

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        train(request)
    return yaml.safe_load(text.getvalue())
