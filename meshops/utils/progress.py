"""Progress bars for terminals only: one shared rule for the CLI, the stand-in
generators and the examples.

On a terminal a tqdm bar redraws itself with ``\\r``; redirected to a file or a pipe
every redraw is kept, and a log fills with tens of kilobytes of half-lines. So a bar
is drawn only when its stream is a terminal (tqdm's ``disable=None``; a Jupyter
notebook still gets its widget, which ``tqdm.auto`` picks there), and the caller's
one-line messages (one per epoch, one per phase) are all a log gets.
:func:`verbosity` silences the package's progress records and bars together, and a
record with ``extra=NOTE`` is a note the command prints as ``meshops: note: ...``.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, Optional

__all__ = ["NOTE", "hidden_bars", "on_terminal", "progress", "verbosity"]

_HIDDEN = contextvars.ContextVar("meshops_hidden_bars", default=False)


@contextmanager
def hidden_bars() -> Iterator[None]:
    """No bar is drawn inside (in this thread): a caller asked for silence
    (``meshops.fit(..., verbose=False)``), which a terminal or a notebook would break."""
    token = _HIDDEN.set(True)
    try:
        yield
    finally:
        _HIDDEN.reset(token)


def on_terminal(stream=None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``, where bars go) is a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def progress(iterable: Optional[Iterable] = None, *, enabled: bool = True, **kw):
    """A ``tqdm.auto`` bar over ``iterable``, drawn only on a terminal (or notebook).

    Args:
        iterable: What to iterate over (tqdm's first argument).
        enabled: False hides the bar everywhere (e.g. a ``progress=False`` option or a
            rank other than 0); so does :func:`hidden_bars`.
        **kw: tqdm's keyword arguments (``desc``, ``total``, ``unit``, ``leave`` ...).

    Returns:
        The tqdm object; iterating it yields the items of ``iterable`` either way.
    """
    from tqdm.auto import tqdm

    kw.setdefault("dynamic_ncols", True)
    # None: tqdm disables itself when its file is not a TTY (the notebook bar keeps it on)
    return tqdm(iterable, disable=None if enabled and not _HIDDEN.get() else True, **kw)


#: ``extra`` of a log record that is a note: information the user may want to act on,
#: which the command prints on standard error as ``meshops: note: ...`` (progress goes
#: to standard output, warnings are records of level WARNING).
NOTE = {"note": True}


@contextmanager
def verbosity(verbose: bool) -> Iterator[None]:
    """Inside, with ``verbose`` off: no progress records from the package's loggers (the
    ``meshops`` logger is at WARNING at least) and no progress bars; warnings still go
    where the user's logging sends them. With ``verbose`` on nothing changes: the
    records are INFO, shown where the user's logging configuration shows them."""
    if verbose:
        yield
        return
    from meshops.utils.progress import hidden_bars

    logger = logging.getLogger("meshops")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        with hidden_bars():
            yield
    finally:
        logger.setLevel(level)
