"""Parameters as a run records and reads them (issue 28): a cached sample follows the
values in params.csv, not only its column names; a run's fingerprint covers the
parameter files (and, for a time-series run, every file of every series), so that
``--resume`` refuses edited or added data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import square_mesh

from meshops.io import mesh_from_arrays, write_mesh
from meshops.layout import SampleLayout

pytestmark = pytest.mark.usefixtures("one_thread")


def write_param_folder(root: Path, values: dict, n: int = 4) -> Path:
    """``n`` meshes s0.vtu.. with a target u and ``root/params.csv`` of ``values``
    (``{name: [one value per file]}``)."""
    root.mkdir(parents=True, exist_ok=True)
    pts, cells = square_mesh(4, "triangle")
    for k in range(n):
        u = np.sin(np.pi * pts[:, 0]) * (1 + k) + pts[:, 1]
        write_mesh(root / f"s{k}.vtu", mesh_from_arrays(pts, cells, {"u": u}))
    write_params(root, values, n)
    return root


def write_params(root: Path, values: dict, n: int = 4) -> None:
    lines = ["file," + ",".join(values)] + [
        f"s{k}.vtu," + ",".join(repr(float(v[k])) for v in values.values()) for k in range(n)]
    (root / "params.csv").write_text("\n".join(lines) + "\n")


# -------------------------------------------------------------------- the cache
def test_a_cached_sample_follows_the_values_of_params_csv(tmp_path):
    """The cache key held the parameter names: after an edit of params.csv the cache
    gave the old values."""
    from meshops.cli.lazy import load_folder_cached

    data = write_param_folder(tmp_path / "data", {"a": [1, 2, 3, 4]})

    def params():
        layout = SampleLayout([], ["u"], ["a"])
        _, ds, _, _ = load_folder_cached(data, [], ["u"], torch.float64, layout=layout,
                                         cache=tmp_path / "cache")
        return [float(ds[i].params) for i in range(len(ds))]

    assert params() == [1, 2, 3, 4]
    write_params(data, {"a": [1, 2, 30, 4]})
    assert params() == [1, 2, 30, 4]
