"""What the subcommands' parsers share: the help formatter and wrapped descriptions."""

from __future__ import annotations

import argparse

# Subcommand help: the epilog of examples keeps its layout.
RAW = argparse.RawDescriptionHelpFormatter


def wrap(text: str) -> str:
    """A description paragraph wrapped for the raw formatter (which keeps the epilog's
    layout but would not wrap the description)."""
    import textwrap

    return textwrap.fill(" ".join(text.split()), 79)
