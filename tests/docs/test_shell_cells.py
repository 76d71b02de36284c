"""The docs' ``%%bash`` cells (docs/_ext/shell_cells.py, issue 29): a command's output
comes out whole, not in IPython's 100-byte pieces, with stderr in its place, and a
failing command fails the cell."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "_ext"))
from shell_cells import CellFailed, run_bash  # noqa: E402


def test_long_lines_come_out_whole_with_stderr_in_order(capsys):
    line = "wind_y [576] " + "x" * 300
    run_bash("", f"echo '{line}'\necho 'to stderr' >&2\necho after")
    assert capsys.readouterr().out == f"{line}\nto stderr\nafter\n"


def test_a_failing_command_fails_the_cell_after_showing_its_output(capsys):
    with pytest.raises(CellFailed, match="status 3"):
        run_bash("", "echo before\nexit 3\necho never")
    assert capsys.readouterr().out == "before\n"
