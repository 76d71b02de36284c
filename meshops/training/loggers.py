"""Experiment logging through the libraries people already read: TensorBoard
(:class:`torch.utils.tensorboard.SummaryWriter`) and MLflow, as
:class:`~meshops.training.callbacks.Callback` objects of the Trainer.

Both log the same things, with the epoch (1-based) as the step:

* ``loss/train``: the epoch's mean training loss;
* ``val/<metric>``: every validation statistic of :meth:`Trainer.evaluate`
  (``l2_mean``, ``l2_median``, ``l2_max``, their unweighted and absolute forms) and,
  with several target fields, each field's (``val/<field>/l2_mean``, ...);
* ``lr`` and ``time/epoch_s``;
* ``baseline/<name>/l2_mean`` (and ``l2_unweighted_mean``): the two baselines that need
  no training (:mod:`meshops.training.baselines`: training mean field, nearest
  training sample) on the validation samples, computed once and logged every epoch
  so that they draw as lines beside the validation curve;
* the figure ``median_validation_sample``: truth, prediction and error of the
  validation sample with the median error, at the end of training and every
  ``figure_every`` epochs;
* the run's configuration (``config``: TensorBoard text, MLflow parameters).

Only the main rank logs. The library is imported when training starts, so a missing
one is reported before the first epoch (:func:`require`).
"""

from __future__ import annotations

import math
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from meshops.training.callbacks import Callback

__all__ = ["ExperimentLogger", "LoggerError", "MLflowLogger", "TensorBoardLogger", "available",
           "require"]

#: The pip package that provides each logger.
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny"}


def available(name: str) -> bool:
    """Whether the library of logger ``name`` (``"tensorboard"``, ``"mlflow"``) imports."""
    try:
        require(name)
    except ImportError:
        return False
    return True


def require(name: str) -> None:
    """Import the library of logger ``name``, or raise ``ImportError`` saying what to install."""
    try:
        if name == "tensorboard":
            import tensorboard  # noqa: F401  (SummaryWriter needs it)
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        elif name == "mlflow":
            import mlflow  # noqa: F401
        else:
            raise ValueError(f"unknown logger {name!r}; available: {', '.join(PACKAGES)}")
    except ImportError as e:
        raise ImportError(f"the {name} logger needs the {PACKAGES[name]} package "
                          f"(pip install {PACKAGES[name]}): {e}") from None


class LoggerError(RuntimeError):
    """A logger that cannot start (e.g. an MLflow tracking store that is not a
    database); the message names the logger and its store, in one line.

    Attributes:
        logger: The logger's name (``"mlflow"``).
    """

    def __init__(self, logger: str, message: str) -> None:
        super().__init__(message)
        self.logger = logger


def _flat(config: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{"model_config.width": 64, ...}``: nested mappings flattened, lists as text."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


class ExperimentLogger(Callback):
    """What both loggers log (see the module); subclasses write it.

    Args:
        figure_every: Also draw the median validation sample every this many epochs
            (``None``: at the end of training only).
        baselines: Log the two baselines that need no training.
        config: The run's configuration, logged once (e.g. ``meshops train``'s
            resolved options).
    """

    def __init__(self, figure_every: int | None = None, baselines: bool = True,
                 config: Mapping | None = None) -> None:
        if figure_every is not None and (not isinstance(figure_every, int) or figure_every < 1):
            raise ValueError(f"figure_every must be a positive integer or None, "
                             f"got {figure_every!r}")
        self.figure_every, self.baselines, self.config = figure_every, baselines, config
        self._baseline_values: dict[str, float] = {}
        self._drawn: int | None = None
        self._open = False

    # --- what a backend implements
    def _start(self, trainer) -> None:
        raise NotImplementedError

    def _scalars(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def _figure(self, png: Path, tag: str, step: int) -> None:
        raise NotImplementedError

    def _text(self, tag: str, config: dict[str, Any]) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    # --- hooks
    def on_fit_start(self, trainer) -> None:
        if not trainer.dist.is_main:
            return
        self._start(trainer)
        self._open = True
        if self.config is not None:
            self._text("config", _flat(self.config))
        self._baseline_values = self._compute_baselines(trainer) if self.baselines else {}

    def on_epoch_end(self, trainer, entry: dict[str, Any]) -> None:
        if not self._open:
            return
        step = int(entry["epoch"])
        values = {"loss/train": entry["train_loss"], "lr": entry["lr"],
                  "time/epoch_s": entry["time_s"]}
        val = entry.get("val") or {}
        for k, v in val.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                values[f"val/{k}"] = float(v)
        for f, stats in (val.get("fields") or {}).items():  # several target fields
            for k, v in stats.items():
                if math.isfinite(v):
                    values[f"val/{f}/{k}"] = float(v)
        values.update(self._baseline_values)
        self._scalars(values, step)
        if self.figure_every is not None and step % self.figure_every == 0:
            self._draw(trainer, step)

    def on_fit_end(self, trainer) -> None:
        if not self._open:
            return
        try:
            if trainer.epoch and self._drawn != trainer.epoch:
                self._draw(trainer, trainer.epoch)
        finally:
            self._open = False
            self._stop()

    # --- pieces
    @staticmethod
    def _compute_baselines(trainer) -> dict[str, float]:
        from meshops.training.baselines import baselines

        if not trainer.val_data:
            return {}
        if not isinstance(trainer.train_data, (list, tuple)):
            # a lazily read data set (meshops.datasets.cache): the baselines would hold every
            # training sample in memory at once, which it exists to avoid
            return {}
        out = {}
        for b in baselines(list(trainer.train_data), list(trainer.val_data), trainer.fields):
            if not b.available:
                continue
            for metric, errs in b.errors.items():
                ok = errs[~np.isnan(errs)]
                if ok.size:
                    out[f"baseline/{b.name.replace(' ', '_')}/{metric}_mean"] = float(ok.mean())
        return out

    def median_sample(self, trainer) -> int | None:
        """Index in ``trainer.val_data`` of the sample with the median validation
        error (of the metric that picks ``best.pt``) at the last evaluation."""
        errs = getattr(trainer, "last_errors", None)
        if not trainer.val_data or errs is None or len(errs) != len(trainer.val_data):
            return None
        from meshops.training.loss import summarize_errors

        col = 0 if trainer.metric == "l2_mean" else 1
        return summarize_errors(errs[:, col])["median_sample"]

    def _draw(self, trainer, step: int) -> None:
        """The median sample's figure; a figure that cannot be drawn (an unusual
        geometry, a full disk) is a warning, not the end of a finished training."""
        try:
            self._draw_median(trainer, step)
        except Exception as e:  # noqa: BLE001 - any plotting or logging failure
            warnings.warn(f"meshops: the median validation sample's figure of epoch {step} "
                          f"was not logged ({type(e).__name__}: {e})", UserWarning,
                          stacklevel=2)

    def _draw_median(self, trainer, step: int) -> None:
        from torch_geometric.data import Batch

        from meshops.inference.plot import plot_comparison
        from meshops.training.dataset import prepare_batch

        i = self.median_sample(trainer)
        if i is None:
            return
        sample = trainer.val_data[i]
        if getattr(sample, "query_pos", None) is not None:
            return  # targets at query points: no field on the mesh to draw
        batch = prepare_batch(Batch.from_data_list([sample]), trainer.device)
        pred = trainer.model.predict(batch).detach().to(torch.float64).cpu()
        truth = sample.y.to(torch.float64)
        targets = trainer.metadata.get("targets") or ["u"]
        source = getattr(sample, "source", None)
        title = (f"epoch {step}: median validation sample"
                 + (f" ({Path(str(source)).name})" if source else f" (#{i})"))
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / f"median_validation_sample_epoch{step}.png"
            plot_comparison(sample, truth.squeeze(-1) if truth.shape[-1] == 1 else truth,
                            pred.squeeze(-1) if pred.shape[-1] == 1 else pred, png,
                            name=",".join(targets), title=title)
            self._figure(png, "median_validation_sample", step)
        self._drawn = step


class TensorBoardLogger(ExperimentLogger):
    """Log to TensorBoard event files in ``log_dir`` (``tensorboard --logdir DIR``).

    Args:
        log_dir: Folder of the event files (``meshops train``: ``RUN/tensorboard``).
        **kwargs: See :class:`ExperimentLogger`.

    Example::

        Trainer(model, train, val, epochs=50, out_dir="runs/a",
                callbacks=[TensorBoardLogger("runs/a/tensorboard")]).fit()
    """

    def __init__(self, log_dir, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        require("tensorboard")
        self.log_dir = Path(log_dir)
        self.writer = None

    def _start(self, trainer) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.log_dir))

    def _scalars(self, values, step) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def _figure(self, png, tag, step) -> None:
        from matplotlib.image import imread

        img = imread(png)[..., :3]  # RGBA floats in [0, 1]
        self.writer.add_image(tag, np.ascontiguousarray(img), step, dataformats="HWC")
        self.writer.flush()

    def _text(self, tag, config) -> None:
        lines = "\n".join(f"    {k}: {v}" for k, v in config.items())  # markdown code block
        self.writer.add_text(tag, lines, 0)

    def _stop(self) -> None:
        self.writer.close()


class MLflowLogger(ExperimentLogger):
    """Log to an MLflow run: metrics, the configuration as parameters, the figures as
    artifacts (``figures/``).

    Args:
        tracking_uri: Where MLflow stores the run (e.g. ``sqlite:///runs/a/mlflow.db``
            or a server's ``http://...``); ``None``: MLflow's own default
            (``MLFLOW_TRACKING_URI`` when set).
        experiment: Experiment name (default ``"meshops"``).
        run_name: Name of the MLflow run.
        artifact_location: Where a *new* experiment keeps its artifacts (a folder
            or URI; ``None``: the tracking server's default, for a local database
            ``./mlruns`` under the working directory).
        **kwargs: See :class:`ExperimentLogger`.
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str = "meshops",
                 run_name: str | None = None, artifact_location: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        require("mlflow")
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.artifact_location = artifact_location
        self.run_id: str | None = None

    def _start(self, trainer) -> None:
        import mlflow

        if self.tracking_uri is not None:
            mlflow.set_tracking_uri(self.tracking_uri)
        try:
            exp = mlflow.get_experiment_by_name(self.experiment)
            exp_id = (exp.experiment_id if exp is not None else
                      mlflow.create_experiment(self.experiment,
                                               artifact_location=self.artifact_location))
            self.run_id = mlflow.start_run(experiment_id=exp_id,
                                           run_name=self.run_name).info.run_id
        except Exception as e:  # noqa: BLE001 - MLflow's and its database drivers' errors
            first = (str(e).strip().splitlines() or [""])[0]
            raise LoggerError("mlflow", f"MLflow: cannot use the tracking store "
                              f"{mlflow.get_tracking_uri()} ({type(e).__name__}: {first})") \
                from None

    def _scalars(self, values, step) -> None:
        import mlflow

        # MLflow metric names take letters, digits, _ - . / and spaces
        mlflow.log_metrics(values, step=step)

    def _figure(self, png, tag, step) -> None:
        import mlflow

        mlflow.log_artifact(str(png), artifact_path="figures")

    def _text(self, tag, config) -> None:
        import mlflow

        # MLflow caps a parameter value at 6000 characters
        mlflow.log_params({k: str(v)[:6000] for k, v in config.items()})

    def _stop(self) -> None:
        import mlflow

        mlflow.end_run()
