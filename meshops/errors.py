"""Exceptions raised by meshops."""


class MeshError(ValueError):
    """Invalid or unsupported mesh input.

    The message always names the source (file or array) and the problem, e.g. the
    first offending cell, so that the user can find it in their data.
    """
