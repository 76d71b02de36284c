"""Fitting a run: a folder of meshes (or of time series) to a trained run folder.

:func:`fit` trains a run as ``meshops train`` does and returns its
:class:`~meshops.runs.Run`. Here are its options (:mod:`~meshops.fitting.config`,
:class:`TrainConfig`, config files), the choice of model and sizes from the data
(:mod:`~meshops.fitting.defaults`), the neural fit (:mod:`~meshops.fitting.train`,
:mod:`~meshops.fitting.training_run`), the reduced fit (:mod:`~meshops.fitting.reduced`,
:mod:`~meshops.fitting.reduced_basis`), the series fit (:mod:`~meshops.fitting.series`,
:mod:`~meshops.fitting.series_choice`, :mod:`~meshops.fitting.trajectory_basis`), the run
folder a fit may write into, and what a resumed fit keeps
(:mod:`~meshops.fitting.out_folder`), and how a fit reads its data, in memory or lazily
(:mod:`~meshops.fitting.data`). Nothing here prints: progress is logged at INFO on the
``meshops.fitting.*`` loggers.

Imports :mod:`meshops.runs` (a fit returns the :class:`~meshops.runs.Run` it trained; the
run folder's layout, lock and provenance, :mod:`meshops.runs.run_folder`; where a model
stands against the baselines), :mod:`meshops.training` (the ``Trainer``) and the packages
below; :mod:`meshops.cli` parses the command's options into it. Nothing that uses a
trained run imports it.
"""

from meshops.fitting.config import TrainConfig
from meshops.fitting.fit import fit
from meshops.fitting.outcome import Training

__all__ = ["TrainConfig", "Training", "fit"]
