"""Issue 29, item 1: the main job as a Python API. ``meshops.fit`` trains the run
``meshops train`` trains (same defaults and files: bit for bit on a tiny set), and a
``Run``'s ``evaluate``, ``predict_files``, ``predict`` and ``export`` give what the
commands print and write; the commands are shells over them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from _folders import SMALL, folder_bytes, run_cli, write_folder
from _series import series_params, write_heat_series
from _tiny_run import checkpoint_tensors

import meshops
from meshops.errors import MeshError, UsageError
from meshops.mesh.io import read_mesh

# SMALL (tests/_folders.py) as fit()'s keywords
SMALL_KW = {"inputs": ["f"], "targets": ["u"], "model": "transformer_no",
            "model_config": {"width": 8, "layers": 1, "heads": 2}, "epochs": 1,
            "batch_size": 2}


def _same_run(a, b) -> None:
    """Two run folders hold the same model and history, and the same config but for
    the run folder itself."""
    wa, wb = checkpoint_tensors(a / "best.pt"), checkpoint_tensors(b / "best.pt")
    assert wa.keys() == wb.keys() and len(wa) > 2
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ha, hb = (json.loads((r / "history.json").read_text()) for r in (a, b))
    strip = lambda h: [{k: v for k, v in e.items() if k != "time_s"} for e in h]  # noqa: E731
    assert strip(ha) == strip(hb) and len(strip(ha)) >= 1
    ca, cb = (yaml.safe_load((r / "config.yaml").read_text()) for r in (a, b))
    assert ca.pop("out") == str(a) and cb.pop("out") == str(b)
    assert ca == cb


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """The same tiny run trained by the command and by fit()."""
    root = tmp_path_factory.mktemp("runs")
    assert meshops.cli.main(["train", "--data", str(data), *SMALL, "--out",
                             str(root / "cli")]) == 0
    run = meshops.fit(str(data), out=str(root / "api"), **SMALL_KW)
    return root / "cli", root / "api", run


def test_fit_trains_the_run_the_command_trains_bit_for_bit(runs):
    cli_run, api_run, run = runs
    _same_run(cli_run, api_run)
    assert isinstance(run, meshops.Run) and run.checkpoint == api_run / "best.pt"


def test_fit_takes_the_data_s_defaults_as_the_command_does(data, tmp_path, capsys):
    """Without --model and --epochs both choose the model and fit the epochs to the
    budget from the same data: the configs they write agree on every option."""
    code, out, err = run_cli(capsys, ["train", "--data", data, "--inputs", "f", "--targets",
                                      "u", "--epochs", "1", "--out", tmp_path / "cli",
                                      "--dry-run"])
    assert code == 0, err
    cfg = meshops.fit(str(data), ["f"], ["u"], epochs=1, out=str(tmp_path / "api"),
                      dry_run=True)
    assert isinstance(cfg, meshops.TrainConfig) and capsys.readouterr().out == ""
    say = lambda text: [ln for ln in text.splitlines() if not ln.startswith("out:")]  # noqa: E731
    assert say(out) == say(cfg.render()) and any(ln.startswith("model:") for ln in say(out))


def test_evaluate_reports_what_the_command_prints(runs, data, capsys):
    cli_run, _, run = runs
    report = meshops.load_run(cli_run).evaluate(str(data))
    code, out, err = run_cli(capsys, ["evaluate", cli_run, "--data", data, "--json"])
    assert code == 0, err
    assert json.loads(report.to_json()) == json.loads(out)
    code, table, err = run_cli(capsys, ["evaluate", cli_run, "--data", data])
    assert report.table() == table.rstrip("\n")
    # the numbers are there to use: the per-sample errors' mean is the reported mean
    per = [s["u"]["l2"] for s in report["samples"]]
    assert report["fields"]["u"]["l2"]["mean"] == pytest.approx(np.mean(per), rel=1e-12)
    assert set(report["baselines"]) >= {"nearest training sample"}


def test_predict_files_and_predict_give_what_the_command_writes(runs, data, tmp_path,
                                                                capsys):
    cli_run, _, _ = runs
    run = meshops.load_run(cli_run, "cpu")
    report = run.predict_files(data, tmp_path / "api")
    code, out, err = run_cli(capsys, ["predict", cli_run, data, "-o", f"{tmp_path / 'cli'}/"])
    assert code == 0, err
    assert report.table().replace("/api/", "/cli/") == out.rstrip("\n")
    assert out.rstrip("\n").endswith(f"to {tmp_path / 'cli'}/")    # one slash
    assert len(report["written"]) == 4 and "u_pred" in report["fields"]
    assert folder_bytes(tmp_path / "api") == folder_bytes(tmp_path / "cli")
    # one mesh in memory: the fields written for it
    fields = run.predict(data / "s1.vtu")
    written = read_mesh(tmp_path / "cli" / "s1.vtu").fields
    for name in report["fields"]:
        assert np.allclose(np.asarray(fields[name], dtype=np.float64).reshape(-1),
                           np.asarray(written[name], dtype=np.float64).reshape(-1),
                           rtol=1e-6, atol=1e-12), name


def test_export_checks_the_program_as_the_command_does(runs, tmp_path, capsys):
    cli_run, _, run = runs
    report = run.export(tmp_path / "m.pt2", dynamic=True)
    assert (tmp_path / "m.pt2").is_file()
    assert 0 <= report["difference"] <= report["tolerance"] == 1e-5
    code, out, err = run_cli(capsys, ["export", cli_run, "-o", tmp_path / "c.pt2",
                                      "--dynamic"])
    assert code == 0, err
    # the same lines but the file's name (and the difference, from its own check)
    strip = lambda text: [ln.split(": largest difference")[0] for ln in  # noqa: E731
                          text.replace(str(tmp_path / "c.pt2"), "F").splitlines()]
    assert strip(out) == strip(report.table().replace(str(tmp_path / "m.pt2"), "F"))
    assert len(strip(out)) == 2


def test_a_time_series_run_in_python(tmp_path, capsys):
    """fit(series=True) trains the command's series run; evaluate gives its horizon
    report; predict on one mesh is refused with the way to roll out."""
    params = series_params(6, seed=2)
    write_heat_series(tmp_path / "train", params[:4], steps=6, fmt="pvd")
    write_heat_series(tmp_path / "test", params[4:], steps=6, fmt="pvd")
    flags = ["--series", "--data", tmp_path / "train", "--inputs", "", "--targets", "u",
             "--model", "transformer_no", "--model-config", "width=8", "layers=1",
             "heads=2", "--epochs", "1", "--batch-size", "4", "--rollout-train", "2"]
    code, _, err = run_cli(capsys, ["train", *flags, "--out", tmp_path / "cli"])
    assert code == 0, err
    run = meshops.fit(str(tmp_path / "train"), [], ["u"], out=str(tmp_path / "api"),
                      series=True, model="transformer_no",
                      model_config={"width": 8, "layers": 1, "heads": 2}, epochs=1,
                      batch_size=4, rollout_train=2)
    _same_run(tmp_path / "cli", tmp_path / "api")
    report = run.evaluate(tmp_path / "test")
    capsys.readouterr()
    code, out, err = run_cli(capsys, ["evaluate", tmp_path / "api", "--data",
                                      tmp_path / "test", "--json"])
    assert json.loads(report.to_json()) == json.loads(out)
    assert report["horizon"] == 5 and "persistence" in report["predictors"]
    with pytest.raises(UsageError, match="predicts rollouts: Run.predict_files"):
        run.predict(tmp_path / "test" / "s04.pvd")


def test_fit_refuses_as_the_command_does(data, tmp_path):
    """A bad option is a UsageError naming fit() as its source, before anything is
    written; the command prints the same message as one line."""
    with pytest.raises(UsageError, match=r"fit\(\): epochs"):
        meshops.fit(str(data), ["f"], ["u"], epochs=0, out=str(tmp_path / "r"))
    with pytest.raises(UsageError, match="unknown key 'epoch'.*did you mean 'epochs'"):
        meshops.fit(str(data), ["f"], ["u"], epoch=1, out=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_fit_names_its_keywords_where_the_command_names_flags(data, runs, tmp_path, capsys):
    """Issue 38: fit() told its caller to "pass --inputs"; its messages about the data,
    the fields and the run folder name the keywords (the command's still the flags)."""
    with pytest.raises(UsageError) as e:
        meshops.fit(str(data), out=str(tmp_path / "r"))
    assert str(e.value) == ('fit(): missing inputs=["a", "b"] (or inputs=[] for '
                            'geometry-only problems); targets=["u"] (as keywords or in '
                            'config=FILE)')
    with pytest.raises(UsageError) as e:
        meshops.fit(inputs=["f"], targets=["u"], out=str(tmp_path / "r"))
    assert str(e.value).startswith('fit(): missing data="DIR"')
    with pytest.raises(UsageError) as e:
        meshops.fit(str(data), ["f"], [], out=str(tmp_path / "r"))
    assert str(e.value) == "fit(): targets= needs at least one field name"
    _, api_run, _ = runs
    with pytest.raises(UsageError) as e:
        meshops.fit(str(data), ["f"], ["u"], out=str(api_run), epochs=1)
    assert str(e.value).endswith("already holds a training run (last.pt); pass resume=True "
                                 "to continue it, overwrite=True to replace it, or choose "
                                 "another out=")
    with pytest.raises(UsageError) as e:
        meshops.fit(str(data), ["f"], ["u"], val_data=str(data), out=str(tmp_path / "r"))
    assert f"val_data={data} is the training folder data=" in str(e.value)
    assert "val_fraction=F" in str(e.value) and "--" not in str(e.value)
    code, out, err = run_cli(capsys, ["train", "--data", data, "--inputs", "f", "--targets",
                                      "u", "--out", api_run])
    assert code == 2 and "pass --resume to continue it, --overwrite to replace it, or " \
        "choose another --out" in err
    assert not (tmp_path / "r").exists()


def test_fit_gives_the_caller_its_threads_back(data, tmp_path):
    """Issue 38: fit() left torch at the thread count it trained on; the caller's count
    is restored, after a run and after an error alike."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        meshops.fit(str(data), out=str(tmp_path / "r"), **{**SMALL_KW, "threads": 1})
        assert torch.get_num_threads() == 2
        with pytest.raises(MeshError, match="target field 'nope' not found"):  # after set
            meshops.fit(str(data), ["f"], ["nope"], epochs=1, threads=1,
                        out=str(tmp_path / "bad"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_fit_reads_model_config_as_the_command_does(data, tmp_path, capsys):
    """Issue 38: model_config="w=16" was read a character at a time; a string is the
    words of --model-config, other types are refused, and fit(dry_run=True) returns
    the TrainConfig whose YAML the command's dry run prints, training nothing."""
    base = {"inputs": ["f"], "targets": ["u"], "model": "transformer_no", "epochs": 1,
            "out": str(tmp_path / "api")}
    code, out, err = run_cli(capsys, ["train", "--data", data, "--inputs", "f", "--targets",
                                      "u", "--model", "transformer_no", "--epochs", "1",
                                      "--model-config", "width=8", "layers=1", "--out",
                                      tmp_path / "api", "--dry-run"])
    assert code == 0, err
    for given in ("width=8 layers=1", ["width=8", "layers=1"], {"width": 8, "layers": 1}):
        got = meshops.fit(str(data), dry_run=True, model_config=given, **base)
        assert got.render() == out, given
        assert got.model_config["width"] == 8 and got.model_config["layers"] == 1
    assert not (tmp_path / "api").exists()
    for bad in (16, ["width=8", 2]):
        with pytest.raises(UsageError, match=r"fit\(\): model_config: expected a mapping "
                                             r".* or key=value words \('width=64"):
            meshops.fit(str(data), dry_run=True, model_config=bad, **base)
    with pytest.raises(UsageError, match="expected key=value, got 'w'"):
        meshops.fit(str(data), dry_run=True, model_config="w", **base)


def test_a_default_reduced_basis_exports_and_its_check_passes(tmp_path):
    """The reduced basis the data chooses fits in float64 while its program takes the
    float32 arrays of the run's dtype: the check feeds the program what a user would
    (it fed the float64 sample and failed with a traceback before)."""
    import meshio

    from data_adapters.standins.convdiff import sample_params, solve_convection_diffusion

    params = sample_params(12, seed=0)
    points, triangles, u = solve_convection_diffusion(8, params)
    points = np.column_stack([points, np.zeros(len(points))])
    (tmp_path / "d").mkdir()
    for s in range(len(params)):
        fields = {k: np.full(len(points), v) for k, v in zip(("kappa", "wx", "wy"), params[s])}
        meshio.write(tmp_path / "d" / f"c{s:02d}.vtu",
                     meshio.Mesh(points, [("triangle", triangles)],
                                 point_data={**fields, "u": u[s]}))
    # members given: the MLP ensemble is not sized by the clock, so the regression chosen
    # (and with it the dtype the program takes) is the same on any machine and load
    run = meshops.fit(str(tmp_path / "d"), ["kappa", "wx", "wy"], ["u"], minutes=0.05,
                      model_config={"members": 1}, out=str(tmp_path / "run"))
    assert run.model.model_name == "reduced_basis"
    report = run.export(tmp_path / "m.pt2")
    assert report["dtype"] == "float32" and report["difference"] <= 1e-5
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    mesh = read_mesh(tmp_path / "d" / "c03.vtu")
    x = torch.stack([mesh.fields[k] for k in ("kappa", "wx", "wy")], 1).float()
    expected = run.predict(tmp_path / "d" / "c03.vtu")["u_pred"].reshape(-1)
    got = program(x).reshape(-1).double()
    assert torch.allclose(got, expected.double(), rtol=1e-4, atol=1e-6 * expected.abs().max())


# ------------------------------------------------------ meshes given in memory
def _point_cloud(path, weight):
    """``path``: sample 2 of tests/_folders.py as a point cloud whose stored weights
    (``meshops:weight``) are ``weight``."""
    import meshio
    from _folders import sample

    from meshops.mesh.io import WEIGHT_FIELD

    m = sample(2)
    pts = np.c_[m.pos.numpy(), np.zeros(len(m.pos))]
    meshio.write(path, meshio.Mesh(pts, [("vertex", np.arange(len(pts))[:, None])],
                                   point_data={"f": m.fields["f"].numpy(),
                                               "u": m.fields["u"].numpy(),
                                               WEIGHT_FIELD: weight(len(pts))}))
    return path


def test_all_zero_weights_are_refused_naming_the_mesh(runs, tmp_path, capsys):
    """Issue 38, item 9: weights 0 at every point (a point cloud's stored weights, a
    MeshData) reached the layers' ValueError, a traceback from the commands."""
    from _folders import sample
    from _tiny_run import one_line_error

    from meshops.errors import MeshError

    cli_run, _, _ = runs
    cloud = _point_cloud(tmp_path / "cloud.vtu", np.zeros)
    for argv in (["predict", cli_run, cloud, "-o", tmp_path / "p"],
                 ["evaluate", cli_run, "--data", tmp_path]):
        code, out, err = run_cli(capsys, argv)
        assert code == 2 and one_line_error(err), err
        assert f"{cloud}: the weights (point field 'meshops:weight') are 0 at every " \
               f"point: the mesh has no measure" in err
    run = meshops.load_run(cli_run, "cpu")
    with pytest.raises(MeshError, match=r"cloud.vtu: the weights \(point field 'meshops:weight'"
                                        r"\) are 0 at every point"):
        run.predict(cloud)
    mesh = sample(1)
    mesh.weight = torch.zeros_like(mesh.weight)
    mesh.source = "case-7"
    with pytest.raises(MeshError, match=r"case-7: the weights \(MeshData.weight\) are 0 at "
                                        r"every point"):
        run.predict(mesh)


def test_predict_takes_a_mesh_in_memory_as_a_file(runs, data):
    """Issue 38, item 10: a MeshData without weight, or with numpy fields, predicts
    what its file predicts (weights from its cells); too short a field is refused
    naming it."""
    from meshops.errors import MeshError
    from meshops.mesh.data import MeshData

    run = meshops.load_run(runs[0], "cpu")
    mesh = read_mesh(data / "s1.vtu")
    want = run.predict(data / "s1.vtu")["u_pred"]
    bare = MeshData(pos=mesh.pos, fields={"f": mesh.fields["f"].numpy()}, cells=mesh.cells)
    got = run.predict(bare)["u_pred"]
    assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))
    short = MeshData(pos=mesh.pos, weight=mesh.weight, fields={"f": mesh.fields["f"][:-3]},
                     cells=mesh.cells)
    n = len(mesh.pos)
    with pytest.raises(MeshError, match=f"the mesh: point field 'f' has {n - 3} values but "
                                        f"the mesh has {n} points"):
        run.predict(short)
