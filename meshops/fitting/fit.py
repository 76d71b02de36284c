"""Fitting a run in Python: :func:`fit` trains one from a folder of meshes as ``meshops
train`` does (:func:`meshops.fitting.train.train`) and returns its
:class:`~meshops.runs.run.Run`, holding the ``history`` and the ``choice``."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from meshops.fitting.config import TrainConfig
from meshops.fitting.outcome import Training
from meshops.runs.run import Run, load_run
from meshops.utils.progress import verbosity


def fit(data=None, inputs: Sequence[str] | str | None = None,
        targets: Sequence[str] | str | None = None, *,
        config: TrainConfig | Mapping | str | Path | None = None, resume: bool = False,
        overwrite: bool = False, dry_run: bool = False, verbose: bool = True,
        **overrides) -> Run | TrainConfig:
    """Train a run as ``meshops train`` does, with the same defaults, choices and files,
    and return it. Torch's thread count, which training sets, is the caller's again
    afterwards (also after an error).

    Args:
        data: Folder of training meshes.
        inputs: Input fields (``[]`` or ``""``: geometry only; ``geo:distance`` ...).
        targets: Target fields; ``"u+v"`` joins the components of one vector field.
        config: The options below the keywords: a
            :class:`~meshops.fitting.config.TrainConfig` (its fields left unset do not
            count), a mapping of its fields, or a YAML or TOML file of them.
        resume: Continue the run in ``out``.
        overwrite: Start a new run in a folder that holds another one.
        dry_run: Read the data and choose the options, train nothing and write nothing.
        verbose: ``False``: no progress records (the ``meshops`` loggers stay at
            WARNING at least) and no progress bars. With ``True`` the progress is
            logged at INFO, shown where your logging shows it (e.g.
            ``logging.basicConfig(level="INFO", format="%(message)s")`` prints the
            command's lines).
        **overrides: Fields of :class:`~meshops.fitting.config.TrainConfig` (``out``,
            ``minutes``, ``model``, ``model_config`` as a mapping or as the words of
            ``--model-config``, ``"width=64 layers=2"``, ``epochs``, ``seed``,
            ``params``, ``val_data``, ``series``, ...), checked as the config's.

    Returns:
        The :class:`Run` of ``out`` (its ``best.pt``) with its ``history`` and
        ``choice``; with ``dry_run`` the :class:`~meshops.fitting.config.TrainConfig` the
        run would take (what ``meshops train --dry-run`` prints as YAML).

    Raises:
        UsageError: options that contradict each other or the data, a run folder that
            would lose files, named by their keywords (``epochs=``); ``MeshError`` for
            meshes that cannot be read.

    Example::

        run = meshops.fit("data/", ["f"], ["u"], minutes=2, out="runs/a")
        run.choice.model, run.history[-1]["val_l2"]
    """
    import torch

    from meshops.fitting.config import FIT
    from meshops.fitting.train import TrainRequest, train

    given = {"data": data, "inputs": inputs, "targets": targets}
    options = {**{k: v for k, v in given.items() if v is not None}, **overrides}
    request = TrainRequest(options, config, resume, overwrite, dry_run, source=FIT)
    threads = torch.get_num_threads()
    try:
        with verbosity(verbose):
            training = train(request)
    finally:
        torch.set_num_threads(threads)
    return training.config if dry_run else _fitted(training, verbose)


def _fitted(training: Training, verbose: bool) -> Run:
    """The run :func:`fit` trained, with its history and choice."""
    with verbosity(verbose):
        run = load_run(training.config.out)
    run.history = list(training.history)
    run.choice = training.choice or run.choice
    return run
