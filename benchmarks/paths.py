"""Paths as the stored results write them: never the absolute path of the machine that ran.

A stored result (``benchmarks/results/``) is read on other machines and shown verbatim by
the docs, so the folders of the machine that wrote it (a home folder, a scratch folder, a
temporary run folder, a Python environment) tell a reader nothing and leak its layout.
Every writer passes what it stores (command lines, data roots, run folders, the output
of the commands it ran, tracebacks) through :func:`portable`, which rewrites each
absolute path by the first of these rules that applies:

1. under a folder the writer names in ``roots`` (``{"$WORK": work, "$DATA_ROOT": data}``;
   the longest first): ``$WORK/hole/run``;
2. under a ``site-packages`` or ``dist-packages`` folder: ``<site-packages>/torch/...``;
3. in the standard library (``.../lib/python3.12/...``): ``<stdlib>/importlib/...``;
4. under the repository: relative to it (``meshops/nn/pit.py``; the root itself ``.``);
5. a Python interpreter (``.../bin/python3``) elsewhere: ``<env>/bin/python3``;
6. under the home folder: ``~/.cache/meshops``;
7. under the temporary folder: ``$TMPDIR/meshops-fem-1a2b/run``;
8. anywhere else: its last name only, ``<elsewhere>/old``.

A path is a ``/`` followed by at least two names (``/a/b``), not part of a longer word,
URL or relative path; :data:`ABSOLUTE` finds them, and the tests and the docs build use it
to check that no stored result and no page shows one.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

#: The repository root, written as the folder the stored paths are relative to.
REPO = Path(__file__).resolve().parents[1]

#: An absolute POSIX path of at least two names, not inside a word, URL or relative path.
ABSOLUTE = re.compile(r"(?<![\w.+@%~$>/\\)\]}-])/[\w.+@%~-]+(?:/[\w.+@%~-]+)+/?")

_SITE = re.compile(r"^.*?/(?:site|dist)-packages(?=/|$)")
_STDLIB = re.compile(r"^.*?/lib/python\d+(?:\.\d+)?(?=/|$)")
_PYTHON = re.compile(r"^.*/bin/(python[\d.]*)$")


def _folders(path: str | os.PathLike) -> list[str]:
    """The spellings of a folder a text may hold: as given (absolute) and resolved."""
    given = os.path.abspath(os.fspath(path))
    return list(dict.fromkeys([given, os.path.realpath(given)]))


def _under(path: str, folder: str) -> Optional[str]:
    """``path`` below ``folder`` ("" for the folder itself), or None when it is not."""
    if path == folder:
        return ""
    return path[len(folder) + 1:] if path.startswith(folder.rstrip("/") + "/") else None


def _join(marker: str, rest: str) -> str:
    if not marker:
        return rest or "."
    return f"{marker}/{rest}" if rest else marker


def _named(path: str, roots: Mapping[str, str | os.PathLike], repo: str | os.PathLike
           ) -> Optional[str]:
    """Rules 1 to 4 (in that order): a named root, site-packages, stdlib, the repository."""
    pairs = sorted(((f, m) for m, root in roots.items() for f in _folders(root)),
                   key=lambda p: -len(p[0]))
    for folder, marker in pairs:
        rest = _under(path, folder)
        if rest is not None:
            return _join(marker, rest)
    for pattern, marker in ((_SITE, "<site-packages>"), (_STDLIB, "<stdlib>")):
        if pattern.match(path):
            return pattern.sub(marker, path, count=1)
    for folder in _folders(repo):
        rest = _under(path, folder)
        if rest is not None:
            return _join("", rest)
    return None


def portable_path(path: str | os.PathLike, roots: Optional[Mapping[str, Any]] = None,
                  *, repo: str | os.PathLike = REPO) -> str:
    """One absolute path as a stored result writes it (the rules of this module's
    docstring); ``roots`` maps a marker such as ``"$WORK"`` to a folder."""
    path = os.fspath(path)
    if not os.path.isabs(path):
        return path
    slash = "/" if path.endswith("/") and path != "/" else ""
    path = path.rstrip("/") or "/"
    named = _named(path, roots or {}, repo)
    if named is not None:
        return named + slash
    python = _PYTHON.match(path)
    if python:
        return f"<env>/bin/{python.group(1)}"
    for folder, marker in ((Path.home(), "~"), (tempfile.gettempdir(), "$TMPDIR")):
        for spelling in _folders(folder):
            rest = _under(path, spelling)
            if rest is not None:
                return _join(marker, rest) + slash
    return "<elsewhere>/" + os.path.basename(path) + slash


def portable(value: Any, roots: Optional[Mapping[str, Any]] = None, *,
             repo: str | os.PathLike = REPO) -> Any:
    """``value`` with every absolute path in it rewritten by :func:`portable_path`.

    A string (a command line, a log, a traceback) has each path found by
    :data:`ABSOLUTE` rewritten in place; a path object becomes its portable string;
    dicts, lists and tuples are rewritten value by value (a result document before it is
    written); anything else is returned as it is.
    """
    if isinstance(value, os.PathLike):
        return portable_path(value, roots, repo=repo)
    if isinstance(value, str):
        def one(m: re.Match) -> str:
            text = m.group(0)
            # a sentence's full stop after a path is not part of it
            core = text.rstrip(".") or text
            return portable_path(core, roots, repo=repo) + text[len(core):]
        return ABSOLUTE.sub(one, value)
    if isinstance(value, dict):
        return {k: portable(v, roots, repo=repo) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(portable(v, roots, repo=repo) for v in value)
    return value


def command(module: str, argv: Optional[list[str]] = None,
            roots: Optional[Mapping[str, Any]] = None) -> str:
    """``python -m MODULE ARGS``, the command line a stored result starts with: the
    arguments (``sys.argv[1:]`` when ``argv`` is None) quoted for a shell, every path in
    them written by :func:`portable`."""
    args = sys.argv[1:] if argv is None else argv
    return portable(f"python -m {module} {shlex.join(args)}".rstrip(), roots)


def absolute_paths(text: str) -> list[str]:
    """The absolute paths in ``text`` (what :func:`portable` rewrites)."""
    return [m.group(0) for m in ABSOLUTE.finditer(text)]
