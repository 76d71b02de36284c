"""Exceptions raised by meshops."""


class MeshError(ValueError):
    """Invalid or unsupported mesh input.

    The message always names the source (file or array) and the problem, e.g. the
    first offending cell, so that the user can find it in their data.
    """


class CheckpointError(ValueError):
    """A checkpoint that must not be loaded: truncated or damaged (an archive member
    fails its CRC check), a pickle that is not plain tensors and data, non-finite
    weights, or metadata and weights that do not fit together.

    The message names the file and the problem (the damaged member, the parameter,
    the mismatching key).
    """


class UsageError(ValueError):
    """A request that cannot be honoured: a missing or contradictory option, a run folder
    that would lose files, data that does not fit the run. :mod:`meshops.cli` prints it
    as ``meshops: error: ...`` and exits with status 2; in Python it is raised as is.

    The message names the option, file or field and says what to do instead.
    """


def os_reason(e: OSError) -> str:
    """``strerror: filename`` of an OSError (its str() repeats the errno)."""
    reason = e.strerror or str(e)
    return f"{reason}: {e.filename}" if e.filename is not None else reason
