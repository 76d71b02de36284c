"""Small helpers the parts of the job share: field-name lists, progress bars, the device
check, the torchrun rank, the notes of the log."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from meshops.errors import UsageError

#: ``extra`` of a log record that is a note: information the user may want to act on,
#: which the command prints on standard error as ``meshops: note: ...`` (progress goes
#: to standard output, warnings are records of level WARNING).
NOTE = {"note": True}


def names(value, key: str) -> list[str]:
    """A list of field names from ``"a,b"``, ``""`` or a list; ``key`` names the
    option (and its source) in the error."""
    if value is None:
        return []
    if isinstance(value, str):
        out = [s.strip() for s in value.split(",")]
        out = [s for s in out if s]
    elif isinstance(value, (list, tuple)):
        out = []
        for v in value:
            if not isinstance(v, str) or not v.strip():
                raise UsageError(f"{key}: field names must be non-empty strings, got {v!r}")
            out.append(v.strip())
    else:
        raise UsageError(f"{key}: expected a comma-separated string or a list of field "
                       f"names, got {value!r}")
    dup = sorted({n for n in out if out.count(n) > 1})
    if dup:
        raise UsageError(f"{key}: field(s) {dup} given more than once")
    return out


def optional_names(value) -> list[str] | None:
    """``--inputs`` / ``--targets`` of predict and evaluate: ``None`` when absent."""
    return None if value is None else names(value, "--inputs/--targets")


def progress(iterable, **kw):
    """A tqdm bar on stderr, shown only on a terminal (no bar spam in logs)."""
    from meshops.utils.progress import progress as bar

    return bar(iterable, **kw)


def device_or_error(device: str | None, what: str = "--device") -> str | None:
    """``device`` if this machine has it, else :class:`UsageError` saying which it has."""
    if device is None:
        return None
    from meshops.training.distributed import check_device

    try:
        check_device(device)
    except ValueError as e:
        raise UsageError(f"{what}: {e}") from None
    return device


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def os_reason(e: OSError) -> str:
    """``strerror: filename`` of an OSError (its str() repeats the errno)."""
    reason = e.strerror or str(e)
    return f"{reason}: {e.filename}" if e.filename is not None else reason


def is_main_rank() -> bool:
    from meshops.training.distributed import torchrun_env

    env = torchrun_env()
    return env is None or env[1] == 0


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
