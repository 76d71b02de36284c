"""The run folder: what it holds, its lock, and what it records about its data.

A run folder is written by :func:`meshops.fit` (``meshops train``) and read by
:func:`meshops.load_run`: :data:`RUN_FILES` are what a fit writes into it (its config,
checkpoints, history, a time-series run's candidates), :data:`LOCK_FILES` what its
lock puts there while it runs, :data:`TENSORBOARD_FOLDER` the event files of
TensorBoard. Both the fitting and the use of a run import this module.

**The lock.** Two runs writing one folder interleave their files: a second run started
with ``--overwrite`` while the first still trained left a ``config.yaml`` saying seed 7
beside the first run's seed-0 model. :func:`run_lock` holds an OS lock
(:mod:`filelock`) on ``RUN/.meshops-run.lock`` from the first look at the folder to
the last file written, with the holder's process id in ``RUN/.meshops-run.pid``; a
second run is refused in one line naming the folder and that pid. The OS drops the
lock when its holder dies, so a killed run leaves no stale lock.

The lock needs the folder: one made for it (and any missing parent) is removed again
when the run leaves nothing in it, so that a run refused for its data leaves no
empty run folder behind; both lock files are removed when the run ends.

**Provenance.** What a run records about its data, and whether the data behind a run
is still that. A fit records in its checkpoints (``best.pt`` and ``last.pt`` metadata):

* ``data`` (and ``val_data``): the absolute path of the folder, so that a run
  evaluated or resumed from another working directory reads its own data, not a
  ``data/`` that happens to be there;
* ``data_files`` (and ``val_files``): a fingerprint of every file read, name ->
  ``[size in bytes, modification time in ns, SHA-256 of the content]``;
* ``param_files`` (and ``val_param_files``), for a run with parameters: the
  fingerprint of the folder's ``params.csv`` / ``params.json`` (empty when it has
  none), which gives the samples' values as much as the mesh files do.

A time-series run records in ``data_files`` every file of every series (its steps,
its ``.pvd`` or ``.xdmf``, the HDF5 files an ``.xdmf`` names) by its path in the
folder, and its parameter file: :func:`series_changes` also reports a series added
or removed (which would redraw the split).

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
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from meshops.errors import UsageError, os_reason

#: The options of a run, as ``fit`` resolved them (``TrainConfig.render()``).
RUN_CONFIG = "config.yaml"
#: The sub-folder of the run folder that holds TensorBoard's event files.
TENSORBOARD_FOLDER = "tensorboard"
#: A time-series run's candidates beside ``best.pt``, and its record of the pick.
CANDIDATE, NEURAL, CHOICE = "trajectory_basis.pt", "next_step.pt", "choice.json"
#: What a fit writes into its folder (removed before a new run, so that a run never
#: leaves another's files behind).
RUN_FILES = (RUN_CONFIG, "best.pt", "last.pt", "history.json", CANDIDATE, NEURAL, CHOICE)

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


def _acquire(out: Path, out_option: str):
    """The held lock of ``out`` (a :class:`filelock.FileLock`), or a UsageError (naming
    ``out_option``, the option that chose the folder, as its caller writes it)."""
    from filelock import FileLock, Timeout

    path = out / LOCK_FILE
    for _ in range(3):
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise UsageError(f"{out}: another meshops train ({_holder(out)}) is writing this "
                             f"run folder; wait for it to end, or choose another "
                             f"{out_option}") from None
        except OSError as e:
            raise UsageError(f"{out}: cannot write the run folder ({os_reason(e)})") from None
        if path.exists():
            return lock
        # The holder before us removed the file as it ended, after we opened it: a lock
        # on a removed file excludes nobody. Take the lock of the path as it is now.
        lock.release()
    raise UsageError(f"{out}: cannot lock the run folder ({LOCK_FILE} keeps disappearing)")


@contextmanager
def run_lock(out: Path, out_option: str = "--out") -> Iterator[None]:
    """Hold the lock of the run folder ``out`` (created if missing) for the ``with``
    block (see the module docstring). ``out_option``: the option that chose ``out``, as
    the caller writes it (``--out``, ``out=``), for the message.

    Raises:
        UsageError: another process holds it (its pid named), or the folder cannot be
            created or written.
    """
    from meshops.utils.atomic import atomic_write

    out = Path(out)
    made = _make_folder(out)
    try:
        lock = _acquire(out, out_option)
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


# Read in blocks: files can be larger than memory is free.
_BLOCK = 1 << 20


def digest(path) -> str:
    """SHA-256 of a file's content (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(files: Iterable, desc: str | None = None, root=None,
                known: dict | None = None) -> dict[str, list]:
    """``{file name: [size, mtime_ns, sha256]}`` of ``files`` (in one folder), in order;
    with ``root``, keyed by the path relative to ``root`` (files in its subfolders).

    Reading every file once more costs about a second per 500 MB (the files were just
    read, so they are usually in the page cache); ``desc`` labels a progress bar.
    ``known``: fingerprints taken already (a lazy run's cache has them), used for the
    files whose size and modification time are still those.
    """
    from meshops.utils.progress import progress

    out = {}
    known = known or {}
    for path in progress(list(files), desc=desc or "fingerprinting", unit="file",
                         leave=False):
        st = os.stat(path)
        key = Path(path).relative_to(root).as_posix() if root is not None else Path(path).name
        now = [int(st.st_size), int(st.st_mtime_ns)]
        had = known.get(key)
        out[key] = now + [had[2] if had and list(had[:2]) == now else digest(path)]
    return out


def param_fingerprint(folder) -> dict[str, list]:
    """The :func:`fingerprint` of the parameter files (params.csv, params.json) of
    ``folder``; empty when it has none."""
    from meshops.datasets.params import PARAM_FILES

    return fingerprint([Path(folder) / n for n in PARAM_FILES if (Path(folder) / n).is_file()])


def param_changes(recorded: dict, folder) -> list[str]:
    """How the parameter files of ``folder`` differ from their :func:`param_fingerprint`
    ``recorded``: changed, missing, or new (``[]`` when none)."""
    from meshops.datasets.params import PARAM_FILES

    return changes(recorded, folder, new_files=False) + [
        f"{n}: new file" for n in PARAM_FILES
        if n not in recorded and (Path(folder) / n).is_file()]


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
    from meshops.datasets.folder import list_mesh_files

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


def refuse_changed(diff: Sequence[str], last: Path) -> None:
    """Refuse to resume the run of checkpoint ``last`` when its data changed (``diff``:
    the phrases of :func:`changes`, :func:`param_changes` or :func:`series_changes`)."""
    from meshops.errors import UsageError

    if diff:
        raise UsageError(f"{last}: the data behind this run changed since it was trained "
                       f"({listing(list(diff))}); --resume continues on the files it was "
                       f"trained on: restore them, or start a new run with another --out")


def listing(items: Sequence[str], limit: int = 3) -> str:
    """The first ``limit`` items and how many more."""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


# ------------------------------------------------------------------ time series
def _series_files(series) -> list[Path]:
    """The files a series was read from: its steps, its .pvd or .xdmf, and the HDF5
    files an .xdmf names."""
    import re

    files = [Path(p) for p in series.steps] + [Path(series.source)]
    src = Path(series.source)
    if src.is_file() and src.suffix.lower() in (".xdmf", ".xmf"):
        text = src.read_text(errors="replace")
        files += [src.parent / m for m in re.findall(r"([^\s<>\"':]+\.(?:h5|hdf5|hdf)):", text)]
    return list(dict.fromkeys(p for p in files if p.is_file()))


def series_fingerprint(root, series: Sequence, desc: str | None = None) -> dict[str, list]:
    """The :func:`fingerprint` of every file of ``series`` (read from folder ``root``),
    keyed by the path in ``root``, and of ``root``'s parameter file."""
    files = [p for s in series for p in _series_files(s)]
    files += [Path(root) / n for n in param_fingerprint(root)]
    return fingerprint(list(dict.fromkeys(files)), desc, root=Path(root))


def series_keys(recorded: dict, names: Sequence[str]) -> list[str]:
    """The entries of a :func:`series_fingerprint` that belong to the series ``names``
    (``name/...``, ``name.pvd``, ``name.xdmf``, ...) or are a parameter file."""
    from meshops.datasets.params import PARAM_FILES

    names = set(names)
    return [k for k in recorded if k in PARAM_FILES or k.split("/")[0] in names
            or ("/" not in k and Path(k).stem in names)]


def series_changes(recorded: dict, root, names: Sequence[str]) -> list[str]:
    """How the series folder ``root`` differs from its :func:`series_fingerprint`
    ``recorded`` for the series ``names`` it held: a changed or missing file, a new
    parameter file, a series added or removed."""
    from meshops.datasets.params import PARAM_FILES
    from meshops.datasets.series import list_series, series_name
    from meshops.errors import MeshError

    out = changes(recorded, root, new_files=False)
    out += [d for d in param_changes({k: v for k, v in recorded.items() if k in PARAM_FILES},
                                     root) if d.endswith("new file")]
    try:
        now = [series_name(p) for p in list_series(root)]
    except MeshError as e:  # no longer a folder of series
        return out + [str(e)]
    out += [f"{n}: new series" for n in now if n not in names]
    out += [f"{n}: series missing" for n in names if n not in now]
    return out


def training_samples(meta: dict, inputs: Sequence[str], targets: Sequence[str], layout=None):
    """A run's training samples (``meta["data"]``, files ``meta["split"]["train"]``)
    in float64, read as ``layout`` says (then ``inputs`` are its own), or ``(None, why
    not)``: also when the files differ from the fingerprint the run recorded
    (``meta["data_files"]`` and ``meta["param_files"]``, see above)."""
    import torch

    from meshops.datasets.folder import MeshFolderDataset
    from meshops.errors import MeshError

    root, train = meta.get("data"), (meta.get("split") or {}).get("train")
    if not root or not train:
        return None, "n/a: the checkpoint does not record its training files"
    if not Path(root).is_dir():
        return None, f"n/a: the training data {root} is not here"
    recorded = meta.get("data_files")
    if isinstance(recorded, dict):
        diff = changes(recorded, root, names=train, new_files=False)
        if isinstance(meta.get("param_files"), dict):
            diff += param_changes(meta["param_files"], root)
        if diff:
            return None, (f"n/a: the training data in {root} changed since the run was "
                          f"trained ({listing(diff)})")
    try:
        ds = MeshFolderDataset(root, inputs=layout.inputs if layout else inputs,
                               targets=targets, dtype=torch.float64, layout=layout)
        index = {Path(f).name: i for i, f in enumerate(ds.files)}
        missing = [n for n in train if n not in index]
        if missing:
            return None, (f"n/a: {len(missing)} training file(s) are no longer in {root} "
                          f"(e.g. {missing[0]})")
        return [ds[index[n]] for n in train], ""
    except (MeshError, OSError, ValueError, KeyError) as e:
        return None, f"n/a: cannot read the training data {root} ({e})"
