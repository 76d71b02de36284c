"""What the subcommands share: the help formatter, wrapped descriptions, and the log
records of the library printed as the command's lines."""

from __future__ import annotations

import argparse
import logging
import sys
from contextlib import contextmanager
from typing import Iterator

# Subcommand help: the epilog of examples keeps its layout.
RAW = argparse.RawDescriptionHelpFormatter


def wrap(text: str) -> str:
    """A description paragraph wrapped for the raw formatter (which keeps the epilog's
    layout but would not wrap the description)."""
    import textwrap

    return textwrap.fill(" ".join(text.split()), 79)


class CommandLines(logging.Handler):
    """The package's log records as the command's lines: progress (INFO) on standard
    output as it is said (on standard error with ``progress_to_stderr``: a dry run,
    whose standard output is the config), notes as ``meshops: note: ...`` and warnings
    as ``meshops: warning: ...`` on standard error. The streams are looked up per
    record, so that a redirection made later (a test's capture) applies."""

    def __init__(self, progress_to_stderr: bool = False) -> None:
        super().__init__(logging.INFO)
        self.progress_to_stderr = progress_to_stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.levelno >= logging.WARNING:
                print(f"meshops: warning: {text}", file=sys.stderr)
            elif getattr(record, "note", False):
                print(f"meshops: note: {text}", file=sys.stderr)
            else:
                print(text, file=sys.stderr if self.progress_to_stderr else sys.stdout)
        except Exception:  # noqa: BLE001 (logging's rule: a handler never raises)
            self.handleError(record)


@contextmanager
def command_log(progress_to_stderr: bool = False) -> Iterator[None]:
    """While a command runs, the ``meshops`` logger says its INFO records through a
    :class:`CommandLines` handler (removed afterwards, the logger's level restored)."""
    logger = logging.getLogger("meshops")
    handler, level = CommandLines(progress_to_stderr), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
