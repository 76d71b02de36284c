"""The tests' own child processes (tests/_procs.py): a run that times out takes its
whole process group with it, as a torchrun agent's ranks must go with the agent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _procs import run_group


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to read its status is not)."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" not in status.read_text()
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs /proc")
def test_a_timed_out_run_leaves_no_grandchild(tmp_path):
    pid_file = tmp_path / "pid"
    child = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
             f"'import time; time.sleep(120)']); open({str(pid_file)!r}, 'w')"
             f".write(str(p.pid)); p.wait()")
    with pytest.raises(subprocess.TimeoutExpired):
        run_group([sys.executable, "-c", child], dict(os.environ), timeout=3)
    grandchild = int(pid_file.read_text())
    for _ in range(50):          # SIGKILL is delivered at once; give the kernel a moment
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_a_run_that_ends_gives_its_output_and_status():
    proc = run_group([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"],
                     dict(os.environ), timeout=60)
    assert (proc.returncode, proc.stdout) == (3, "out\n")
