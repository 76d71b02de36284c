"""atomic_write: a file is written completely or not at all, also when an interrupt
arrives while its temporary file is being made."""

import os
import signal
import threading

import pytest

from meshops.utils import atomic
from meshops.utils.atomic import atomic_write


def test_an_interrupt_while_the_temporary_file_is_made_leaves_nothing(tmp_path, monkeypatch):
    """SIGINT sent to the process just as the temporary file has been created (what
    SIGTERM is under the CLI): the interrupt is raised, the target is not written, and
    no temporary file is left behind."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are raised in the main thread only")
    real = os.open

    def open_then_interrupt(*args, **kwargs):
        fd = real(*args, **kwargs)
        os.close(fd)
        os.kill(os.getpid(), signal.SIGINT)   # raised at the next bytecode or so
        return real(os.devnull, os.O_RDONLY)

    monkeypatch.setattr(atomic.os, "open", open_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "out.json", lambda tmp: None)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == []


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def fail(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, fail)
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["out.txt"]
