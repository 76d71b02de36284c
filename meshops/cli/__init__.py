"""The ``meshops`` command: ``info``, ``train``, ``predict``, ``evaluate``, ``export``,
``plot``, ``build-kernels``.

One module per subcommand: its parser (options, help, examples) and its ``cmd_*``
function, which calls :mod:`meshops.runs` (the job: :func:`meshops.fit`,
:class:`meshops.runs.Run`) and prints what it returns.

Every subcommand has ``--help`` with examples. Errors in the user's data or
arguments (missing files or fields, empty folders, field shapes that differ
between files, a checkpoint that does not fit the data, bad config keys) print
``meshops: error: ...`` naming the file on stderr and exit with status 2.

Imports :mod:`meshops.runs` and the packages below; nothing in meshops imports it.
Its modules parse arguments and print; the job itself is :mod:`meshops.runs`, which
logs its progress and warnings (:mod:`logging`): :func:`main` prints them as the
command's lines (:class:`meshops.cli._common.CommandLines`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import warnings
from contextlib import contextmanager

from meshops.cli import evaluate, export, info, kernels, plot, predict, train
from meshops.cli._common import command_log
from meshops.datasets.samples import load_folder
from meshops.errors import CheckpointError, MeshError, UsageError, os_reason
from meshops.fitting.config import (
    TRAIN_DEFAULTS,
    TrainConfig,
    load_config_file,
    resolve_train_config,
)
from meshops.fitting.training_run import build_model, split_files
from meshops.inference.predict import RUN_CHECKPOINT, RunSpec, load_model
from meshops.mesh.summary import mesh_summary
from meshops.runs.run_folder import RUN_CONFIG

__all__ = ["UsageError", "RUN_CHECKPOINT", "RUN_CONFIG", "RunSpec", "TRAIN_DEFAULTS",
           "TrainConfig", "build_model", "build_parser", "load_config_file", "load_folder",
           "load_model", "main", "mesh_summary", "resolve_train_config", "split_files"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshops", description="Mesh-agnostic neural operators on unstructured meshes.",
        epilog="Run 'meshops COMMAND --help' for the options and examples of a command.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (info, train, predict, evaluate, export, plot, kernels):
        command.add_parser(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the command's one line, without Python's source location."""
    print(f"meshops: warning: {message}", file=sys.stderr if file is None else file)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``kill`` and Slurm send) raised as an interrupt, so that the command
    ends as on Ctrl-C: the run folder's lock and any temporary file are removed on the
    way out, and a training run stays resumable from its ``last.pt``."""


@contextmanager
def _sigterm_interrupts():
    """While the command runs, SIGTERM raises :class:`Terminated` (the first one; a
    second ends the process at once, as without the handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings(), _sigterm_interrupts(), \
                command_log(progress_to_stderr=getattr(args, "dry_run", False)):
            warnings.showwarning = _show_warning
            return args.func(args)
    except (MeshError, CheckpointError, UsageError) as e:
        print(f"meshops: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        # A file the user named cannot be read or written (permissions, a full
        # disk, a folder that vanished, no run folder): one line, not a traceback.
        # A closed stdout pipe (``meshops info | head``) is not an error of ours.
        if isinstance(e, BrokenPipeError):
            raise
        print(f"meshops: error: {os_reason(e)}", file=sys.stderr)
        return 2
    except Terminated:
        print("meshops: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("meshops: interrupted", file=sys.stderr)
        return 130
