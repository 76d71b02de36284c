"""Small helpers the parts of the job share: field-name lists, progress bars, the device
check, the torchrun rank."""

from __future__ import annotations

from meshops.errors import UsageError


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
