"""Vector and tensor fields through every format that meshops writes fields to (issue
20, item 5): a field reads back with its values (a tensor flat, as VTK stores it), or
the write is refused naming the field and the formats that hold it. Never a file that
cannot be read back, nor one whose field comes back as another (legacy VTK pads a
2-vector to 3 components)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import meshio
import numpy as np
import pytest
from _folders import run_cli
from _meshes import square_mesh

from meshops.errors import MeshError
from meshops.mesh.io import FIELD_FORMATS, mesh_from_arrays, read_mesh, write_mesh

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(), (1,), (2,), (3,), (4,), (5,), (6,), (9,), (2, 2), (3, 3), (2, 3)]
SUFFIXES = sorted(set(FIELD_FORMATS.values()))


def _mesh(shape, seed=0):
    pts, cells = square_mesh(3, "triangle")
    rng = np.random.default_rng(seed)
    return mesh_from_arrays(pts, cells, {"a": rng.standard_normal((len(pts), *shape))})


def _meshio_round_trip(path: Path, values: np.ndarray) -> bool:
    """Whether meshio alone reads ``values`` (flattened) back from ``path``'s format."""
    pts, cells = square_mesh(3, "triangle")
    flat = values.reshape(len(values), -1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meshio.write(path, meshio.Mesh(np.c_[pts, np.zeros(len(pts))], cells,
                                           point_data={"a": flat}),
                         **({"data_format": "XML"} if path.suffix == ".xdmf" else {}))
            back = meshio.read(path).point_data["a"]
    except Exception:
        return False
    return back.size == flat.size and np.array_equal(back.reshape(flat.shape), flat)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
def test_every_field_shape_round_trips_or_is_refused(tmp_path, suffix, shape):
    mesh = _mesh(shape)
    a = mesh.fields["a"].numpy()
    path = tmp_path / f"m{suffix}"
    try:
        write_mesh(path, mesh)
    except MeshError as e:
        assert str(e).startswith(f"{path}: the ") and "'a'" in str(e) and ".vtu" in str(e)
        assert not path.exists() and not list(tmp_path.iterdir())
        # refused only where meshio itself would not give the field back
        assert not _meshio_round_trip(tmp_path / f"raw{suffix}", a)
        return
    back = read_mesh(path).fields["a"].numpy()
    # the same shape, or the same components flat (a tensor as VTK stores it)
    assert back.shape == a.shape or (back.ndim <= 2 and back.size == a.size)
    np.testing.assert_array_equal(back.reshape(a.shape), a)



def _train(capsys, data: Path, target: str) -> Path:
    run = data.parent / "run"
    code, _, err = run_cli(capsys, ["train", "--data", data, "--inputs", "f", "--targets",
                                    target, "--model", "transformer_no", "--model-config",
                                    "width=8", "layers=1", "heads=2", "--epochs", "1",
                                    "--batch-size", "2", "--out", run])
    assert code == 0, err
    return run


def _write_legacy_vtk(path: Path, k: int) -> None:
    """A legacy VTK file as other tools write it, with a TENSORS section (which meshio
    reads as a [N, 3, 3] field)."""
    pts, cells = square_mesh(4, "triangle", amount=0.2, seed=k)
    tri = cells[0][1]
    x, y = pts[:, 0], pts[:, 1]
    f = np.sin((1 + 0.3 * k) * np.pi * x) * np.cos(np.pi * y)
    t = np.stack([f * x, f * y, x, y, f, x * y, x + y, f - x, 1 + y], 1)
    num = (lambda v: "%.17g" % v)
    lines = ["# vtk DataFile Version 4.2", "tensors", "ASCII", "DATASET UNSTRUCTURED_GRID",
             f"POINTS {len(pts)} double", *(f"{num(a)} {num(b)} 0" for a, b in pts),
             f"CELLS {len(tri)} {4 * len(tri)}", *(f"3 {a} {b} {c}" for a, b, c in tri),
             f"CELL_TYPES {len(tri)}", *(["5"] * len(tri)),
             f"POINT_DATA {len(pts)}", "SCALARS f double 1", "LOOKUP_TABLE default",
             *map(num, f), "TENSORS T double", *(" ".join(map(num, r)) for r in t)]
    path.write_text("\n".join(lines) + "\n")


def test_a_tensor_target_predicted_to_every_format_reads_back_and_evaluates(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for k in range(4):
        _write_legacy_vtk(data / f"s{k}.vtk", k)
    assert tuple(read_mesh(data / "s0.vtk").fields["T"].shape[1:]) == (3, 3)
    run = _train(capsys, data, "T")
    for suffix in SUFFIXES:
        out = tmp_path / f"pred{suffix[1:]}"
        code, _, err = run_cli(capsys, ["predict", run, data / "s0.vtk", "-o", out,
                                        "--format", suffix])
        assert code == 0, err
        written = read_mesh(out / f"s0{suffix}")
        assert tuple(written.fields["T_pred"].shape[1:]) == (9,)
        np.testing.assert_allclose(written.fields["T"].numpy().reshape(-1, 3, 3),
                                   read_mesh(data / "s0.vtk").fields["T"].numpy())
        # the written file evaluates like the original: same model, same numbers
        code, res, err = run_cli(capsys, ["evaluate", run, "--data", out, "--json",
                                          "--no-baselines"])
        assert code == 0, err
        code, ref, _ = run_cli(capsys, ["evaluate", run, "--data", data, "--json",
                                        "--no-baselines"])
        got = json.loads(res)["samples"][0]["T"]["l2"]
        assert got == pytest.approx(json.loads(ref)["samples"][0]["T"]["l2"], rel=1e-6)


def test_predicting_a_2_vector_to_legacy_vtk_is_refused_before_writing(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for k in range(4):
        pts, cells = square_mesh(4, "triangle", amount=0.2, seed=k)
        f = np.sin((1 + 0.3 * k) * np.pi * pts[:, 0])
        write_mesh(data / f"s{k}.vtu", mesh_from_arrays(pts, cells, {
            "f": f, "g": np.stack([f * pts[:, 1], pts[:, 0]], 1)}))
    run = _train(capsys, data, "g")
    code, out, err = run_cli(capsys, ["predict", run, data / "s0.vtu", "-o", tmp_path / "p",
                                      "--format", ".vtk"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "the vtk format cannot hold the point field 'g' of 2 components" in err
    assert ".vtu" in err
    assert not (tmp_path / "p" / "s0.vtk").exists()
