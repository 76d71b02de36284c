"""On-disk cache of generated stand-in data sets (one file per generator version,
parameters, seed and sample count), written atomically and byte-reproducibly.

Location: the ``cache_dir`` argument, else ``$MESHOPS_CACHE/standins``, else
``~/.cache/meshops/standins``. ``cache_dir=False`` disables the cache.

Format: an ``.npz``-compatible zip (read with :func:`numpy.load`) whose members are
written in sorted order with a fixed timestamp, so the same arrays give the same
bytes; a ``meta`` member holds the JSON description (generator, version,
parameters, seed) that is checked on load.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from meshops.utils.atomic import atomic_write

ENV_VAR = "MESHOPS_CACHE"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def cache_root(cache_dir=None) -> Path | None:
    """Resolve the stand-in cache folder (``None`` when caching is off)."""
    if cache_dir is False:
        return None
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser() / "standins"
    return Path.home() / ".cache" / "meshops" / "standins"


def describe(kind: str, version: int, params: Mapping, seed: int, num_samples: int) -> dict:
    """The JSON-able description a cache file is keyed on."""
    return {"generator": kind, "version": int(version), "seed": int(seed),
            "num_samples": int(num_samples), "params": json.loads(json.dumps(params))}


def cache_path(root: Path, meta: dict) -> Path:
    """``<root>/<kind>-v<version>-n<num>-seed<seed>-<hash of params>.npz``."""
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    return root / (f"{meta['generator']}-v{meta['version']}-n{meta['num_samples']}-"
                   f"seed{meta['seed']}-{digest}.npz")


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray], meta: dict) -> None:
    """Write ``arrays`` (plus ``meta``) to ``path`` atomically (temp file + rename)."""
    members = dict(arrays)
    members["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)

    def write(tmp: str) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for name in sorted(members):
                buf = io.BytesIO()
                np.lib.format.write_array(buf, np.ascontiguousarray(members[name]),
                                          allow_pickle=False)
                info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                z.writestr(info, buf.getvalue())

    atomic_write(path, write)


def load_arrays(path: Path, meta: dict) -> dict[str, np.ndarray] | None:
    """Arrays of a cache file, or ``None`` if it is missing, unreadable or for other
    parameters."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        stored = json.loads(arrays.pop("meta").tobytes().decode())
    except Exception:
        return None
    return arrays if stored == json.loads(json.dumps(meta, sort_keys=True)) else None


def generate_or_load(meta: dict, generate: Callable[[], dict[str, np.ndarray]], cache_dir,
                     progress: bool, label: str) -> tuple[dict[str, np.ndarray], Path | None]:
    """Load the cached arrays for ``meta`` or generate (and cache) them.

    Messages (on stderr, when ``progress``) say that the data are stand-ins.
    """
    root = cache_root(cache_dir)
    path = None if root is None else cache_path(root, meta)
    if path is not None:
        arrays = load_arrays(path, meta)
        if arrays is not None:
            if progress:
                print(f"meshops: loaded {meta['num_samples']} {label} STAND-IN samples "
                      f"(synthetic, not the benchmark) from {path}", file=sys.stderr)
            return arrays, path
    arrays = generate()
    if path is not None:
        save_arrays(path, arrays, meta)
    if progress:
        where = f"; cached at {path}" if path is not None else ""
        print(f"meshops: generated {meta['num_samples']} {label} STAND-IN samples "
              f"(synthetic, not the benchmark){where}", file=sys.stderr)
    return arrays, path
