"""Issue 22, item 4: ``meshops export`` / :func:`meshops.inference.export.export_model`.
The exported program (torch.export ``.pt2``, ONNX through SDPA) reproduces the model's ``predict``
within 1e-5, loads without meshops operators, and refuses what it cannot do."""

from __future__ import annotations

import sys
import zipfile

import pytest
import torch
from _tiny_run import one_line_error, tiny_args
from test_cli import _write_dataset

from meshops import cli
from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.inference.export import ExportError, export_model, load_exported, read_info
from meshops.mesh.data import MeshData
from meshops.models import get_model

pytestmark = pytest.mark.usefixtures("one_thread")

_CONFIGS = {
    "transformer_no": dict(width=16, layers=2, heads=2),
    "galerkin_transformer": dict(width=16, layers=2, heads=2),
    "pit": dict(width=16, heads=2, blocks=2, num_latent=16, quantile_in=0.2, quantile_out=0.2),
}


def _mesh(n: int, seed: int) -> MeshData:
    g = torch.Generator().manual_seed(seed)
    return MeshData(pos=torch.rand(n, 2, generator=g), weight=torch.full((n,), 1.0 / n),
                    x=torch.randn(n, 2, generator=g))


def _model(name: str):
    torch.manual_seed(0)
    m = get_model(name, in_channels=2, out_channels=3, **_CONFIGS[name]).eval()
    # normalisers with a visible effect: the program must include them
    norms = []
    for mean, std in (([1.0, -2.0], [0.5, 3.0]), ([10.0, 0.0, -1.0], [2.0, 5.0, 0.1])):
        n = UnitGaussianNormalizer(len(mean))
        n.mean.copy_(torch.tensor(mean))
        n.std.copy_(torch.tensor(std))
        n.fitted.fill_(True)
        norms.append(n)
    return m.set_normalizers(*norms)


def _close(out, ref):
    """Within 1e-5 of the prediction's magnitude."""
    out, ref = torch.as_tensor(out, dtype=torch.float64), ref.to(torch.float64)
    assert out.shape == ref.shape
    assert float((out - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("name, suffix", [("transformer_no", ".pt2"), ("transformer_no", ".onnx"),
                                          ("galerkin_transformer", ".onnx")])
def test_mesh_input_models_export_with_dynamic_sizes(tmp_path, name, suffix):
    if suffix == ".onnx":
        pytest.importorskip("onnxruntime")
    model = _model(name)
    mesh = _mesh(50, 0)
    info = export_model(model, mesh, tmp_path / f"m{suffix}", dynamic=True,
                        metadata={"inputs": ["a", "b"], "targets": ["u"]})
    assert info["inputs"] == ["x", "pos", "weight"] and info["points"] is None
    assert read_info(tmp_path / f"m{suffix}") == info
    run = load_exported(tmp_path / f"m{suffix}")
    for m in (mesh, _mesh(37, 1)):  # the example size and another one
        _close(run(m.x, m.pos, m.weight), model.predict(m))


@pytest.mark.parametrize("suffix", [".pt2", ".onnx"])
def test_pit_exports_its_mesh_built_in(tmp_path, suffix):
    if suffix == ".onnx":
        pytest.importorskip("onnxruntime")
    model = _model("pit")
    mesh = _mesh(40, 0)
    info = export_model(model, mesh, tmp_path / f"p{suffix}")
    assert info["inputs"] == ["x"] and info["fixed_mesh"] and info["points"] == 40
    run = load_exported(tmp_path / f"p{suffix}")
    _close(run(mesh.x), model.predict(mesh))
    # new input fields on the same mesh: the parametric-study case
    other = MeshData(pos=mesh.pos, weight=mesh.weight, x=torch.randn(40, 2))
    _close(run(other.x), model.predict(other))


def test_pt2_holds_no_meshops_operator(tmp_path):
    model = _model("transformer_no")
    export_model(model, _mesh(30, 0), tmp_path / "m.pt2")
    ep = torch.export.load(str(tmp_path / "m.pt2"))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("scaled_dot_product_attention" in t or "_scaled_dot_product" in t
               for t in targets), targets  # the SDPA path
    assert not any("meshops" in t for t in targets)
    with zipfile.ZipFile(tmp_path / "m.pt2") as z:
        assert any(n.endswith("extra/meshops.json") for n in z.namelist())


def test_what_cannot_be_exported_is_refused(tmp_path):
    mesh = _mesh(30, 0)
    with pytest.raises(ExportError, match="unknown export format '.tflite'"):
        export_model(_model("transformer_no"), mesh, tmp_path / "m.tflite")
    with pytest.raises(ExportError, match="pit: the exported program holds this mesh's"):
        export_model(_model("pit"), mesh, tmp_path / "m.pt2", dynamic=True)
    torch.manual_seed(0)
    patched = get_model("patched_transformer", in_channels=2, out_channels=1, width=8,
                        layers=1, heads=2, num_patches=2)
    with pytest.raises(ExportError, match="patched_transformer cannot be exported"):
        export_model(patched, mesh, tmp_path / "m.pt2")
    assert not list(tmp_path.iterdir())  # nothing half-written


# ----------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = _write_dataset(tmp_path_factory.mktemp("data"), n=5)
    out = tmp_path_factory.mktemp("runs") / "run"
    assert cli.main(["train", "--data", str(data), *tiny_args(1), "--logger", "none",
                     "--out", str(out)]) == 0
    return out, data


def test_cli_export_checks_the_file_against_the_run(run, tmp_path, capsys):
    out, data = run
    assert cli.main(["export", str(out), "-o", str(tmp_path / "m.pt2"), "--dynamic"]) == 0
    printed = capsys.readouterr().out
    assert "inputs x [N, 1], pos [N, 2], weight [N] -> y [N, 1]" in printed
    assert "any number of points" in printed and "tolerance 1e-05" in printed
    info = read_info(tmp_path / "m.pt2")
    assert info["input_fields"] == ["f"] and info["target_fields"] == ["u"]
    # predictions of the file equal `meshops predict`'s on another mesh
    from meshops.inference.predict import RunSpec, load_model, mesh_sample, predict_mesh
    from meshops.mesh.io import read_mesh

    model, ckpt, meta = load_model(out, "cpu")
    spec = RunSpec(model, ckpt, meta)
    mesh = read_mesh(data / "s4.vtu")
    s = mesh_sample(model, spec, mesh)
    _close(load_exported(tmp_path / "m.pt2")(s.x, s.pos, s.weight), predict_mesh(model, spec, mesh))


def test_cli_export_errors_are_one_line(run, tmp_path, capsys):
    out, data = run
    code = cli.main(["export", str(out), "-o", str(tmp_path / "m.h5")])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err) and "unknown export format '.h5'" in err
    from meshops.models import NeuralOperator

    first = data / NeuralOperator.from_checkpoint(out / "best.pt").metadata["split"]["train"][0]
    first.rename(first.with_suffix(".bak"))
    try:
        code = cli.main(["export", str(out), "-o", str(tmp_path / "m.pt2")])
        err = capsys.readouterr().err
        # the first training file is gone: the example mesh must be named
        assert code == 2 and one_line_error(err) and "pass --mesh FILE" in err, err
        other = next(data.glob("*.vtu"))
        assert cli.main(["export", str(out), "-o", str(tmp_path / "m.pt2"), "--mesh",
                         str(other)]) == 0
    finally:
        first.with_suffix(".bak").rename(first)


def test_cli_export_does_not_replace_a_file_without_overwrite(run, tmp_path, capsys):
    # issue 28: `export -o FILE` replaced an existing file (predict asks for --overwrite)
    out, _ = run
    target = tmp_path / "m.pt2"
    target.write_bytes(b"the user's file")
    code = cli.main(["export", str(out), "-o", str(target)])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err), err
    assert f"{target}: exists" in err and "--overwrite" in err
    assert target.read_bytes() == b"the user's file"
    assert cli.main(["export", str(out), "-o", str(target), "--overwrite"]) == 0
    assert read_info(target)["target_fields"] == ["u"]


def test_cli_export_to_onnx_without_onnxruntime_is_refused(run, tmp_path, capsys, monkeypatch):
    # issue 28: with onnx but no onnxruntime the file was written unchecked, exit 0
    out, _ = run
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    target = tmp_path / "m.onnx"
    code = cli.main(["export", str(out), "-o", str(target)])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err), err
    assert f"{target}:" in err and "onnxruntime" in err and "nothing written" in err
    assert not list(tmp_path.iterdir())
    target.write_bytes(b"kept")
    assert cli.main(["export", str(out), "-o", str(target), "--overwrite"]) == 2
    assert target.read_bytes() == b"kept"


# ------------------------------------------------- runs of every kind (issue 28)
def _program_matches_predict(path, run_dir, mesh_file, **inputs):
    """The exported file against `meshops predict`'s computation (the run's layout:
    cells, tag channels, parameters) on ``mesh_file``, the file's inputs taken from that
    sample; ``inputs`` replaces some of them. Returns the sample and the output."""
    from meshops.datasets.layout import SampleLayout
    from meshops.inference.predict import RunSpec, load_model, mesh_sample
    from meshops.mesh.io import read_mesh

    model, ckpt, meta = load_model(run_dir, "cpu")
    spec = RunSpec(model, ckpt, meta)
    layout = SampleLayout.from_run(meta, spec.inputs, spec.targets, model, ckpt)
    s = mesh_sample(model, spec, layout.view(read_mesh(mesh_file), mesh_file,
                                             need_targets=False))
    for k, v in inputs.items():  # in the dtype the program takes (params: float64)
        setattr(s, k, v.to(getattr(s, k).dtype))
    info = read_info(path)
    out = load_exported(path)(*(getattr(s, k) for k in info["inputs"]))
    _close(out, model.predict(s))
    return s, out, info


def test_cli_export_of_a_cell_run_predicts_at_the_cells(tmp_path, tmp_path_factory, capsys):
    # issue 28: the program of a cell-target run predicted at the vertices
    from test_cells import _write_cell_folder

    data = _write_cell_folder(tmp_path_factory.mktemp("cells") / "data", n=3)
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(data), "--inputs", "f", "--targets", "p",
                     *tiny_args(1)[4:], "--logger", "none", "--out", str(out)]) == 0
    for name, extra in (("m.pt2", ["--dynamic"]), ("p.onnx", [])):
        if name.endswith(".onnx"):
            pytest.importorskip("onnxruntime")
        assert cli.main(["export", str(out), "-o", str(tmp_path / name), "--mesh",
                         str(data / "c1.vtu"), *extra]) == 0
        assert "pos holds the cells' centroids" in capsys.readouterr().out
        s, y, info = _program_matches_predict(tmp_path / name, out, data / "c1.vtu")
        from meshops.mesh.cells import cell_points
        from meshops.mesh.io import read_mesh

        cp = cell_points(read_mesh(data / "c1.vtu"))
        assert info["location"] == "cells" and y.shape[0] == cp.num_cells
        assert torch.allclose(s.pos.double(), torch.from_numpy(cp.centroid).float().double())


def test_cli_export_of_a_tags_run(tmp_path, tmp_path_factory, capsys):
    # issue 28: export of a tags run blamed the mesh file for lacking tag:wall
    from test_boundary import _write_gmsh_folder

    data = _write_gmsh_folder(tmp_path_factory.mktemp("tags") / "data", n=3)
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(data), "--inputs", "", "--targets", "u",
                     "--tags", "wall,inlet", *tiny_args(1)[4:], "--logger", "none",
                     "--out", str(out)]) == 0
    assert cli.main(["export", str(out), "-o", str(tmp_path / "t.pt2"), "--dynamic"]) == 0
    _, _, info = _program_matches_predict(tmp_path / "t.pt2", out, data / "s2.msh")
    assert info["input_fields"] == ["tag:wall", "tag:inlet", "tag:normal"]


def test_cli_export_of_a_params_run_takes_the_parameters(tmp_path, tmp_path_factory):
    # issue 28: export of a --params run failed, suggesting params [B, 1] per batch
    from _folders import write_folder

    data = write_folder(tmp_path_factory.mktemp("params") / "data", 3)
    (data / "params.csv").write_text("file,alpha\ns0.vtu,0.5\ns1.vtu,1.0\ns2.vtu,2.0\n")
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(data), *tiny_args(1), "--params", "alpha",
                     "--logger", "none", "--out", str(out)]) == 0
    for name in ("p.pt2", "p.onnx"):
        if name.endswith(".onnx"):
            pytest.importorskip("onnxruntime")
        assert cli.main(["export", str(out), "-o", str(tmp_path / name)]) == 0
        _, y0, info = _program_matches_predict(tmp_path / name, out, data / "s1.vtu")
        assert info["inputs"] == ["x", "pos", "weight", "params"]
        assert info["param_fields"] == ["alpha"] and info["params_dtype"] == "float64"
        # another parameter value: the program follows it as the model does
        _, y1, _ = _program_matches_predict(tmp_path / name, out, data / "s1.vtu",
                                            params=torch.tensor([[7.0]]))
        assert not torch.allclose(y0, y1)


@pytest.mark.parametrize("regressor", ["rbf", "gp", "mlp"])
@pytest.mark.parametrize("suffix", [".pt2", ".onnx"])
def test_a_reduced_basis_exports_with_its_mesh_built_in(tmp_path, monkeypatch, regressor,
                                                        suffix):
    # issue 28: spline and GP raised StopIteration (no parameters), the MLP a guard error
    if suffix == ".onnx":
        pytest.importorskip("onnxruntime")
    from test_reduced_basis import _params, _samples

    from meshops.fitting import reduced_basis as fit_module
    from meshops.fitting.reduced_basis import fit_reduced_basis

    monkeypatch.setattr(fit_module, "MLP_EPOCHS", 30)
    for as_params in (False, True):  # constant input fields, or a vector per sample
        train = _samples(6, _params(8, 0), as_params)
        model, _ = fit_reduced_basis(train, _samples(6, _params(3, 1), as_params),
                                     regressors=(regressor,), members=2)
        path = tmp_path / f"rb{as_params}{suffix}"
        info = export_model(model, train[0], path)
        assert info["fixed_mesh"] and info["points"] == train[0].pos.shape[0]
        assert info["inputs"] == (["params"] if as_params else ["x"])
        run = load_exported(path)
        dtypes = {k: getattr(torch, info["params_dtype" if k == "params" else "dtype"])
                  for k in info["inputs"]}
        for s in _samples(6, _params(3, 5), as_params):  # parameters it did not see
            _close(run(*(getattr(s, k).to(dtypes[k]) for k in info["inputs"])),
                   model.predict(s))
    with pytest.raises(ExportError, match="reduced_basis: the exported program holds"):
        export_model(model, train[0], tmp_path / "d.pt2", dynamic=True)


def test_cli_export_to_onnx_prints_no_warning_of_torch(run, tmp_path, capsys):
    # issue 28: torch's notice to its own callers (a deprecated isinstance check inside
    # the ONNX exporter) was printed as "meshops: warning: ...": not the user's concern
    pytest.importorskip("onnxruntime")
    out, _ = run
    for name, extra in (("m.onnx", []), ("d.onnx", ["--dynamic"])):
        assert cli.main(["export", str(out), "-o", str(tmp_path / name), *extra]) == 0
        err = capsys.readouterr().err
        assert "meshops: warning" not in err and "deprecated" not in err, err


def test_cli_export_of_a_time_series_run_is_refused_by_name(tmp_path, capsys):
    # issue 28 (the export capability table): a series run's export failed asking for
    # --mesh; its next-step model is refused up front, naming why
    from _series import series_params, write_heat_series

    write_heat_series(tmp_path / "d", series_params(3, seed=2), steps=4, dt=0.02, fmt="pvd")
    out = tmp_path / "run"
    assert cli.main(["train", "--series", "--data", str(tmp_path / "d"), "--inputs", "",
                     "--targets", "u", "--params", "kappa,a", "--model", "transformer_no",
                     "--model-config", "width=8", "layers=1", "heads=2", "--epochs", "1",
                     "--logger", "none", "--out", str(out)]) == 0
    capsys.readouterr()
    code = cli.main(["export", str(out), "-o", str(tmp_path / "s.pt2")])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err), err
    assert "next_step cannot be exported: " in err and "predict --rollout" in err
    assert not (tmp_path / "s.pt2").exists()


def test_cli_export_of_a_trajectory_basis_run_is_refused_by_name(tmp_path, capsys):
    # issue 38: a trajectory basis' export asked for --mesh, and with one said its
    # metadata was inconsistent; it is refused up front, naming why, with or without it
    from _series import series_params, write_heat_series

    write_heat_series(tmp_path / "d", series_params(6, seed=2), steps=4, dt=0.02)
    out = tmp_path / "run"
    assert cli.main(["train", "--series", "--data", str(tmp_path / "d"), "--inputs", "",
                     "--targets", "u", "--params", "kappa,a", "--model", "trajectory_basis",
                     "--model-config", "regressors=rbf", "--minutes", "0.05",
                     "--out", str(out)]) == 0
    capsys.readouterr()
    for mesh in ([], ["--mesh", str(tmp_path / "d" / "s00" / "u_0000.vtu")]):
        code = cli.main(["export", str(out), "-o", str(tmp_path / "s.pt2"), *mesh])
        err = capsys.readouterr().err
        assert code == 2 and one_line_error(err), err
        assert "trajectory_basis cannot be exported: a time-series basis predicts the fields " \
               "at the times of a series from its parameters (meshops predict RUN SERIES " \
               "--rollout N)" in err
    assert not (tmp_path / "s.pt2").exists()


def test_cli_export_of_a_parametric_study_run(tmp_path, capsys):
    # issue 28: the default model of a parametric study (a reduced basis) raised
    # StopIteration in `meshops export`
    from test_reduced_basis import _folder, _params

    data = _folder(tmp_path / "data", _params(12, 0))
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(data), "--inputs", "a,b", "--targets", "u",
                     "--model-config", "regressors=rbf", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["export", str(out), "-o", str(tmp_path / "rb.pt2")]) == 0
    printed = capsys.readouterr().out
    assert "wrote " in printed and "reduced_basis, inputs x [N, 2] -> y [N, 1]" in printed
    _, y, info = _program_matches_predict(tmp_path / "rb.pt2", out, data / "s003.vtu")
    assert info["fixed_mesh"] and y.shape == (81, 1)


@pytest.mark.parametrize("suffix", [".pt2", ".onnx"])
def test_an_exported_model_scales_its_outputs_by_the_load(tmp_path, suffix):
    """A model whose outputs scale by input channel 1 (issue 37): the program multiplies
    by the sample's value of it, at the example's load and at another."""
    if suffix == ".onnx":
        pytest.importorskip("onnxruntime")
    model = _model("transformer_no")
    model.output_normalizer.set_scale_by(1)
    mesh = _mesh(50, 0)
    mesh.x[:, 1] = 2.5  # a load: constant over the mesh
    export_model(model, mesh, tmp_path / f"m{suffix}", dynamic=True)
    run = load_exported(tmp_path / f"m{suffix}")
    other = _mesh(37, 1)
    other.x[:, 1] = -7.0
    for m in (mesh, other):
        _close(run(m.x, m.pos, m.weight), model.predict(m))
    ref = model.predict(other)
    model.output_normalizer.set_scale_by(-1)
    _close(ref, -7.0 * model.predict(other))
