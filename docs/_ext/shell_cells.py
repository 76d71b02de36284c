"""The docs' ``%%bash`` cells: run the cell in bash and print its output whole.

IPython's own ``%%bash`` forwards a command's output in 100-byte pieces, each its own
stream message, and the executed pages showed every line broken at those seams
(``wind_`` / ``y [576]``, numbers split inside table columns). The tutorials' hidden
first cell loads this extension instead (``%load_ext shell_cells``, with this folder on
``sys.path``), which keeps the cells as a reader would type them in a terminal:

* stdout and stderr are merged in the order the command wrote them, as a terminal shows
  them, and printed once the cell has finished;
* a command that fails fails the cell (and so the docs build), with its output shown.
"""

from __future__ import annotations

import subprocess


class CellFailed(RuntimeError):
    """A shell cell exited with a non-zero status."""


def run_bash(line: str, cell: str) -> None:
    """The ``%%bash`` cell magic: ``bash -e`` runs ``cell``; its output is printed whole."""
    done = subprocess.run(["bash", "-e", "-c", cell], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    print(done.stdout, end="")
    if done.returncode:
        raise CellFailed(f"the shell cell exited with status {done.returncode}")


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(run_bash, magic_kind="cell", magic_name="bash")
