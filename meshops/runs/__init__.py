"""The main job in Python: a folder of meshes to a trained run, and the use of it.

:func:`fit` trains a run as ``meshops train`` does (:mod:`~meshops.runs.train`: the
config, :class:`TrainConfig`; the data, the options the data decides, the validation
pick, the run folder with its provenance) and returns its :class:`Run` with the
``history`` and the :class:`Choice`; :func:`load_run` opens one, and a :class:`Run`
predicts (:mod:`~meshops.runs.predict`, :class:`PredictOptions`), evaluates
(:mod:`~meshops.runs.evaluate`, :class:`EvaluateOptions`: per field and sample beside
the baselines) and exports (:mod:`~meshops.runs.export`, :class:`ExportOptions`); each
gives a :class:`~meshops.runs.report.Report` with ``to_json()`` and ``table()``.
Nothing here prints: progress is logged at INFO and warnings at WARNING on the
``meshops.runs.*`` loggers. :func:`plot_file` draws a mesh file's fields (``meshops
plot``). Time series (``series=True``) are :mod:`~meshops.runs.series` (fitting one:
:mod:`~meshops.runs.series_fit`).

Imports :mod:`meshops.training` and the packages below; :mod:`meshops.cli` is a thin
shell over it: argument parsing, and printing what it returns and logs.
"""

from meshops.runs.config import TrainConfig
from meshops.runs.evaluate import EvaluateOptions
from meshops.runs.export import ExportOptions
from meshops.runs.outcome import Choice, Training
from meshops.runs.plot import plot_file
from meshops.runs.predict import PredictOptions
from meshops.runs.report import Report
from meshops.runs.run import Run, fit, load_run

__all__ = ["Choice", "EvaluateOptions", "ExportOptions", "PredictOptions", "Report", "Run",
           "TrainConfig", "Training", "fit", "load_run", "plot_file"]
