"""What a run records about its data, and whether the data behind a run is still that.

``meshops train`` records in its checkpoints (``best.pt`` and ``last.pt`` metadata):

* ``data`` (and ``val_data``): the absolute path of the folder, so that a run
  evaluated or resumed from another working directory reads its own data, not a
  ``data/`` that happens to be there;
* ``data_files`` (and ``val_files``): a fingerprint of every file read, name ->
  ``[size in bytes, modification time in ns, SHA-256 of the content]``.

:func:`changes` compares a fingerprint with the files now on disk: a file whose size
and modification time are unchanged is taken as unchanged (as ``make`` and ``rsync``
do); otherwise its content hash decides, so a copy with a new time stamp but the
same bytes is the same file. ``--resume`` refuses a run whose data changed,
``evaluate`` reports its baselines as unavailable then, and both can tell evaluated
files that are training files by their content (:func:`same_content`).

Example::

    record = fingerprint(["data/a.vtu", "data/b.vtu"])   # {"a.vtu": [size, mtime, sha]}
    changes(record, "data")                              # [] while nothing changed
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterable, Sequence

# Read in blocks: files can be larger than memory is free.
_BLOCK = 1 << 20


def digest(path) -> str:
    """SHA-256 of a file's content (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(files: Iterable, desc: str | None = None,
                known: dict | None = None) -> dict[str, list]:
    """``{file name: [size, mtime_ns, sha256]}`` of ``files`` (in one folder), in order.

    Reading every file once more costs about a second per 500 MB (the files were just
    read, so they are usually in the page cache); ``desc`` labels a progress bar.
    ``known``: fingerprints taken already (a lazy run's cache has them), used for the
    files whose size and modification time are still those.
    """
    from meshops.cli._common import progress

    out = {}
    known = known or {}
    for path in progress(list(files), desc=desc or "fingerprinting", unit="file",
                         leave=False):
        st = os.stat(path)
        name, now = Path(path).name, [int(st.st_size), int(st.st_mtime_ns)]
        had = known.get(name)
        out[name] = now + [had[2] if had and list(had[:2]) == now else digest(path)]
    return out


def changes(recorded: dict, folder, names: Sequence[str] | None = None,
            new_files: bool = True) -> list[str]:
    """How the files of ``folder`` differ from their ``recorded`` fingerprint.

    Args:
        recorded: A :func:`fingerprint`.
        folder: Where the files are now.
        names: Only these recorded files (default all).
        new_files: Also report mesh files of ``folder`` that are not recorded (a new
            file changes a run's split; it does not matter to its baselines).

    Returns:
        One short phrase per difference (``"s3.vtu: content changed"``), ``[]`` when
        none.
    """
    from meshops.datasets import list_mesh_files

    folder = Path(folder)
    out = []
    for name in (names if names is not None else list(recorded)):
        path = folder / name
        entry = recorded.get(name)
        if entry is None:
            continue
        size, mtime, sha = entry
        if not path.is_file():
            out.append(f"{name}: missing")
            continue
        st = path.stat()
        if st.st_size != size:
            out.append(f"{name}: size {size} -> {st.st_size} bytes")
        elif st.st_mtime_ns != mtime and digest(path) != sha:
            out.append(f"{name}: content changed")
    if new_files and folder.is_dir():
        out += [f"{p.name}: new file" for p in list_mesh_files(folder)
                if p.name not in recorded]
    return out


def same_content(files: Sequence, recorded: dict) -> dict[str, str]:
    """``{file name: recorded name}`` for the ``files`` whose content equals that of a
    recorded file (by size, then SHA-256)."""
    by_size: dict[int, list[tuple[str, str]]] = {}
    for name, (size, _, sha) in recorded.items():
        by_size.setdefault(size, []).append((name, sha))
    out = {}
    for path in files:
        candidates = by_size.get(os.stat(path).st_size)
        if candidates:
            sha = digest(path)
            match = next((n for n, s in candidates if s == sha), None)
            if match is not None:
                out[Path(path).name] = match
    return out


def listing(items: Sequence[str], limit: int = 3) -> str:
    """The first ``limit`` items and how many more."""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more
