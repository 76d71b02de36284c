"""Folders of small meshes for the tests of issue 20 (trust): a unit square per file
with an input ``f`` and a target ``u``, scaled or edited per file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import square_mesh

from meshops import cli
from meshops.mesh.io import mesh_from_arrays, write_mesh

# A run of a second or two: the tests check what is recorded and refused, not accuracy.
SMALL = ["--inputs", "f", "--targets", "u", "--model", "transformer_no", "--model-config",
         "width=8", "layers=1", "heads=2", "--epochs", "1", "--batch-size", "2"]


def sample(k: int, scale: float = 1.0, input_scale: float = 1.0, edit=None):
    """Unit square (5 x 5 cells, quads or triangles), f and u = f * y + x^2 / 2 times
    ``scale``; ``edit(fields)`` may change the fields in place."""
    pts, cells = square_mesh(5, ("quad", "triangle")[k % 2], amount=0.2, seed=k)
    x, y = pts[:, 0], pts[:, 1]
    f = np.sin((1 + 0.3 * k) * np.pi * x) * np.cos(np.pi * y)
    fields = {"f": f * input_scale, "u": (f * y + 0.5 * x ** 2) * scale}
    if edit is not None:
        edit(fields)
    return mesh_from_arrays(pts, cells, fields)


def write_folder(root: Path, n: int = 4, suffix: str = ".vtu", edits: dict | None = None,
                 **kw) -> Path:
    """``n`` files ``s0..`` in ``root``; ``edits`` maps a file index to an ``edit``."""
    root.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        write_mesh(root / f"s{k}{suffix}", sample(k, edit=(edits or {}).get(k), **kw))
    return root


def folder_bytes(folder: Path) -> dict:
    """Every file under ``folder`` (subfolders such as ``tensorboard/`` too) by relative
    path, with its bytes: two calls compare whether anything was written or removed."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    """``meshops ARGV`` in this process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def train(capsys, data: Path, out: Path, *extra) -> tuple[int, str, str]:
    return run_cli(capsys, ["train", "--data", data, *SMALL, "--out", out, *extra])


def tiny_model():
    """The model of SMALL, seeded: a Trainer test's model in milliseconds."""
    from meshops.models import get_model

    torch.manual_seed(0)
    return get_model("transformer_no", in_channels=1, out_channels=1, pos_dim=2, width=8,
                     layers=1, heads=2)


def tiny_samples(n: int, edits: dict | None = None, **kw) -> list:
    """Training samples (f -> u, float32) of ``n`` meshes of :func:`sample`."""
    from meshops.training import assemble

    return [assemble(sample(k, edit=(edits or {}).get(k), **kw), ["f"], ["u"])
            for k in range(n)]


# Module fixtures: a test module imports them by name (``from _folders import data, run``).
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Four meshes of :func:`sample` (s0.vtu .. s3.vtu)."""
    return write_folder(tmp_path_factory.mktemp("data"))


def trained(data: Path, out: Path) -> Path:
    """``out``, a run of SMALL trained on ``data``."""
    code = cli.main(["train", "--data", str(data), *SMALL, "--out", str(out)])
    if code:
        raise RuntimeError(f"training the test run {out} failed (exit {code})")
    return out


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """A run of SMALL trained on ``data``."""
    return trained(data, tmp_path_factory.mktemp("runs") / "run")
