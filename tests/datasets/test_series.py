"""Reading and writing time series (meshops.datasets.series): numbered files, ParaView .pvd and
XDMF time series, and the errors for broken series (each naming the file and the
time step)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from _meshes import square_mesh
from _series import heat_states, series_params, write_heat_series
from _tiny_run import one_line_error

from meshops.cli import main as cli_main
from meshops.datasets.series import (
    SeriesError,
    list_series,
    read_series,
    read_series_folder,
    read_state,
    write_series,
)
from meshops.mesh.io import mesh_from_arrays, write_mesh


@pytest.mark.parametrize("fmt", ["folder", "pvd", "xdmf"])
def test_every_format_reads_the_exact_states_times_and_parameters(tmp_path, fmt):
    params = series_params(2, seed=3)
    paths = write_heat_series(tmp_path, params, steps=5, dt=0.1, fmt=fmt)
    assert list_series(tmp_path) == paths  # the pvd's step folder is not a series
    series = read_series_folder(tmp_path, ["u"], ["kappa", "a"])
    for s, (kappa, a) in zip(series, params):
        _, _, t, u = heat_states(kappa, a, 5, 0.1)
        assert s.fields["u"].shape == (5, 49)
        assert torch.equal(s.fields["u"], torch.from_numpy(u))  # float64 round trip
        # numbered files without TimeValue field data: the time is the file's number
        expected = np.arange(5.0) if fmt == "folder" else t
        assert torch.allclose(s.times, torch.from_numpy(expected), rtol=0, atol=1e-15)
        assert s.params.tolist() == [[kappa, a]]
        assert s.mesh.weight.sum().item() == pytest.approx(1.0, abs=1e-14)
        assert s.label(3).endswith("(time step 3, t=%g)" % float(expected[3]))


def _numbered(folder, numbers, n=3, move=None):
    pts, cells = square_mesh(n, "triangle")
    for k in numbers:
        p = pts.copy()
        if move is not None and k == move:
            p[5] += 0.01
        write_mesh(folder / f"u_{k:04d}.vtu", mesh_from_arrays(p, cells),
                   point_data={"u": np.full(len(p), float(k))})
    return folder


def test_numbered_files_may_go_in_strides_and_a_gap_is_a_missing_step(tmp_path):
    s = read_series(_numbered(tmp_path / "a", [0, 10, 20, 30]))
    assert s.times.tolist() == [0, 10, 20, 30]
    with pytest.raises(SeriesError, match=r"time step 20 is missing \(the files go from "
                                          r"u_0010.vtu to u_0030.vtu"):
        read_series(_numbered(tmp_path / "b", [0, 10, 30]))
    with pytest.raises(SeriesError, match=r"time step 2 is missing .*u_0001.vtu to u_0003.vtu"):
        read_series(_numbered(tmp_path / "c", [0, 1, 3, 4]))


def test_a_duplicated_step_names_both_files(tmp_path):
    folder = _numbered(tmp_path / "d", [0, 1, 2])
    shutil.copy(folder / "u_0001.vtu", folder / "u_1.vtu")
    with pytest.raises(SeriesError, match=r"time step 1 appears twice \(u_0001.vtu and u_1.vtu\)"):
        read_series(folder)


def test_steps_on_different_meshes_name_the_file_and_the_step(tmp_path):
    with pytest.raises(SeriesError, match=r"u_0002.vtu \(time step 2, t=2\): not on the mesh "
                                          r"of the first step u_0000.vtu: point 5 is at"):
        read_series(_numbered(tmp_path / "m", [0, 1, 2, 3], move=2))
    folder = _numbered(tmp_path / "n", [0, 1])
    pts, cells = square_mesh(4, "triangle")
    write_mesh(folder / "u_0002.vtu", mesh_from_arrays(pts, cells),
               point_data={"u": np.zeros(len(pts))})
    with pytest.raises(SeriesError, match=r"u_0002.vtu \(time step 2.*25 points but the first "
                                          r"step has 16"):
        read_series(folder)


def _pvd(path, entries):
    rows = "\n".join(f'<DataSet timestep="{t}" part="0" file="{f}"/>' for t, f in entries)
    path.write_text(f'<?xml version="1.0"?>\n<VTKFile type="Collection" version="0.1">'
                    f'<Collection>\n{rows}\n</Collection></VTKFile>\n')
    return path


def test_pvd_times_must_increase_and_files_must_exist(tmp_path):
    _numbered(tmp_path / "f", [0, 1, 2])
    f = [f"f/u_000{k}.vtu" for k in range(3)]
    ok = read_series(_pvd(tmp_path / "ok.pvd", [(0.0, f[0]), (0.5, f[1]), (0.75, f[2])]))
    assert ok.times.tolist() == [0.0, 0.5, 0.75] and [os.path.basename(f) for f in ok.steps] == [
        "u_0000.vtu", "u_0001.vtu", "u_0002.vtu"]
    with pytest.raises(SeriesError, match=r"dup.pvd: time 0.5 appears twice \(DataSet entries "
                                          r"1 and 2: f/u_0001.vtu and f/u_0002.vtu\)"):
        read_series(_pvd(tmp_path / "dup.pvd", [(0.0, f[0]), (0.5, f[1]), (0.5, f[2])]))
    with pytest.raises(SeriesError, match=r"back.pvd: DataSet entry 2 \(f/u_0002.vtu\) has time "
                                          r"0.25 after 0.5: the times must increase"):
        read_series(_pvd(tmp_path / "back.pvd", [(0.0, f[0]), (0.5, f[1]), (0.25, f[2])]))
    with pytest.raises(SeriesError, match=r"gone.pvd: time step 1 \(t=0.5\): file .*u_0009.vtu "
                                          r"not found"):
        read_series(_pvd(tmp_path / "gone.pvd", [(0.0, f[0]), (0.5, "f/u_0009.vtu")]))


def test_xdmf_times_must_increase(tmp_path):
    import meshio

    pts, cells = square_mesh(2, "triangle")
    for name, times, msg in (("dup", [0.0, 0.1, 0.1], r"time step 2\): time 0.1 appears twice"),
                             ("back", [0.0, 0.2, 0.1], r"time step 2\): time 0.1 comes after 0.2")):
        path = tmp_path / f"{name}.xdmf"
        with meshio.xdmf.TimeSeriesWriter(path, data_format="XML") as w:
            w.write_points_cells(pts, cells)
            for t in times:
                w.write_data(t, point_data={"u": np.ones(len(pts))})
        with pytest.raises(SeriesError, match=rf"{name}.xdmf \({msg}"):
            read_series(path)


def test_xdmf_step_with_its_own_mesh_is_refused(tmp_path):
    import meshio

    pts, cells = square_mesh(2, "triangle")
    path = tmp_path / "moving.xdmf"
    with meshio.xdmf.TimeSeriesWriter(path, data_format="XML") as w:
        w.write_points_cells(pts, cells)
        for t in (0.0, 1.0):
            w.write_data(t, point_data={"u": np.ones(len(pts))})
    # Give step 1 a geometry of its own with a moved point (meshio's reader ignores it).
    moved = pts.copy()
    moved[4] += 0.1
    text = path.read_text()
    geometry = ('<Geometry GeometryType="XY"><DataItem DataType="Float" Dimensions="9 2" '
                'Format="XML" Precision="8">' + " ".join(map(repr, moved.ravel().tolist()))
                + "</DataItem></Geometry>")
    head, sep, tail = text.rpartition('<Time Value="1.0"')
    path.write_text(head + geometry + sep + tail)
    with pytest.raises(SeriesError, match=r"moving.xdmf \(time step 1\): this step has another "
                                          r"geometry than the first step"):
        read_series(path)


def test_non_finite_values_and_missing_fields_name_file_and_step(tmp_path):
    folder = _numbered(tmp_path / "nan", [0, 1, 2])
    pts, cells = square_mesh(3, "triangle")
    u = np.zeros(len(pts))
    u[7] = np.nan
    write_mesh(folder / "u_0001.vtu", mesh_from_arrays(pts, cells), point_data={"u": u})
    with pytest.raises(SeriesError, match=r"u_0001.vtu \(time step 1, t=1\): field 'u' has a "
                                          r"non-finite value \(nan\) at point 7"):
        read_series(folder)
    with pytest.raises(SeriesError, match=r"u_0000.vtu \(time step 0, t=0\): point field 'T' not "
                                          r"found; available: u"):
        read_series(_numbered(tmp_path / "f", [0, 1]), fields=["T"])


def test_parameters_come_from_the_table_by_series_name_and_errors_name_it(tmp_path):
    write_heat_series(tmp_path, series_params(2), steps=3, table=False)
    with pytest.raises(SeriesError, match=r"s00: parameter 'kappa' not found: not in the file's "
                                          r"field_data \(it has: none\) and no params.csv or "
                                          r"params.json in"):
        read_series_folder(tmp_path, ["u"], ["kappa"])
    (tmp_path / "params.json").write_text('{"s00": {"kappa": 0.5}, "s01": {"kappa": 2}}')
    assert [s.params.item() for s in read_series_folder(tmp_path, ["u"], ["kappa"])] == [0.5, 2]
    (tmp_path / "params.json").unlink()
    (tmp_path / "params.csv").write_text("file,kappa\ns00,0.5\ns01,nan\n")
    with pytest.raises(SeriesError, match=r"params.csv: s01, column 'kappa': 'nan' is not finite"):
        read_series_folder(tmp_path, ["u"], ["kappa"])
    (tmp_path / "params.csv").write_text("file,kappa\ns00,0.5\n")
    with pytest.raises(SeriesError, match=r"params.csv: no entry for the sample 's01'"):
        read_series_folder(tmp_path, ["u"], ["kappa"])


def test_read_state_is_a_one_step_series(tmp_path):
    pts, cells = square_mesh(3, "triangle")
    write_mesh(tmp_path / "init.vtu", mesh_from_arrays(pts, cells),
               point_data={"u": np.arange(16.0)})
    (tmp_path / "params.csv").write_text("file,kappa\ninit.vtu,0.25\n")
    s = read_state(tmp_path / "init.vtu", ["u"], ["kappa"])
    assert len(s) == 1 and s.times.tolist() == [0.0] and s.params.tolist() == [[0.25]]
    assert s.fields["u"][0].tolist() == list(range(16))


def test_write_series_round_trip_and_a_failed_write_leaves_the_old_one(tmp_path):
    pts, cells = square_mesh(3, "triangle")
    mesh = mesh_from_arrays(pts, cells)
    frames = [{"u": np.full(16, k + 0.5)} for k in range(3)]
    path = write_series(tmp_path / "run.pvd", mesh, frames, [0.0, 0.1, 0.3])
    s = read_series(path)
    assert s.times.tolist() == [0.0, 0.1, 0.3] and s.fields["u"][:, 0].tolist() == [0.5, 1.5, 2.5]
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    pvd = path.read_bytes()
    bad = frames + [{"u": np.zeros(5)}]  # the last step cannot be written
    with pytest.raises(Exception, match="5 values but the mesh has 16"):
        write_series(path, mesh, bad, [0.0, 0.1, 0.2, 0.4])
    assert path.read_bytes() == pvd
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run.pvd"]  # no temporaries
    with pytest.raises(SeriesError, match=r"time step 2 has time 0.1 after 0.2"):
        write_series(path, mesh, frames, [0.0, 0.2, 0.1])
    # a longer second write replaces every file of the first
    write_series(path, mesh, frames + frames, [0.0, 1, 2, 3, 4, 5])
    assert len(read_series(path)) == 6 and len(list((tmp_path / "run").iterdir())) == 6


def test_a_writer_killed_mid_series_leaves_no_half_series(tmp_path):
    # The process dies while writing the steps: the old series is intact, and the
    # killed writer's temporary folder is removed by the next clean-up of the folder.
    pts, cells = square_mesh(2, "triangle")
    mesh = mesh_from_arrays(pts, cells)
    path = write_series(tmp_path / "s.pvd", mesh, [{"u": np.zeros(9)}] * 2, [0, 1])
    script = ("import os, signal, sys, numpy as np\n"
              "from meshops.datasets.series import write_series\n"
              "from meshops.mesh.io import mesh_from_arrays\n"
              "sys.path.insert(0, sys.argv[2])\n"
              "from _meshes import square_mesh\n"
              "class Die(dict):\n"  # the second step's fields: reading them kills
              "    def keys(self):\n"
              "        os.kill(os.getpid(), signal.SIGKILL)\n"
              "    __iter__ = keys\n"
              "m = mesh_from_arrays(*square_mesh(2, 'triangle'))\n"
              "write_series(sys.argv[1], m, [{'u': np.ones(9)}, Die(u=np.ones(9))], [0, 1])\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    tests = os.path.dirname(os.path.dirname(__file__))  # holds _meshes.py
    r = subprocess.run([sys.executable, "-c", script, str(path), tests], env=env)
    assert r.returncode == -9
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 3 and left[0].startswith(".s.meshops-") and left[1:] == ["s", "s.pvd"]
    assert read_series(path).fields["u"].abs().sum() == 0  # the old series
    # (the first write to a folder in a process cleans it; this process wrote here before)
    from meshops.utils.atomic import clean_stale_temporaries
    assert clean_stale_temporaries(tmp_path) == [tmp_path / left[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s", "s.pvd"]


def test_cli_names_the_file_and_step_of_a_broken_series_in_one_line(tmp_path, capsys):
    data = tmp_path / "data"
    write_heat_series(data, series_params(3), steps=4)
    os.remove(data / "s01" / "u_0002.vtu")
    code = cli_main(["train", "--series", "--data", str(data), "--inputs", "", "--targets", "u",
                     "--params", "kappa,a", "--out", str(tmp_path / "run"), "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err), err
    assert "s01: time step 2 is missing (the files go from u_0001.vtu to u_0003.vtu" in err
    assert not (tmp_path / "run").exists()


def test_list_series_refuses_series_beside_loose_mesh_files(tmp_path):
    write_heat_series(tmp_path, series_params(1), steps=2)
    pts, cells = square_mesh(2, "triangle")
    write_mesh(tmp_path / "stray.vtu", mesh_from_arrays(pts, cells))
    with pytest.raises(SeriesError, match=r"holds both time series \(s00, ...\) and loose mesh "
                                          r"files \(stray.vtu"):
        list_series(tmp_path)
    assert list_series(tmp_path / "s00") == [tmp_path / "s00"]  # a folder that is one series
    assert math.isclose(read_series(tmp_path / "s00").times[1].item(), 1.0)
