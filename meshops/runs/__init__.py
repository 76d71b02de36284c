"""The use of a trained run: open it, predict, evaluate, export, report.

:func:`load_run` opens a run folder (written by :func:`meshops.fit` or ``meshops train``)
as a :class:`Run` with its model, ``history`` and :class:`Choice`; a :class:`Run`
predicts (:mod:`~meshops.runs.predict`, :class:`PredictOptions`), evaluates
(:mod:`~meshops.runs.evaluate`, :class:`EvaluateOptions`: per field and sample beside the
baselines, where the model stands against them: :mod:`~meshops.runs.comparison`) and
exports (:mod:`~meshops.runs.export`, :class:`ExportOptions`); each gives a
:class:`~meshops.runs.report.Report` with ``to_json()`` and ``table()``. Time series are
rolled out and evaluated beside them (:mod:`~meshops.runs.series`,
:mod:`~meshops.runs.horizon`); the trust reports (:mod:`~meshops.runs.trust_reports`) and
the run folder (:mod:`~meshops.runs.run_folder`: its layout, its lock, what it records
about its data) are here too. :func:`plot_file` draws a mesh file's fields. Nothing here
prints: progress is logged at INFO and warnings at WARNING on the ``meshops.runs.*``
loggers.

Imports :mod:`meshops.training` (the metric, the baselines) and the packages below; never
:mod:`meshops.fitting`, which trains runs and imports this package
(``tests/package/test_import_graph.py`` checks that). :mod:`meshops.cli` parses arguments
and prints what it returns and logs.
"""

from meshops.runs.choice import Choice
from meshops.runs.evaluate import EvaluateOptions
from meshops.runs.export import ExportOptions
from meshops.runs.plot import plot_file
from meshops.runs.predict import PredictOptions
from meshops.runs.report import Report
from meshops.runs.run import Run, load_run

__all__ = ["Choice", "EvaluateOptions", "ExportOptions", "PredictOptions", "Report", "Run",
           "load_run", "plot_file"]
