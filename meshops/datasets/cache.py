"""An on-disk cache of parsed meshes and their mesh structures, read lazily.

For data sets whose parsed form does not fit in memory (``meshops train --lazy``): every
mesh file is parsed once into a *sample* entry (the training sample: ``pos``,
``weight``, ``x``, ``y``, ...), a model's mesh-only structures
(:meth:`~meshops.models.NeuralOperator.mesh_transform`: PiT's latent mesh and graphs,
partitions, ...) are computed once into a *structured* entry, and
:class:`CachedMeshDataset` reads the entries one sample at a time, e.g. in the
worker processes of a :class:`~torch.utils.data.DataLoader`. Only the list of files
and a few numbers per file stay in memory.

Layout of a cache folder (every file an entry of :mod:`meshops.datasets.entry` or JSON,
written atomically by :func:`meshops.utils.atomic.atomic_write`)::

    CACHE/meshops-cache.json         the layout version of the folder
    CACHE/sample/ab/<key>.entry      one parsed sample per file content and settings
    CACHE/structured/cd/<key>.entry  the sample with a model's mesh structures
    CACHE/manifests/<id>.json        per data folder and settings: each file's size,
                                     times, content digest and entry (a memo)

**Keys.** A sample entry's key is a SHA-256 of the file's *content* (its SHA-256), the
reading settings (inputs, targets, dtype, ..., and the content of the parameter file
that gives the samples' parameters), :data:`CACHE_VERSION` and the meshops
version; a structured entry's key adds the model's structure settings (its
``mesh_transform()``'s description: PiT's latent size, quantiles, ball, dtype, ...).
A file whose content changes gets a new key, so its entry is rebuilt; another meshops
version or other settings use other entries. The content digest of a file is
remembered in the manifest with the file's size, modification and status-change times
(``st_ctime``, which no tool can set back) and inode: only a file whose status changed
is read again to hash it.

**Safe to share.** Entries are written to a temporary file and renamed into place, so a
reader (another run, another worker) sees a whole entry or none; two runs that build
the same entry write the same bytes. Every read checks the whole entry (its lengths and
CRC-32, :func:`meshops.datasets.entry.read_entry`) and its header (format, version,
key): a damaged, truncated or foreign entry is never used. A
:class:`CachedMeshDataset` rebuilds such an entry from its file when the file's
content is still the one the run started with, and raises :class:`CacheError`
otherwise. A cache folder of another layout version is refused with a
:class:`CacheError` naming both versions.

**Resumable.** Every entry is written as soon as it is built: an interrupted build
(Ctrl-C, a killed job, a bad file) continues where it stopped on the next call.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch import Tensor

from meshops.datasets.entry import EntryError, entry_bytes, read_entry
from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.utils.atomic import atomic_write

__all__ = ["CACHE_VERSION", "CacheError", "CachedMeshDataset", "MeshCache", "Part",
           "default_cache_dir", "file_digest"]

#: Bump when the parsed form of a sample (what a reader or a mesh transform produces for
#: the same file and settings) or the entries' layout changes: older entries are then
#: never read (their keys differ). 2: a sample's meta records its trust descriptors
#: (a run needs no second read of its samples, and a data-parallel process none of
#: another process's part). 3: entries are :mod:`meshops.datasets.entry` files, not
#: torch archives, and the descriptors' bounds cover the parameters too.
CACHE_VERSION = 3
#: The layout of the folder itself (subfolders, manifests); a folder of another
#: layout is refused rather than guessed at.
LAYOUT = 1
FORMAT = "meshops-mesh-cache"
MARKER = "meshops-cache.json"
SAMPLE, STRUCTURED = "sample", "structured"
# How often the manifest is saved during a build (seconds): an interrupted build then
# finds most of its work without hashing the files again.
_SAVE_EVERY_S = 30.0


class CacheError(MeshError):
    """A cache entry or folder that cannot be used: written by another layout version,
    damaged, truncated, or a file that changed while a run was using the cache.

    A :class:`~torch.utils.data.DataLoader` worker's error reaches the main process as
    ``"Caught CacheError in DataLoader worker process 0. Original Traceback ..."``;
    the message is cut back to the one line it was raised with.
    """

    def __init__(self, message: str = "") -> None:
        m = re.search(r"\n[\w.]*CacheError: (.*?)\s*$", str(message), re.S)
        super().__init__(m.group(1) if m and str(message).startswith("Caught ") else message)


def default_cache_dir() -> Path:
    """``$MESHOPS_CACHE_DIR``, else ``$XDG_CACHE_HOME/meshops/meshes`` (by default
    ``~/.cache/meshops/meshes``)."""
    env = os.environ.get("MESHOPS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "meshops" / "meshes"


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stat_record(path: Path) -> dict:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "ino": st.st_ino}


def _json_digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def entry_key(kind: str, settings: dict, content: str) -> str:
    """The key of an entry of ``kind`` for ``content`` (a file's digest, or the key of the
    sample entry a structured entry is built from) under ``settings``."""
    from meshops.version import __version__

    return _json_digest({"format": FORMAT, "cache_version": CACHE_VERSION,
                         "meshops": __version__, "kind": kind, "settings": settings,
                         "content": content})


# ------------------------------------------------------------ per-sample statistics
def _moments(v: Tensor, w: Tensor) -> list:
    """``[W, mean, M2]`` of the channels of ``v [N, C]`` under weights ``w [N]`` (float64,
    two passes): what :func:`_merge` combines exactly into the statistics of a set."""
    v, w = v.reshape(v.shape[0], -1).to(torch.float64), w.to(torch.float64)
    total = float(w.sum())
    if total <= 0:
        return [0.0, [0.0] * v.shape[1], [0.0] * v.shape[1]]
    mean = (w[:, None] * v).sum(0) / total
    m2 = (w[:, None] * (v - mean) ** 2).sum(0)
    return [total, mean.tolist(), m2.tolist()]


def _means_and_sizes(metas: list[dict]) -> tuple[Tensor, Tensor]:
    """Each sample's input means and target root mean squares from its recorded moments
    (:func:`meshops.reduced.parameters.means_and_sizes` without reading it)."""
    means = torch.tensor([m["x_moments"][1] for m in metas], dtype=torch.float64)
    y = [m["y_moments"] for m in metas]
    mean = torch.tensor([v[1] for v in y], dtype=torch.float64)
    m2 = torch.tensor([v[2] for v in y], dtype=torch.float64)
    total = torch.tensor([max(v[0], 1e-300) for v in y], dtype=torch.float64)[:, None]
    return means, (m2 / total + mean * mean).sqrt()


def _merge(parts: Iterable[list]) -> tuple[float, Tensor, Tensor]:
    """Weighted mean and ``M2`` of a union from its parts' ``[W, mean, M2]`` (Chan et
    al.'s pairwise update: no cancellation between large offsets)."""
    total, mean, m2 = 0.0, None, None
    for w, mu, q in parts:
        mu, q = torch.tensor(mu, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
        if mean is None:
            mean, m2 = torch.zeros_like(mu), torch.zeros_like(q)
        if w <= 0:
            continue
        new = total + w
        delta = mu - mean
        mean = mean + delta * (w / new)
        m2 = m2 + q + delta ** 2 * (total * w / new)
        total = new
    return total, mean, m2


def sample_meta(sample) -> dict:
    """What a cache records of a sample so that a run needs no second read of it: the
    point count and dimension, a digest of ``pos`` (samples of one mesh), the facts
    :func:`meshops.fitting.defaults.data_facts` reads, the weighted moments of ``x``
    and ``y`` (normalisers, :meth:`CachedMeshDataset.normalizers`) and the descriptors
    of :func:`meshops.datasets.descriptors.describe` with their
    :func:`~meshops.datasets.descriptors.tolerance`
    (:meth:`CachedMeshDataset.descriptors`)."""
    from meshops.datasets.descriptors import describe, mesh_key, tolerance
    from meshops.mesh.digest import mesh_digest
    from meshops.reduced import input_ranges

    params, geometry = describe(sample)
    meta = {"points": int(sample.pos.shape[0]), "dim": int(sample.pos.shape[1]),
            # + 0.0: -0.0 and 0.0 are one coordinate (torch.equal), not two digests
            "pos_digest": mesh_digest(sample.pos + 0.0),
            "x_ranges": input_ranges(sample),
            # the training set's descriptors (meshops.inference.trust) without a second read
            "descriptor": [params.tolist(), geometry.tolist(),
                           tolerance(sample).tolist(), mesh_key(sample)]}
    for name in ("x", "y"):
        v = getattr(sample, name, None)
        if v is not None:
            meta[f"{name}_channels"] = int(v.reshape(v.shape[0], -1).shape[1])
            meta[f"{name}_moments"] = _moments(v, sample.weight)
    return meta


# ------------------------------------------------------------------- the folder
class MeshCache:
    """A cache folder (see the module docstring); created when missing.

    Args:
        root: The folder. Several runs, and several data folders, may share one.

    Raises:
        CacheError: the folder holds a cache of another layout version, or its marker
            is not one (``meshops-cache.json`` unreadable), or the folder cannot be
            created.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        marker = self.root / MARKER
        want = {"format": FORMAT, "layout": LAYOUT}
        try:
            if not marker.is_file():
                if self.root.exists() and not self.root.is_dir():
                    raise CacheError(f"{self.root}: exists and is not a folder; choose "
                                     f"another cache folder")
                if self.root.is_dir() and any(p.name != MARKER for p in self.root.iterdir()
                                              if not p.name.startswith(".")):
                    raise CacheError(f"{self.root}: not a meshops cache folder (it holds other "
                                     f"files and no {MARKER}); choose an empty or new folder")
                atomic_write(marker, lambda tmp: Path(tmp).write_text(json.dumps(want)))
            found = json.loads(marker.read_text())
        except (OSError, ValueError) as e:
            if isinstance(e, CacheError):
                raise
            raise CacheError(f"{self.root}: cannot use this cache folder ({e})") from None
        if not isinstance(found, dict) or found.get("format") != FORMAT:
            raise CacheError(f"{marker}: not a meshops cache marker ({found!r})")
        if found.get("layout") != LAYOUT:
            raise CacheError(f"{self.root}: a meshops cache of layout {found.get('layout')!r}, "
                             f"written by another meshops version; this one reads layout "
                             f"{LAYOUT}: use another cache folder (or delete this one)")

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.entry"

    def has(self, kind: str, key: str) -> bool:
        return self.path(kind, key).is_file()

    def write(self, kind: str, key: str, sample, meta: dict, source: str) -> Path:
        """Write ``sample``'s attributes (tensors, strings, numbers, lists of strings)
        as entry ``key``, atomically."""
        from meshops.version import __version__

        index, values, data = _pack(sample, source)
        header = {"format": FORMAT, "cache_version": CACHE_VERSION, "meshops": __version__,
                  "kind": kind, "key": key, "source": source, "meta": meta,
                  "tensors": index, "values": values}
        return self._write(self.path(kind, key), entry_bytes(header, data),
                           f"the cache entry of {source}")

    def _write(self, path: Path, data: bytes, what: str) -> Path:
        """``data`` to ``path`` atomically; a failed write (a full disk, a file-size limit)
        is a :class:`CacheError` naming the cache, and leaves no part of the file."""
        try:
            return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
        except OSError as e:
            raise CacheError(f"{self.root}: cannot write {what} ({e.strerror or e}); nothing "
                             f"half-written is kept: free space there or choose another "
                             f"cache folder") from None

    def read(self, kind: str, key: str) -> dict:
        """Entry ``key``: ``{"attrs", "meta", "source"}``, after checking the whole file.

        Raises:
            CacheError: missing, truncated, damaged, or not the entry of this key,
                kind and version (the message says which).
        """
        path = self.path(kind, key)
        try:
            header, data = read_entry(path)
        except FileNotFoundError:
            raise CacheError(f"{path}: cache entry missing (removed while in use?)") from None
        except (EntryError, OSError) as e:
            raise CacheError(f"{path}: {e}") from None
        want = {"format": FORMAT, "cache_version": CACHE_VERSION, "kind": kind, "key": key}
        got = {k: header.get(k) for k in want}
        if got != want:
            wrong = ", ".join(f"{k} {got[k]!r} (expected {v!r})" for k, v in want.items()
                              if got[k] != v)
            raise CacheError(f"{path}: not the cache entry expected here: {wrong}")
        try:
            attrs = _unpack(header["tensors"], header["values"], data)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CacheError(f"{path}: inconsistent cache entry ({e})") from None
        return {"attrs": attrs, "meta": header.get("meta"), "source": header.get("source")}

    # -------------------------------------------------------------- manifests
    def _manifest_path(self, folder: Path, settings: dict, part: Optional[str] = None) -> Path:
        ident = _json_digest({"folder": str(folder.resolve()), "settings": settings})
        # a process of a data-parallel run keeps the memo of its own files
        return self.root / "manifests" / f"{ident[:32]}{'-' + part if part else ''}.json"

    def load_manifest(self, folder: Path, settings: dict, part: Optional[str] = None) -> dict:
        """The memo of a data folder under ``settings``: ``{file name: record}`` (empty
        when there is none or it cannot be read: the memo only saves work); ``part``:
        the memo of one process of a data-parallel run (:class:`Part`)."""
        path = self._manifest_path(folder, settings, part)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        ok = (isinstance(data, dict) and data.get("format") == FORMAT
              and data.get("cache_version") == CACHE_VERSION
              and isinstance(data.get("files"), dict))
        return data["files"] if ok else {}

    def save_manifest(self, folder: Path, settings: dict, files: dict,
                      part: Optional[str] = None) -> None:
        path = self._manifest_path(folder, settings, part)
        data = {"format": FORMAT, "cache_version": CACHE_VERSION,
                "folder": str(folder.resolve()), "settings": settings, "files": files}
        self._write(path, json.dumps(data).encode(), f"the memo of {folder}")

    # ---------------------------------------------------------------- building
    def dataset(self, files: Sequence[str | os.PathLike], read: Callable, settings: dict, *,
                transform: Optional[Callable] = None, workers: int = 0, progress: bool = True,
                desc: str = "caching", part: Optional["Part"] = None) -> "CachedMeshDataset":
        """A :class:`CachedMeshDataset` of ``files``, building the entries that are missing.

        Args:
            files: The mesh files, all in one folder (their manifest's).
            read: ``read(path) -> (sample, info)``: the training sample of one file (a
                :class:`~meshops.MeshData`) and a JSON-able dict recorded with it (e.g.
                field shapes); it raises on a bad file. Must be picklable when
                ``workers > 0`` (a module-level function or a small object).
            settings: JSON-able description of everything besides the file that
                ``read`` depends on (inputs, targets, dtype, ...): part of every key.
            transform: Optional mesh transform (``model.mesh_transform()``) whose
                structures are cached too (:meth:`CachedMeshDataset.with_structures`).
            workers: Processes that parse files (0: this one).
            progress: tqdm bars while files are hashed and entries built.
            part: In a data-parallel run, this process's share (:class:`Part`): it
                checks and builds only the files it owns, and the other processes'
                records of theirs are gathered; the data set reads only its own files.

        Raises:
            whatever ``read`` raises for a bad file (the entries built before it are
            kept: the next call continues from there), :class:`CacheError`.
        """
        files = [Path(f) for f in files]
        if not files:
            raise ValueError("MeshCache.dataset: no files")
        folder = files[0].parent
        owned = list(range(len(files))) if part is None else part.indices(len(files))
        tag = None if part is None else part.name
        memo = self.load_manifest(folder, settings, tag)
        # 1. The content digest of every file (from the memo where the file's status
        # is unchanged) and its sample entry.
        records, todo = self._check(files, owned, memo, settings, progress)
        manifest = dict(memo)
        manifest.update({files[i].name: rec for i, rec in records.items() if "meta" in rec})
        # 2. Parse what is missing, in worker processes; each entry is kept as soon as
        # it is written, and the manifest is saved every _SAVE_EVERY_S seconds.
        try:
            self._build(files, records, todo, read, workers, desc, progress,
                        lambda: self.save_manifest(folder, settings, manifest, tag), manifest)
        finally:
            if manifest != memo:
                self.save_manifest(folder, settings, manifest, tag)
        # 3. In a data-parallel run, the other processes' records of their files.
        if part is not None:
            records = part.merge(records)
        ds = CachedMeshDataset(self.root, [
            _Record(str(f), r["sha256"], r["key"], r["meta"], r.get("info", {}),
                    stat=(r["size"], r["mtime_ns"]))
            for f, r in ((f, records[i]) for i, f in enumerate(files))], read, settings,
            owned=None if part is None else owned)
        if transform is not None:
            ds = ds.with_structures(transform, workers=workers, progress=progress)
        return ds

    def _check(self, files: list[Path], owned: list[int], memo: dict, settings: dict,
               progress: bool) -> tuple[dict[int, dict], list[int]]:
        """Step 1 of :meth:`dataset`: the record of every owned file, and those whose
        entry must be built."""
        from meshops.utils.progress import progress as bar

        records: dict[int, dict] = {}
        todo: list[int] = []
        for i in bar(owned, desc="checking files", unit="file", leave=False,
                     enabled=progress):
            path = files[i]
            st = _stat_record(path)
            old = memo.get(path.name)
            if old and all(old.get(k) == v for k, v in st.items()):
                digest = old["sha256"]
            else:
                digest = file_digest(path)
            key = entry_key(SAMPLE, settings, digest)
            rec = {**st, "sha256": digest, "key": key}
            if old and old.get("key") == key and isinstance(old.get("meta"), dict) \
                    and self.has(SAMPLE, key):
                rec["meta"], rec["info"] = old["meta"], old.get("info", {})
            elif self.has(SAMPLE, key):
                try:  # built by another run or for another folder: its meta is in it
                    entry = self.read(SAMPLE, key)
                    rec["meta"], rec["info"] = entry["meta"]["meta"], entry["meta"]["info"]
                except (CacheError, KeyError, TypeError):
                    todo.append(i)  # damaged: rebuilt below
            else:
                todo.append(i)
            records[i] = rec
        return records, todo

    def _build(self, files, records: dict, todo: list[int], read, workers: int, desc: str,
               progress: bool, save: Callable[[], None], manifest: dict) -> None:
        """Step 2 of :meth:`dataset`: parse the files ``todo`` into entries."""
        from meshops.utils.progress import progress as bar

        if not todo:
            return
        saved = time.monotonic()
        jobs = _Jobs(self.root, read, [(str(files[i]), records[i]["key"],
                                        records[i]["sha256"]) for i in todo])
        # the loader first: zip then runs it to its end, which stops its workers
        for result, i in zip(bar(_run(jobs, workers), total=len(todo), desc=desc,
                                 unit="mesh", enabled=progress), todo):
            if isinstance(result, BaseException):
                raise result
            records[i]["meta"], records[i]["info"] = result
            manifest[files[i].name] = records[i]
            if time.monotonic() - saved > _SAVE_EVERY_S:
                save()
                saved = time.monotonic()


class Part:
    """A process's share of the files in a data-parallel run: file ``i`` of ``n`` is
    owned by ``owner(i, n)``; :meth:`merge` gathers every process's records of the
    files it owns (``gather(obj) -> [obj of rank 0, obj of rank 1, ...]``, e.g.
    :func:`meshops.training.distributed.all_gather_objects`).

    Args:
        rank, world: This process and the number of processes.
        owner: ``owner(i, n) -> rank`` (default ``i % world``).
        gather: The collective.
    """

    def __init__(self, rank: int, world: int, gather: Callable[[Any], list],
                 owner: Optional[Callable[[int, int], int]] = None) -> None:
        self.rank, self.world, self.gather = rank, world, gather
        self.owner = owner or (lambda i, n: i % world)

    @property
    def name(self) -> str:
        return f"part{self.rank}of{self.world}"

    def indices(self, n: int) -> list[int]:
        return [i for i in range(n) if self.owner(i, n) == self.rank]

    def merge(self, records: dict[int, dict]) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for part in self.gather(records):
            out.update(part)
        return out


class _Record:
    """One file of a :class:`CachedMeshDataset`: its path and content digest, the keys of
    its entries, what the cache recorded of it (``meta``) and of its reader (``info``)."""

    __slots__ = ("path", "sha256", "key", "meta", "info", "structured", "stat")

    def __init__(self, path: str, sha256: str, key: str, meta: dict, info: dict,
                 structured: Optional[str] = None, stat: Optional[tuple] = None) -> None:
        self.path, self.sha256, self.key = path, sha256, key
        self.meta, self.info, self.structured = meta, info, structured
        self.stat = stat  # (size, mtime_ns) when the digest was taken

    def with_structured(self, key: str) -> "_Record":
        return _Record(self.path, self.sha256, self.key, self.meta, self.info, key,
                       self.stat)

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state):
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)


# An entry (meshops.datasets.entry) holds a JSON header (versions, key, what the cache
# recorded, the non-tensor attributes and where each tensor lies) and the bytes of all
# tensors in one uint8 tensor, each tensor at an offset aligned for any dtype: one read,
# one CRC and no unpickling per sample, which lazy training pays for every sample of
# every epoch.
_ALIGN = 16


def _pack(sample, source: str) -> tuple[list, dict, Tensor]:
    index, values, chunks, offset = [], {}, [], 0
    for name, value in sample.items():
        if isinstance(value, Tensor):
            t = value.detach().cpu().contiguous()
            raw = (t.reshape(-1).view(torch.uint8) if t.numel()
                   else t.new_empty(0, dtype=torch.uint8))
            pad = -offset % _ALIGN                  # so that every view(dtype) is aligned
            if pad:
                chunks.append(torch.zeros(pad, dtype=torch.uint8))
                offset += pad
            index.append([name, str(t.dtype).replace("torch.", ""), list(t.shape), offset])
            chunks.append(raw)
            offset += raw.numel()
        elif isinstance(value, (str, int, float, bool)) or (
                isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            values[name] = list(value) if isinstance(value, tuple) else value
        else:
            raise TypeError(f"{source}: attribute {name!r} is a {type(value).__name__}; the "
                            f"cache stores tensors, strings, numbers and lists of strings")
    data = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)
    return index, values, data


def _unpack(index: list, values: dict, data: Tensor) -> dict:
    attrs = dict(values)
    for name, dtype, shape, offset in index:
        dt = getattr(torch, dtype)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}")
        n = math.prod(shape) * torch.empty((), dtype=dt).element_size()
        if offset < 0 or offset + n > data.numel():
            raise ValueError(f"tensor {name!r} lies outside the data")
        attrs[name] = data[offset:offset + n].view(dt).view(shape)
    return attrs


def _identity(item):
    return item


def _run(jobs, workers: int):
    """``jobs[i]`` for every ``i``, in order, computed in ``workers`` processes (0: here)."""
    if workers <= 0:
        return (jobs[i] for i in range(len(jobs)))
    from torch.utils.data import DataLoader

    # Its own generator: the workers' seed must not be drawn from the global one, which
    # then initialises the model (a lazy run must start from an in-memory run's weights).
    return iter(DataLoader(jobs, batch_size=None, num_workers=min(workers, len(jobs)),
                           collate_fn=_identity, generator=torch.Generator()))


class _Jobs(torch.utils.data.Dataset):
    """Build sample entries: job ``i`` parses ``files[i]``, writes its entry and gives
    back ``(meta, info)``, or the exception ``read`` raised (to be raised, whole, in the
    main process rather than wrapped by the DataLoader)."""

    def __init__(self, root: Path, read: Callable, items: list[tuple[str, str, str]]) -> None:
        self.root, self.read, self.items = root, read, items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, key, digest = self.items[i]
        try:
            return _build_sample(MeshCache(self.root), self.read, path, key, digest)
        except Exception as e:  # noqa: BLE001 - handed to the main process as it is
            return e


def _build_sample(cache: MeshCache, read: Callable, path: str, key: str, digest: str
                  ) -> tuple[dict, dict]:
    sample, info = read(path)
    # The entry must hold what the key says: a file rewritten while it was parsed is
    # refused (the next run sees its new content and builds that).
    if file_digest(path) != digest:
        raise CacheError(f"{path}: the file changed while it was being read into the cache; "
                         f"run again")
    meta = sample_meta(sample)
    cache.write(SAMPLE, key, sample, {"meta": meta, "info": dict(info)}, path)
    return meta, dict(info)


def _describe(transform) -> dict:
    """The settings a mesh transform's structures depend on (its class and description,
    e.g. PiT's latent size, quantiles, ball and dtype)."""
    cls = type(transform)
    return {"transform": f"{cls.__module__}.{cls.__qualname__}", "settings": repr(transform)}


# ------------------------------------------------------------------- the data set
class CachedMeshDataset(torch.utils.data.Dataset):
    """The samples of a :class:`MeshCache`, read one at a time from their entries.

    Item ``i`` is a :class:`~meshops.MeshData` with the attributes the cache's reader
    gave it (and, after :meth:`with_structures`, the model's mesh structures), read from
    disk on every access: only the list of files and a few numbers per file are held.
    Made by :meth:`MeshCache.dataset`; picklable, so that DataLoader worker processes
    read in parallel.

    An entry that fails its checks (damaged, removed, foreign) is rebuilt from its file
    when the file's content is still the one recorded when the data set was made;
    otherwise :class:`CacheError` names the file.

    In a data-parallel run (``owned``: the samples of this process, see :class:`Part`)
    only the owned samples are read; reading another one raises :class:`CacheError`.

    Shapes:
        item: ``pos [N, d]``, ``weight [N]``, ``x [N, C_in]``, ``y [N, C_out]``, ...
    """

    def __init__(self, root: str | os.PathLike, records: list[_Record], read: Callable,
                 settings: dict, transform: Optional[Callable] = None,
                 owned: Optional[Iterable[int]] = None) -> None:
        self.root = Path(root)
        self.records, self.read, self.settings = list(records), read, settings
        self.transform = transform
        self.owned = None if owned is None else frozenset(int(i) for i in owned)
        self._cache: Optional[MeshCache] = None

    @property
    def cache(self) -> MeshCache:
        if self._cache is None:
            self._cache = MeshCache(self.root)
        return self._cache

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = None
        return state

    def __len__(self) -> int:
        return len(self.records)

    @property
    def files(self) -> list[Path]:
        return [Path(r.path) for r in self.records]

    def subset(self, indices: Sequence[int]) -> "CachedMeshDataset":
        """The samples ``indices`` (e.g. a training split), as a data set of the same cache."""
        owned = None if self.owned is None else \
            [j for j, i in enumerate(indices) if i in self.owned]
        return CachedMeshDataset(self.root, [self.records[i] for i in indices], self.read,
                                 self.settings, self.transform, owned)

    def own(self) -> "CachedMeshDataset":
        """The samples this process reads (all of them outside a data-parallel run)."""
        if self.owned is None:
            return self
        return CachedMeshDataset(self.root, [self.records[i] for i in sorted(self.owned)],
                                 self.read, self.settings, self.transform)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} samples")
        rec = self.records[i % len(self)]
        if self.owned is not None and i % len(self) not in self.owned:
            raise CacheError(f"{rec.path}: sample {i % len(self)} belongs to another process "
                             f"of this data-parallel run; this one reads only its own part")
        if rec.structured is not None:
            attrs = self._entry(STRUCTURED, rec.structured, rec)
        else:
            attrs = self._entry(SAMPLE, rec.key, rec)
        return MeshData(**attrs)

    def _entry(self, kind: str, key: str, rec: _Record) -> dict:
        try:
            return self.cache.read(kind, key)["attrs"]
        except CacheError as e:
            reason = str(e)
        # Rebuild it from the file (and, for a structured entry, from the sample).
        if kind == SAMPLE:
            try:
                digest = file_digest(rec.path)
            except OSError as e:
                raise CacheError(f"{rec.path}: cannot rebuild a bad cache entry ({reason}): "
                                 f"the file is not readable ({e.strerror})") from None
            if digest != rec.sha256:
                raise CacheError(f"{rec.path}: changed since this run checked the cache, and "
                                 f"its cache entry cannot be used ({reason}); run again (the "
                                 f"cache rebuilds the entry of the new content)")
            _build_sample(self.cache, self.read, rec.path, key, digest)
        else:
            _build_structured(self.cache, self.transform, rec.key, key, rec,
                              lambda: self._entry(SAMPLE, rec.key, rec))
        return self.cache.read(kind, key)["attrs"]

    # ---------------------------------------------------------------- structures
    def with_structures(self, transform: Optional[Callable], workers: int = 0,
                        progress: bool = True) -> "CachedMeshDataset":
        """The same samples with ``transform``'s mesh structures (``model.mesh_transform()``,
        see :mod:`meshops.models.structures`) stored in structured entries, building
        those that are missing; ``transform=None`` gives the bare samples."""
        from meshops.utils.progress import progress as bar

        if transform is None:
            return CachedMeshDataset(self.root, [r.with_structured(None) for r in self.records],
                                     self.read, self.settings, owned=self.owned)
        settings = {"sample": self.settings, "structures": _describe(transform)}
        keys = [entry_key(STRUCTURED, settings, r.key) for r in self.records]
        records = [r.with_structured(k) for r, k in zip(self.records, keys)]
        todo = [i for i, k in enumerate(keys) if not self.cache.has(STRUCTURED, k)
                and (self.owned is None or i in self.owned)]
        # Samples of one mesh (equal pos digests) have equal structures only when the
        # weights agree too; each is built from its own entry, in worker processes.
        if todo:
            jobs = _StructureJobs(self.root, transform, [records[i] for i in todo], self.read)
            for result in bar(_run(jobs, workers), total=len(todo), desc="mesh structures",
                              unit="mesh", enabled=progress):
                if isinstance(result, BaseException):
                    raise result
        return CachedMeshDataset(self.root, records, self.read, self.settings, transform,
                                 self.owned)

    # ------------------------------------------------------- what the run needs
    def fingerprints(self) -> dict[str, list]:
        """``{file name: [size, mtime_ns, sha256]}`` as the cache took them (the
        provenance record of :func:`meshops.runs.run_folder.fingerprint`, without
        reading the files again)."""
        return {Path(r.path).name: [int(r.stat[0]), int(r.stat[1]), r.sha256]
                for r in self.records if r.stat is not None}

    def descriptors(self) -> list:
        """``(parameters, geometry, tolerance, mesh key)`` of every sample
        (:func:`meshops.datasets.descriptors.describe`,
        :func:`~meshops.datasets.descriptors.tolerance`,
        :func:`~meshops.datasets.descriptors.mesh_key`), from what the cache recorded
        (a sample of an older entry that did not record them all is read)."""
        import numpy as np

        from meshops.datasets.descriptors import describe, mesh_key, tolerance

        out = []
        for i, r in enumerate(self.records):
            d = r.meta.get("descriptor")
            if d is not None and len(d) == 4:
                out.append((*(np.asarray(v, np.float64) for v in d[:3]), d[3]))
            else:
                sample = self[i]
                out.append((*describe(sample), tolerance(sample), mesh_key(sample)))
        return out

    def facts(self) -> dict:
        """:func:`meshops.fitting.defaults.data_facts` of the samples, from what the cache
        recorded (no sample is read)."""
        from meshops.reduced import (
            constant_channels,
            global_channels,
            input_ranges,
            proportional_channel,
        )

        metas = [r.meta for r in self.records]
        n = len(metas)
        # entries written before the ranges were recorded: read those samples once
        ranges = [m["x_ranges"] if "x_ranges" in m else input_ranges(self[i])
                  for i, m in enumerate(metas)]
        channels, glob = constant_channels(ranges), global_channels(ranges)
        constant = channels is not None and all(channels)
        return {"n": n, "points": round(sum(m["points"] for m in metas) / max(n, 1)),
                "one_mesh": len({m["pos_digest"] for m in metas}) == 1,
                "constant": constant, "global_channels": glob,
                "proportional": None if constant or not metas
                else proportional_channel(*_means_and_sizes(metas), glob), "has_x": True,
                "channels": int(metas[0].get("y_channels") or 1) if metas else 1}

    def normalizers(self, scale_by: int | None = None
                    ) -> tuple[Optional[UnitGaussianNormalizer], UnitGaussianNormalizer]:
        """``(input, output)`` normalisers of the samples, as
        :func:`meshops.training.dataset.fit_normalizers` fits them (quadrature-weighted
        per-channel mean and standard deviation; the input one ``None`` without input
        channels; the output one per unit of input channel ``scale_by``, constant over
        each mesh, when given), merged from the moments recorded per sample (no sample
        is read; equal to the two-pass fit up to rounding)."""
        out = []
        for name in ("x", "y"):
            channels = {r.meta.get(f"{name}_channels") for r in self.records}
            if len(channels) != 1 or None in channels:
                raise ValueError(f"the cached samples disagree on the channels of {name} "
                                 f"({sorted(map(str, channels))})")
            (c,) = channels
            if name == "x" and c == 0:
                out.append(None)
                continue
            parts = [r.meta[f"{name}_moments"] for r in self.records]
            if name == "y" and scale_by is not None:  # each sample's targets per unit
                loads = [r.meta["x_moments"][1][scale_by] for r in self.records]
                parts = [[w, [v / c for v in mu], [q / (c * c) for q in m2]]
                         for (w, mu, m2), c in zip(parts, loads)]
            total, mean, m2 = _merge(parts)
            if total <= 0:
                raise ValueError(f"cannot fit a normaliser on {name!r}: no samples or zero "
                                 f"weights")
            norm = UnitGaussianNormalizer(c)
            if name == "y" and scale_by is not None:
                norm.set_scale_by(scale_by)
            norm.mean.copy_(mean)
            norm.std.copy_((m2 / total).sqrt().clamp_min(norm.eps))
            norm.fitted.fill_(True)
            out.append(norm)
        return out[0], out[1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} samples in {self.root})"


class _StructureJobs(torch.utils.data.Dataset):
    def __init__(self, root: Path, transform: Callable, records: list[_Record], read) -> None:
        self.root, self.transform, self.records, self.read = root, transform, records, read

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        rec = self.records[i]
        ds = CachedMeshDataset(self.root, [rec], self.read, {})
        try:
            _build_structured(ds.cache, self.transform, rec.key, rec.structured, rec,
                              lambda: ds._entry(SAMPLE, rec.key, rec))
        except Exception as e:  # noqa: BLE001 - raised whole in the main process
            return e
        return None


def _build_structured(cache: MeshCache, transform: Callable, sample_key: str, key: str,
                      rec: _Record, sample_attrs: Callable[[], dict]) -> None:
    if transform is None:
        raise CacheError(f"{rec.path}: its structured cache entry is bad and this data set "
                         f"has no mesh transform to rebuild it")
    sample = transform(MeshData(**sample_attrs()))
    cache.write(STRUCTURED, key, sample, {"sample": sample_key}, rec.path)
