"""Write files completely or not at all."""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

# Temporary files are named ".<stem>.meshops-<host>-<pid>-<random>.tmp<suffix>", so
# that a later write can tell ours from anything else and see whether the writer is
# still alive: a writer killed with SIGKILL (or a power cut) cannot remove its own.
_TAG = "meshops"
_STALE = re.compile(rf"^\..*\.{_TAG}-(?P<host>[^-]*)-(?P<pid>\d+)-[^.]*\.tmp")
# A temporary file of another host (a shared file system) whose writer cannot be
# asked counts as stale after this long; no write takes a day.
_STALE_AGE_S = 24 * 3600
_cleaned: set[Path] = set()


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove temporary files of killed :func:`atomic_write` calls (and temporary
    folders of :func:`atomic_folder` calls) from ``folder``.

    A file counts as stale when its writer (host and process id in its name) is
    this host's and no longer runs, or is another host's and older than a day.
    Anything not named like our temporary files is left alone.

    Returns:
        The removed paths.
    """
    folder = Path(folder)
    host, now, removed = _host(), time.time(), []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for e in entries:
        m = _STALE.match(e.name)
        is_dir = e.is_dir(follow_symlinks=False)
        if not m or not (is_dir or e.is_file(follow_symlinks=False)):
            continue
        try:
            if m["host"] == host:
                stale = int(m["pid"]) != os.getpid() and not _alive(int(m["pid"]))
            else:
                stale = now - e.stat(follow_symlinks=False).st_mtime > _STALE_AGE_S
            if stale:
                shutil.rmtree(e.path) if is_dir else os.unlink(e.path)
                removed.append(Path(e.path))
        except OSError:  # raced with another cleaner, or not ours to remove
            continue
    return removed


def _prefix(path: Path) -> str:
    """The start of a temporary name beside ``path`` (see ``_STALE``)."""
    return f".{path.stem}.{_TAG}-{_host()}-{os.getpid()}-"


def _clean_once(path: Path) -> None:
    folder = path.parent.resolve()
    if folder not in _cleaned:  # once per folder: predict writes thousands of files
        clean_stale_temporaries(folder)
        _cleaned.add(folder)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it over
    ``path``. On any failure the temporary file is removed and ``path`` is untouched.

    The temporary name keeps ``path``'s suffix so that writers that dispatch on it
    (meshio, torch.save) see the right one. The first write of a process to a folder
    also removes the temporary files that killed writers left there (see
    :func:`clean_stale_temporaries`).
    """
    path = Path(path)
    if path.is_dir():  # else the rename fails naming the temporary file
        raise IsADirectoryError(errno.EISDIR, "Is a directory (give a file name)", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    _clean_once(path)
    tmp = None
    try:
        # The name is known before the file exists (unlike mkstemp's), so that an
        # interrupt (SIGINT, or SIGTERM under the CLI) raised just after the file is
        # made still finds it in the cleanup below.
        while True:
            tmp = str(path.parent / f"{_prefix(path)}{secrets.token_hex(4)}.tmp{path.suffix}")
            try:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                break
            except FileExistsError:  # another write of this process drew the same name
                continue
        write(tmp)
        # made 0600 above; give the file the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_folder(path: str | os.PathLike, write: Callable[[str], None],
                  before_replace: Callable[[], None] | None = None) -> Path:
    """Call ``write(tmp_folder)`` on an empty temporary folder beside ``path``, then put
    it in place of ``path`` (a folder of many files, such as the steps of a time
    series). On a failure in ``write`` the temporary folder is removed and ``path`` is
    untouched.

    An existing ``path`` is first renamed aside and removed after the new folder is in
    place: a folder cannot be renamed over a non-empty one, so for a moment neither
    exists (never a mixture of the two). ``before_replace`` runs just before that swap,
    once everything is written: e.g. to remove a file that indexes the old folder, so
    that it never points into the new one. Temporary folders of killed writers are
    removed like :func:`atomic_write`'s temporary files.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _clean_once(path)
    tmp = tempfile.mkdtemp(prefix=_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp creates 0700
        if before_replace is not None:
            before_replace()
        old = None
        if path.exists():
            old = tempfile.mkdtemp(prefix=_prefix(path), suffix=".tmp", dir=path.parent)
            os.replace(path, old)  # onto the empty folder just made
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:  # put the old folder back
                os.replace(old, path)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path
