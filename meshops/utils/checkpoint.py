"""Reading checkpoints that can be trusted: a complete, undamaged archive, a pickle of
plain tensors and data, weights that fit the model and are finite.

``torch.load`` checks none of the first: the zip archive of a ``.pt`` file records
a CRC-32 of every member, but torch reads the tensor bytes without comparing them,
so a few flipped bytes in a weight load silently (and predict values of order 1e26).
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from meshops.errors import CheckpointError

# Keys of every meshops model checkpoint, with their types (see
# NeuralOperator.checkpoint_state).
MODEL_KEYS = {"format": str, "version": str, "model": str, "config": dict,
              "normalizers": dict, "metadata": dict, "state_dict": dict}


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (torch's run to paragraphs)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def verify_archive(path: Path) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is a complete zip archive whose
    every member matches its recorded CRC-32.

    Every checkpoint torch writes is such an archive (members stored
    uncompressed), so this reads the file once more at disk speed.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every member and compares its CRC
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError,
            NotImplementedError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a complete checkpoint archive ({first_line(e)}); "
                              f"the file is truncated, damaged or was not written by "
                              f"torch.save") from None
    if bad is not None:
        # Members are "<archive name>/data/<storage key>" (tensor bytes) or
        # "<archive name>/data.pkl" (the structure).
        member = bad.split("/", 1)[-1]
        what = ("the bytes of a tensor" if member.startswith("data/")
                else "the checkpoint's structure")
        raise CheckpointError(f"{path}: damaged: archive member {member!r} ({what}) fails its "
                              f"CRC check; the file changed after it was written")


def _unpickling_reason(e: BaseException) -> str:
    # torch's weights_only error is several paragraphs; the line naming the
    # offending global is the useful one.
    text = str(e)
    m = re.search(r"[^\n]*GLOBAL[^\n]*", text)
    return m.group(0).strip() if m else first_line(e)


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict:
    """The dict saved in ``path``, after checking the archive (:func:`verify_archive`)
    and unpickling with ``weights_only=True`` (tensors and plain data only: a pickle
    that would import or call anything else is refused, never run).

    Raises:
        FileNotFoundError: No such file.
        CheckpointError: Anything else that makes the file unreadable.
    """
    path = Path(path)
    if not path.is_file():
        if path.exists():
            raise CheckpointError(f"{path}: not a file")
        raise FileNotFoundError(f"{path}: no such checkpoint")
    verify_archive(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: refused: the pickle is not plain tensors and data "
                              f"({_unpickling_reason(e)})") from None
    except Exception as e:  # torch raises RuntimeError, OSError, ... on malformed archives
        raise CheckpointError(f"{path}: cannot read the checkpoint ({first_line(e)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a meshops checkpoint (it holds a "
                              f"{type(state).__name__}, not a dict)")
    return state


def check_model_keys(state: dict, path: Path, fmt: str) -> None:
    """The keys and types of a model checkpoint (``format`` must be ``fmt``)."""
    if state.get("format") != fmt:
        raise CheckpointError(f"{path}: not a meshops checkpoint (format "
                              f"{state.get('format')!r}, expected {fmt!r})")
    for key, kind in MODEL_KEYS.items():
        if key not in state:
            if key in ("normalizers", "metadata"):
                continue  # optional
            raise CheckpointError(f"{path}: incomplete checkpoint: no {key!r}")
        if not isinstance(state[key], kind):
            raise CheckpointError(f"{path}: {key!r} is a {type(state[key]).__name__}, "
                                  f"expected a {kind.__name__}")
    for name, value in state["state_dict"].items():
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{path}: state_dict entry {name!r} is a "
                                  f"{type(value).__name__}, not a tensor")
    for role, channels in state.get("normalizers", {}).items():
        if role not in ("input", "output") or isinstance(channels, bool) \
                or not isinstance(channels, int) or channels < 0:
            raise CheckpointError(f"{path}: normalizers: {role!r} -> {channels!r}; expected "
                                  f"'input'/'output' -> a channel count")


def _tensors(obj: Any, prefix: str) -> Iterator[tuple[str, Tensor]]:
    if isinstance(obj, Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}" if prefix else str(i))


def check_finite(obj: Any, path: Path, prefix: str = "") -> None:
    """Every floating-point tensor in ``obj`` (nested dicts/lists) is finite; the error
    names the first that is not (``prefix`` + its key path)."""
    for name, t in _tensors(obj, prefix):
        if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
            continue
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0])
            raise CheckpointError(
                f"{path}: {name} has {int(bad.sum())} non-finite value(s) (first at index "
                f"{list(idx)}: {t[idx].item()}); a model with such weights predicts nonsense")


def check_normalizer_scales(state_dict: dict, path: Path) -> None:
    """Normaliser standard deviations are positive (a zero divides the inputs by 0)."""
    for name, t in state_dict.items():
        if name.endswith("_normalizer.std") and t.numel() and not bool((t > 0).all()):
            raise CheckpointError(f"{path}: {name} has non-positive entries "
                                  f"({t.flatten()[:4].tolist()}...); a normaliser's scale is > 0")


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def _listing(names: list[str], limit: int = 4) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check_weights_fit(model: nn.Module, state_dict: dict, path: Path, what: str) -> None:
    """The saved weights have exactly the names and shapes of ``model``'s (built from
    the checkpoint's config, described by ``what``): one line naming what differs,
    instead of ``load_state_dict``'s multi-line report."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    extra = [k for k in state_dict if k not in expected]
    wrong = [f"{k} is {_shape(state_dict[k])} in the file but {_shape(v)} for the config"
             for k, v in expected.items() if k in state_dict and state_dict[k].shape != v.shape]
    if not (missing or extra or wrong):
        return
    parts = []
    if wrong:
        parts.append(_listing(wrong, 2))
    if missing:
        parts.append(f"missing {_listing(missing)}")
    if extra:
        parts.append(f"unexpected {_listing(extra)}")
    raise CheckpointError(f"{path}: the weights do not fit {what}: " + "; ".join(parts))


def int_field(value: Any, path: Path, name: str, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum`` (bools and floats refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"{path}: {name} is {value!r}; expected an integer >= {minimum}")
    return value
