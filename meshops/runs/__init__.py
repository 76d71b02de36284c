"""The main job in Python: a folder of meshes to a trained run, and the use of it.

:func:`fit` trains a run as ``meshops train`` does (:mod:`~meshops.runs.train`: the
config, the data, the options the data decides, the validation pick, the run folder
with its provenance), :func:`load_run` opens one, and a :class:`Run` predicts
(:mod:`~meshops.runs.predict`), evaluates (:mod:`~meshops.runs.evaluate`, per field and
sample beside the baselines) and exports (:mod:`~meshops.runs.export`); each gives a
:class:`~meshops.runs.report.Report` with ``to_json()`` and ``table()``;
:func:`plot_file` draws a mesh file's fields (``meshops plot``). Time series
(``series=True``) are :mod:`~meshops.runs.series`.

Imports :mod:`meshops.training` and the packages below; :mod:`meshops.cli` is a thin
shell over it: argument parsing and printing.
"""

from meshops.runs.plot import plot_file
from meshops.runs.report import Report
from meshops.runs.run import Run, fit, load_run

__all__ = ["Report", "Run", "fit", "load_run", "plot_file"]
