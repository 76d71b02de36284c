"""``meshops train --out`` where nothing can be written (under a file, under ``/proc``,
a read-only folder, a full disk): one line ``meshops: error: ...`` naming the path and
the reason, exit 2, no traceback.

The tests run as root, for whom ``chmod`` does not make a folder read-only: the
read-only case then makes ``os.mkdir`` fail the way the kernel does for other users
(``EACCES``); run as another user it uses a real ``chmod 555`` folder.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _tiny_run import one_line_error, tiny_args
from test_cli import _write_dataset

from meshops import cli

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py

TINY = tiny_args()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_dataset(tmp_path_factory.mktemp("data"), 3)


def _train(capsys, data, out):
    code = cli.main(["train", "--data", str(data), *TINY, "--out", str(out)])
    return code, capsys.readouterr().err


def test_out_under_a_regular_file(data, tmp_path):
    (tmp_path / "file.txt").write_text("not a folder")
    out = tmp_path / "file.txt" / "run"
    # As the user runs it: a subprocess, so that nothing is caught for it.
    proc = subprocess.run([sys.executable, "-m", "meshops", "train", "--data", str(data),
                           *TINY, "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 2, proc.stderr
    assert one_line_error(proc.stderr), proc.stderr
    assert str(out) in proc.stderr and "Not a directory" in proc.stderr


def test_out_under_proc(data, capsys):
    out = Path("/proc/meshops-no-such-entry/run")
    code, err = _train(capsys, data, out)
    assert code == 2 and one_line_error(err), err
    assert str(out) in err and "cannot write the run folder" in err


def test_out_in_a_read_only_folder(data, tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:  # root ignores the mode; fail as the kernel does for others
        real_mkdir = os.mkdir

        def mkdir(path, *args, **kwargs):
            if Path(path).parent == ro:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
    try:
        code, err = _train(capsys, data, ro / "run")
    finally:
        ro.chmod(0o755)
    assert code == 2 and one_line_error(err), err
    assert str(ro / "run") in err and "Permission denied" in err
    assert not (ro / "run").exists()


def test_a_full_disk_while_saving_is_one_line(data, tmp_path, capsys, monkeypatch):
    def full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))

    monkeypatch.setattr(torch, "save", full)
    code, err = _train(capsys, data, tmp_path / "run")
    assert code == 2 and one_line_error(err), err
    assert "No space left on device" in err and str(tmp_path / "run") in err
    # Written completely or not at all: no checkpoint, no temporary file (the
    # TensorBoard log of the run, when installed, is its own folder).
    assert sorted(p.name for p in (tmp_path / "run").iterdir()
                  if p.name != "tensorboard") == ["config.yaml"]
