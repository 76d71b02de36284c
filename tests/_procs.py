"""Child processes that do not outlive their test: torchrun's agent starts its workers
as children, and killing the agent alone (``subprocess.run``'s timeout) leaves a rank
waiting forever for its dead peer. Each run gets its own process group, killed whole."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and every process of its group (started with
    ``start_new_session=True``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # all ended already
        pass
    proc.wait()


def run_group(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` with captured text output, in a new process group that is
    killed whole on a timeout (which then raises ``subprocess.TimeoutExpired``)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
