"""atomic_write: a file is written completely or not at all, also when an interrupt
arrives while its temporary file is being made."""

import os
import signal
import threading

import pytest

from meshops.utils import atomic
from meshops.utils.atomic import atomic_write


def test_an_interrupt_while_the_temporary_file_is_made_leaves_nothing(tmp_path, monkeypatch):
    """A signal raised as an interrupt (what SIGTERM is under the CLI) just as the
    temporary file has been created: the interrupt is raised, the target is not written, and
    no temporary file is left behind."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are raised in the main thread only")
    real = os.open

    def interrupt(signum, frame):  # as the CLI turns SIGTERM into an exception
        raise KeyboardInterrupt

    def open_then_interrupt(*args, **kwargs):
        fd = real(*args, **kwargs)
        os.close(fd)
        os.kill(os.getpid(), signal.SIGUSR1)   # raised at the next bytecode or so
        return real(os.devnull, os.O_RDONLY)

    # SIGUSR1 with our own handler: pytest-xdist's workers ignore SIGINT
    old = signal.signal(signal.SIGUSR1, interrupt)
    try:
        monkeypatch.setattr(atomic.os, "open", open_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            atomic_write(tmp_path / "out.json", lambda tmp: None)
        monkeypatch.undo()
    finally:
        signal.signal(signal.SIGUSR1, old)
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
