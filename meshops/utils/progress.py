"""Progress bars for terminals only: one shared rule for the CLI, the stand-in
generators and the examples.

On a terminal a tqdm bar redraws itself with ``\\r``; redirected to a file or a pipe
every redraw is kept, and a log fills with tens of kilobytes of half-lines. So a bar
is drawn only when its stream is a terminal (tqdm's ``disable=None``; a Jupyter
notebook still gets its widget, which ``tqdm.auto`` picks there), and the caller's
one-line messages (one per epoch, one per phase) are all a log gets.
"""

from __future__ import annotations

import contextvars
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, Optional

__all__ = ["hidden_bars", "on_terminal", "progress"]

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
