"""The docs build warns (and so fails under ``-W``) on a page that shows an absolute path.

A page shows the stored benchmark outputs verbatim (``_generated/tables/``), and those
once held the folders of the machines that wrote them (issue 39); a path of the machine
that ran a benchmark, or built the docs, tells a reader nothing. Every text a page
renders (prose, code blocks, included files, executed cells' outputs, docstrings) is
searched with :data:`benchmarks.paths.ABSOLUTE`, the pattern the stored-results test
uses, once the page is resolved; each path found is a warning naming the page, the
line and the path. Two kinds of path are not a machine's, and pass:

* the example folders the guides write on purpose for a reader's own machine, listed in
  ``conf.py`` as ``machine_paths_examples`` (prefixes such as ``/scratch/``);
* in an executed cell's output, the temporary folder the page ran in (myst-nb's
  ``nb_execution_in_temp``): ``meshops`` prints the data folder it was given as an
  absolute path, so the tutorials show it (a fix belongs to what the commands print).
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Iterable

from docutils import nodes
from sphinx.util import logging

from benchmarks.paths import ABSOLUTE

logger = logging.getLogger(__name__)

#: The folder myst-nb runs a page in: ``tempfile.TemporaryDirectory()`` or ``mkdtemp()``.
SCRATCH = re.compile("^(?:{})/tmp[a-z0-9_]{{8}}(?=/|$)".format("|".join(
    re.escape(p) for p in {tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())})))


def machine_paths(text: str, examples: Iterable[str] = (), scratch: bool = False
                  ) -> list[tuple[int, str]]:
    """``(line, path)`` of every absolute path in ``text`` (lines from 1), but those that
    start with one of ``examples`` and, with ``scratch``, those in an executed page's
    temporary folder."""
    examples = tuple(examples)
    out = []
    for m in ABSOLUTE.finditer(text):
        path = m.group(0)
        if path.startswith(examples) or (scratch and SCRATCH.match(path)):
            continue
        out.append((text.count("\n", 0, m.start()) + 1, path))
    return out


def _in_cell_output(node: nodes.Node) -> bool:
    while node is not None:
        if isinstance(node, nodes.Element) and node.get("nb_element") == "cell_code_output":
            return True
        node = node.parent
    return False


def check_doctree(app, doctree: nodes.document, docname: str) -> None:
    """The ``doctree-resolved`` hook: a warning per absolute path the page shows."""
    examples = app.config.machine_paths_examples
    for text in doctree.findall(nodes.Text):
        found = machine_paths(text.astext(), examples, scratch=_in_cell_output(text))
        if not found:
            continue
        parent = text.parent
        source = parent.get("source") or doctree.get("source")
        first = parent.line or 1
        for line, path in found:
            logger.warning(f"an absolute machine path is shown: {path} (write it relative "
                           f"to the repository or the data root: benchmarks/paths.py)",
                           location=f"{source}:{first + line - 1}", type="machine-path")


def setup(app):
    app.add_config_value("machine_paths_examples", (), "env")
    app.connect("doctree-resolved", check_doctree)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
