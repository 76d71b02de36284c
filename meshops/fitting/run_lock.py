"""One ``meshops train`` at a time in a run folder.

Two runs writing one folder interleave their files: a second run started with
``--overwrite`` while the first still trained left a ``config.yaml`` saying seed 7
beside the first run's seed-0 model. :func:`run_lock` holds an OS lock
(:mod:`filelock`) on ``RUN/.meshops-run.lock`` from the first look at the folder to
the last file written, with the holder's process id in ``RUN/.meshops-run.pid``; a
second run is refused in one line naming the folder and that pid. The OS drops the
lock when its holder dies, so a killed run leaves no stale lock.

The lock needs the folder: one made for it (and any missing parent) is removed again
when the run leaves nothing in it, so that a run refused for its data leaves no
empty run folder behind; both lock files are removed when the run ends.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from meshops.errors import UsageError
from meshops.fitting.config import option_name
from meshops.runs.common import os_reason

__all__ = ["HOLDER_FILE", "LOCK_FILE", "LOCK_FILES", "run_lock"]

LOCK_FILE = ".meshops-run.lock"
HOLDER_FILE = ".meshops-run.pid"
#: What the lock puts in a run folder (not the user's files, not a run's outputs).
LOCK_FILES = (LOCK_FILE, HOLDER_FILE)


def _make_folder(out: Path) -> list[Path]:
    """Create ``out`` and its missing parents; returns those created, outermost first."""
    missing = []
    for p in [out, *out.parents]:
        if p.exists() or p.is_symlink():
            break
        missing.append(p)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{out}: cannot write the run folder ({os_reason(e)})") from None
    return missing[::-1]


def _remove_if_empty(made: list[Path]) -> None:
    """Remove the folders made for the lock, innermost first, while they are empty."""
    for p in reversed(made):
        try:
            p.rmdir()
        except OSError:  # holds something: the run's files, or another run's lock
            return


def _holder(out: Path) -> str:
    try:
        pid = (out / HOLDER_FILE).read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "pid unknown"


def _acquire(out: Path, source: str):
    """The held lock of ``out`` (a :class:`filelock.FileLock`), or a UsageError (naming
    the options as ``source``'s caller writes them)."""
    from filelock import FileLock, Timeout

    path = out / LOCK_FILE
    for _ in range(3):
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise UsageError(f"{out}: another meshops train ({_holder(out)}) is writing this "
                             f"run folder; wait for it to end, or choose another "
                             f"{option_name('out', source)}") from None
        except OSError as e:
            raise UsageError(f"{out}: cannot write the run folder ({os_reason(e)})") from None
        if path.exists():
            return lock
        # The holder before us removed the file as it ended, after we opened it: a lock
        # on a removed file excludes nobody. Take the lock of the path as it is now.
        lock.release()
    raise UsageError(f"{out}: cannot lock the run folder ({LOCK_FILE} keeps disappearing)")


@contextmanager
def run_lock(out: Path, source: str = "command line") -> Iterator[None]:
    """Hold the lock of the run folder ``out`` (created if missing) for the ``with``
    block; see the module docstring. ``source``: whose options asked for it, for the
    message (:func:`~meshops.fitting.config.option_name`).

    Raises:
        UsageError: another process holds it (its pid named), or the folder cannot be
            created or written.
    """
    from meshops.utils.atomic import atomic_write

    out = Path(out)
    made = _make_folder(out)
    try:
        lock = _acquire(out, source)
    except UsageError:
        _remove_if_empty(made)
        raise
    try:
        try:
            atomic_write(out / HOLDER_FILE,
                         lambda tmp: Path(tmp).write_text(f"{os.getpid()}\n"))
        except OSError as e:
            raise UsageError(f"{out}: cannot write the run folder ({os_reason(e)})") from None
        yield
    finally:
        # Removed while still held, so that a run that opened the file before this
        # sees it gone once it gets the lock (see _acquire).
        for name in (HOLDER_FILE, LOCK_FILE):
            (out / name).unlink(missing_ok=True)
        lock.release()
        _remove_if_empty(made)
