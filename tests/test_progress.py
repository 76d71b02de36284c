"""meshops._progress: bars on a terminal, nothing in a redirected log."""

from __future__ import annotations

import io

from meshops._progress import on_terminal, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_only_on_a_terminal():
    log, tty = io.StringIO(), _Terminal()
    assert list(progress(range(50), file=log, desc="phase", mininterval=0)) == list(range(50))
    assert log.getvalue() == ""                        # a file: no bar, no \r
    assert list(progress(range(50), file=tty, desc="phase", mininterval=0)) == list(range(50))
    assert "\r" in tty.getvalue() and "phase" in tty.getvalue()
    off = _Terminal()
    assert list(progress(range(5), file=off, enabled=False)) == list(range(5))
    assert off.getvalue() == ""                        # enabled=False: never


def test_on_terminal():
    assert on_terminal(_Terminal()) and not on_terminal(io.StringIO())

    class Closed:
        def isatty(self):
            raise ValueError("I/O operation on closed file")
    assert not on_terminal(Closed()) and not on_terminal(object())
