"""Memory-mapped ``.npy`` arrays with layout checks and error messages that say what
is wrong (file, expected shape, got shape; the first non-finite value and where it is).

Private helpers shared by the Geo-FNO readers (:mod:`data_adapters.elasticity`,
:mod:`data_adapters.naca`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from meshops.errors import MeshError

# Bytes of one array read at a time by the finiteness scan.
_SCAN_BYTES = 64 * 2**20


def open_npy(path: Path) -> np.ndarray:
    """Memory-map a floating-point ``.npy`` file (read-only).

    Raises:
        MeshError: missing file, not a ``.npy`` file (e.g. an ``.npz`` archive or a
            truncated file), object/pickled or structured arrays, or a dtype that is
            not floating point.
    """
    path = Path(path)
    if not path.is_file():
        raise MeshError(f"{path}: no such file")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        if "object" in str(e).lower() or "pickle" in str(e).lower():
            raise MeshError(f"{path}: contains a Python-object (pickled) array; expected a "
                            "plain floating-point .npy array") from e
        raise MeshError(f"{path}: not a readable .npy file ({e})") from e
    except Exception as e:  # truncated or foreign files raise assorted errors
        raise MeshError(f"{path}: not a readable .npy file ({type(e).__name__}: {e})") from e
    if not isinstance(arr, np.ndarray):
        if hasattr(arr, "close"):
            arr.close()
        raise MeshError(f"{path}: is an .npz archive; expected a single-array .npy file")
    if arr.dtype.kind != "f":
        raise MeshError(f"{path}: has dtype {arr.dtype}; expected a floating-point array "
                        "(float32 or float64)")
    return arr


def check_shape(path: Path, arr: np.ndarray, expected: Sequence[int | None], axes: str,
                hint: str = "") -> None:
    """Raise unless ``arr.shape`` matches ``expected`` (``None`` = any size).

    Args:
        path: File name for the message.
        arr: The array.
        expected: Expected sizes, ``None`` for a free axis.
        axes: Names of the axes for the message, e.g. ``"(points, xy, samples)"``.
        hint: Extra sentence appended to the message.
    """
    ok = arr.ndim == len(expected) and all(e is None or e == s
                                           for e, s in zip(expected, arr.shape))
    if not ok:
        want = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
        raise MeshError(f"{Path(path).name}: expected shape {want} {axes}, got "
                        f"{tuple(arr.shape)}" + (f"; {hint}" if hint else "") + f" [{path}]")


def _value_name(v: float) -> str:
    return "NaN" if np.isnan(v) else ("+inf" if v > 0 else "-inf")


def find_nonfinite(arr: np.ndarray, sample_axis: int, start: int, stop: int):
    """First non-finite value among samples ``start:stop`` (along ``sample_axis``).

    Reads the memory map in blocks of about 64 MB, so memory stays bounded.

    Returns:
        ``None`` or ``(sample, position, value, count)``: the sample index, the index
        tuple inside that sample (the array with ``sample_axis`` removed), the value
        and the number of non-finite values in that block.
    """
    per_sample = max(1, arr.size // max(arr.shape[sample_axis], 1)) * arr.itemsize
    step = max(1, _SCAN_BYTES // per_sample)
    for a in range(start, stop, step):
        b = min(stop, a + step)
        sl = [slice(None)] * arr.ndim
        sl[sample_axis] = slice(a, b)
        block = np.moveaxis(np.asarray(arr[tuple(sl)]), sample_axis, 0)
        bad = ~np.isfinite(block)
        if bad.any():
            first = np.argwhere(bad)[0]
            k = int(first[0])
            pos = tuple(int(i) for i in first[1:])
            return a + k, pos, float(block[(k,) + pos]), int(bad.sum())
    return None


def check_finite(path: Path, arr: np.ndarray, sample_axis: int, start: int, stop: int,
                 where: Callable[[tuple[int, ...]], str]) -> None:
    """Raise :class:`MeshError` naming the first sample with a NaN/inf value.

    Args:
        path: File name for the message.
        arr: The (memory-mapped) array.
        sample_axis: Axis that indexes samples.
        start, stop: Sample range to scan.
        where: Formats the position inside one sample, e.g. ``(3,) -> "point 3"``.
    """
    hit = find_nonfinite(arr, sample_axis, start, stop)
    if hit is not None:
        s, pos, v, count = hit
        raise MeshError(f"{Path(path).name}: sample {s} has {_value_name(v)} at {where(pos)} "
                        f"({count} non-finite values in the block of samples scanned) [{path}]")
