"""Parameter vectors (issues 21.2 and 19.4): reading them (field_data, params.csv,
params.json) with refusals that name file and column, FiLM conditioning in every
model (shapes, batching, unchanged without parameters), a family whose target
depends on the parameters only, and ``meshops train/predict/evaluate --params``."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _meshes import square_mesh
from _tiny_run import one_line_error
from torch_geometric.loader import DataLoader

import meshops
from benchmarks.your_data import CONFIGS, family, fit_family
from meshops import cli
from meshops.datasets.folder import MeshFolderDataset
from meshops.datasets.params import read_param_table, sample_params
from meshops.errors import MeshError
from meshops.mesh.data import MeshData
from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh
from meshops.models import NeuralOperator, get_model
from meshops.models.conditioning import fit_param_normalizer, read_params
from meshops.training import Trainer


def write_field_data(path: Path, mesh, values: dict) -> Path:
    """A .vtu with VTK FieldData arrays of one value each, as VTK and ParaView write
    them (meshio's writer drops field data; its reader reads it)."""
    write_mesh(path, mesh)
    arrays = "".join(f'<DataArray type="Float64" Name="{k}" NumberOfTuples="1" '
                     f'format="ascii">{v!r}</DataArray>' for k, v in values.items())
    text = path.read_text()
    path.write_text(text.replace("<UnstructuredGrid>",
                                 f"<UnstructuredGrid><FieldData>{arrays}</FieldData>", 1))
    return path


# ----------------------------------------------------------------- reading
def test_field_data_of_a_vtu_gives_the_parameters(tmp_path):
    pts, cells = square_mesh(3, "triangle")
    path = write_field_data(tmp_path / "s.vtu", mesh_from_arrays(pts, cells, {"u": pts[:, 0]}),
                            {"alpha": 2.5, "Re": 1e5})
    mesh = read_mesh(path)
    p = sample_params(["Re", "alpha"], path, mesh.field_data, None)
    assert p.dtype == torch.float64 and torch.equal(p, torch.tensor([[1e5, 2.5]],
                                                                     dtype=torch.float64))


def _write_table(folder: Path, kind: str, rows: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        cols = list(next(iter(rows.values())))
        lines = ["file," + ",".join(cols)] + [
            name + "," + ",".join(str(r.get(c, "")) for c in cols) for name, r in rows.items()]
        (folder / "params.csv").write_text("\n".join(lines) + "\n")
    else:
        (folder / "params.json").write_text(json.dumps(rows))
    return folder


@pytest.mark.parametrize("kind", ["csv", "json"])
def test_sidecar_files_give_the_parameters_by_file_name(tmp_path, kind):
    folder = _write_table(tmp_path, kind, {"a.vtu": {"alpha": 1.5, "Re": 200},
                                           "b.vtu": {"alpha": -2, "Re": 300}})
    table = read_param_table(folder)
    p = sample_params(["alpha", "Re"], folder / "b.vtu", {}, table)
    assert torch.equal(p, torch.tensor([[-2.0, 300.0]], dtype=torch.float64))


@pytest.mark.parametrize("kind", ["csv", "json"])
def test_a_sample_missing_from_the_table_is_named(tmp_path, kind):
    folder = _write_table(tmp_path, kind, {"a.vtu": {"alpha": 1.5}})
    with pytest.raises(MeshError, match=rf"params\.{kind}: no entry for the sample 'c\.vtu' "
                                        r"\(entries are keyed by file name, e\.g\. a\.vtu\)"):
        sample_params(["alpha"], folder / "c.vtu", {}, read_param_table(folder))


@pytest.mark.parametrize("value,what", [("nan", "is not finite"), ("inf", "is not finite"),
                                        ("", "no value"), ("abc", "is not a number")])
def test_bad_csv_values_name_file_and_column(tmp_path, value, what):
    (tmp_path / "params.csv").write_text(f"file,alpha,Re\na.vtu,1.0,{value}\n")
    with pytest.raises(MeshError, match=rf"params\.csv: a\.vtu, column 'Re': .*{what}"):
        sample_params(["alpha", "Re"], tmp_path / "a.vtu", {}, read_param_table(tmp_path))
    # a bad column that is not asked for does not matter
    assert sample_params(["alpha"], tmp_path / "a.vtu", {}, read_param_table(tmp_path)).item() == 1


def test_json_null_and_missing_columns_are_refused(tmp_path):
    (tmp_path / "params.json").write_text('{"a.vtu": {"alpha": null}, "b.vtu": {"beta": 1}}')
    table = read_param_table(tmp_path)
    with pytest.raises(MeshError, match=r"a\.vtu, column 'alpha': no value"):
        sample_params(["alpha"], tmp_path / "a.vtu", {}, table)
    with pytest.raises(MeshError, match=r"params\.json: b\.vtu: no column 'alpha'"):
        sample_params(["alpha"], tmp_path / "b.vtu", {}, table)


@pytest.mark.parametrize("text,message", [
    ("name,alpha\na.vtu,1\n", r"one of them 'file'"),
    ("file,alpha\na.vtu,1\na.vtu,2\n", r"line 3: 'a\.vtu' is listed twice"),
    ("file,alpha\na.vtu,1,2\n", r"line 2 has more values than the header"),
])
def test_malformed_csv_is_refused(tmp_path, text, message):
    (tmp_path / "params.csv").write_text(text)
    with pytest.raises(MeshError, match=r"params\.csv: .*" + message):
        read_param_table(tmp_path)


@pytest.mark.parametrize("name,text,message", [
    ("params.csv", "file,alpha,Re,alpha\na.vtu,1,2,3\n",
     r"params\.csv: column 'alpha' appears twice in the header"),
    ("params.csv", "file,alpha,file\na.vtu,1,b.vtu\n",
     r"params\.csv: column 'file' appears twice in the header"),
    ("params.json", '{"a.vtu": {"alpha": 1, "Re": 2, "alpha": 3}}',
     r"params\.json: entry 'a\.vtu': parameter 'alpha' is given twice"),
    ("params.json", '{"a.vtu": {"alpha": 1}, "b.vtu": {"alpha": 2}, "a.vtu": {"alpha": 3}}',
     r"params\.json: entry 'a\.vtu' is listed twice"),
])
def test_a_duplicate_column_key_or_entry_is_refused(tmp_path, name, text, message):
    """Issue 28: the last of two values silently won."""
    (tmp_path / name).write_text(text)
    with pytest.raises(MeshError, match=message + r".*keep one"):
        read_param_table(tmp_path)


def test_both_sidecar_files_and_a_name_in_two_places_are_refused(tmp_path):
    _write_table(tmp_path, "csv", {"a.vtu": {"alpha": 1}})
    assert read_param_table(tmp_path) is not None
    with pytest.raises(MeshError, match=r"a\.vtu: parameter 'alpha' is given both in the "
                                        r"file's field_data and in .*params\.csv"):
        sample_params(["alpha"], tmp_path / "a.vtu", {"alpha": np.array([1.0])},
                      read_param_table(tmp_path))
    _write_table(tmp_path, "json", {"a.vtu": {"alpha": 1}})
    with pytest.raises(MeshError, match="holds both params.csv and params.json"):
        read_param_table(tmp_path)


def test_field_data_values_are_checked(tmp_path):
    with pytest.raises(MeshError, match=r"s\.vtu: field_data 'alpha' holds 2 values"):
        sample_params(["alpha"], tmp_path / "s.vtu", {"alpha": np.array([1.0, 2.0])}, None)
    with pytest.raises(MeshError, match=r"s\.vtu: field_data 'alpha': .*is not finite"):
        sample_params(["alpha"], tmp_path / "s.vtu", {"alpha": np.array([np.nan])}, None)
    with pytest.raises(MeshError, match=r"s\.vtu: parameter 'beta' not found: not in the "
                                        r"file's field_data \(it has: alpha\) and no params\.csv"):
        sample_params(["beta"], tmp_path / "s.vtu", {"alpha": np.array([1.0])}, None)


def test_dataset_samples_carry_params(tmp_path):
    pts, cells = square_mesh(3, "quad")
    for k in range(3):
        write_mesh(tmp_path / f"s{k}.vtu", mesh_from_arrays(pts, cells, {"u": pts[:, 0] + k}))
    _write_table(tmp_path, "csv", {f"s{k}.vtu": {"a": k, "b": 10 * k} for k in range(3)})
    ds = MeshFolderDataset(tmp_path, [], ["u"], params=["b", "a"])
    # float64 whatever the samples' dtype (issue 28: 1.7e9 + 100 a is quantised in float32)
    assert ds[2].params.shape == (1, 2) and ds[2].params.dtype == torch.float64
    assert ds[2].params.tolist() == [[20.0, 2.0]]
    batch = next(iter(DataLoader([ds[0], ds[1], ds[2]], batch_size=3)))
    assert batch.params.shape == (3, 2)                 # the shared contract: [B, K]


# ------------------------------------------------------------------ models
def _sample(n: int, k: int, seed: int) -> MeshData:
    g = torch.Generator().manual_seed(seed)
    return MeshData(pos=torch.rand(n, 2, generator=g), weight=torch.full((n,), 1.0 / n),
                    x=torch.rand(n, 1, generator=g), params=torch.rand(1, k, generator=g))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_params_condition_every_model_per_sample(name, one_thread):
    torch.manual_seed(0)
    model = get_model(name, in_channels=1, out_channels=2, param_channels=3, **CONFIGS[name])
    torch.nn.init.normal_(model.conditioning.film.weight, std=0.5)  # away from identity
    a, b = _sample(30, 3, 1), _sample(40, 3, 2)
    batch = next(iter(DataLoader([a, b], batch_size=2)))
    assert batch.params.shape == (2, 3)
    model.eval()
    out = model(batch)
    assert out.shape == (70, 2)
    # batched = one by one: each sample is modulated by its own parameters
    assert torch.allclose(out[:30], model(a), atol=1e-5) and torch.allclose(out[30:], model(b),
                                                                            atol=1e-5)
    # other parameters, other output; the same parameters, the same output
    c = a.clone()
    c.params = c.params + 1.0
    assert (model(c) - model(a)).abs().max() > 1e-3


@pytest.mark.parametrize("name", list(CONFIGS))
def test_without_params_the_model_is_unchanged(name):
    torch.manual_seed(0)
    plain = get_model(name, in_channels=1, out_channels=2, **CONFIGS[name])
    torch.manual_seed(0)
    zero = get_model(name, in_channels=1, out_channels=2, param_channels=0, **CONFIGS[name])
    torch.manual_seed(0)
    cond = get_model(name, in_channels=1, out_channels=2, param_channels=3, **CONFIGS[name])
    assert plain.conditioning is None and zero.conditioning is None
    assert list(plain.state_dict()) == list(zero.state_dict())
    s = _sample(25, 3, 3)
    # the conditioning is built last (the other weights are the same draws) and
    # starts as the identity: the conditioned model starts as the same function
    for k, v in plain.state_dict().items():
        assert torch.equal(v, cond.state_dict()[k]), k
    assert torch.equal(plain(s), cond(s))


@pytest.mark.parametrize("bad,message", [
    (None, r"data\.params is missing; the model was built with param_channels=3"),
    (torch.zeros(1, 2), r"data\.params must be \[B=1, K=3\], got \(1, 2\)"),
    (torch.tensor([[0.0, float("nan"), 1.0]]), r"data\.params contains NaN or inf"),
])
def test_bad_params_are_refused(bad, message):
    model = get_model("transformer_no", in_channels=1, out_channels=1, param_channels=3,
                      **CONFIGS["transformer_no"])
    s = _sample(10, 3, 0)
    s.params = bad
    with pytest.raises(ValueError, match=message):
        model(s)
    with pytest.raises(ValueError, match=message):
        read_params(s, 3, 1, "cpu")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_params_are_standardised_in_float64(name):
    """Issue 28: parameters were cast to the model's float32 before standardising, so
    1.7e9 + 10 and 1.7e9 + 60 (float32 spacing 128 there) were one parameter. A float32
    model given t = T0 + d with statistics (T0, 50) must equal the same model given d
    with statistics (0, 50), small numbers exact in float32."""
    t0 = 1.7e9
    torch.manual_seed(0)
    model = get_model(name, in_channels=1, out_channels=1, param_channels=1, **CONFIGS[name])
    with torch.no_grad():
        for p in model.conditioning.film.parameters():   # starts as the identity
            p.normal_(0, 0.1)
    norm = model.conditioning.params_normalizer
    norm.std.fill_(50.0)
    norm.fitted.fill_(True)
    model.eval()
    outputs = {}
    for offset in (t0, 0.0):
        norm.mean.fill_(offset)
        for d in (10.0, 60.0):
            s = _sample(25, 1, 0)
            s.params = torch.tensor([[offset + d]], dtype=torch.float64)
            outputs[offset, d] = model(s)
    assert (outputs[0.0, 10.0] - outputs[0.0, 60.0]).abs().max() > 1e-3
    for d in (10.0, 60.0):
        assert torch.allclose(outputs[t0, d], outputs[0.0, d], rtol=1e-5, atol=1e-6), d


def test_param_statistics_are_fitted_on_the_training_samples_and_saved(tmp_path):
    model = get_model("galerkin_transformer", in_channels=1, out_channels=1, param_channels=2,
                      **CONFIGS["galerkin_transformer"])
    samples = [_sample(12, 2, k) for k in range(5)]
    for s in samples:
        s.y = s.x.clone()
    Trainer(model, samples, epochs=1, batch_size=5, progress=False, log=lambda m: None).fit()
    p = torch.cat([s.params for s in samples]).double()
    norm = model.conditioning.params_normalizer
    assert torch.allclose(norm.mean.double(), p.mean(0), atol=1e-6)
    assert torch.allclose(norm.std.double(), p.std(0, unbiased=False), atol=1e-6)
    assert not fit_param_normalizer(model, samples)      # fitted once
    model.save(tmp_path / "m.pt")
    loaded = NeuralOperator.from_checkpoint(tmp_path / "m.pt")
    assert torch.equal(loaded.predict(samples[0]), model.predict(samples[0]))


def test_conditioning_on_inputs_is_conditioning_on_their_means(one_thread):
    """PiT(condition_on_inputs=True) on inputs constant over each mesh is the model
    conditioned on those constants given as ``params`` (same weights, float64), and
    the input part of the statistics is left unscaled (the input normaliser did it)."""
    torch.manual_seed(0)
    on_inputs = get_model("pit", in_channels=2, out_channels=1, condition_on_inputs=True,
                          **CONFIGS["pit"]).double()
    given = get_model("pit", in_channels=2, out_channels=1, param_channels=2,
                      **CONFIGS["pit"]).double()
    given.load_state_dict(on_inputs.state_dict())
    torch.nn.init.normal_(on_inputs.conditioning.film.weight, std=0.5)  # away from identity
    given.conditioning.film.weight.data.copy_(on_inputs.conditioning.film.weight)
    samples = []
    for k, n in enumerate((30, 41)):  # two meshes of different sizes and weights
        g = torch.Generator().manual_seed(k)
        c = torch.rand(1, 2, generator=g, dtype=torch.float64)
        samples.append(MeshData(pos=torch.rand(n, 2, generator=g, dtype=torch.float64),
                                weight=torch.rand(n, generator=g, dtype=torch.float64) + 0.5,
                                x=c.expand(n, 2).clone(), params=c))
    on_inputs.eval(), given.eval()
    batch = next(iter(DataLoader(samples, batch_size=2)))
    ref = given(batch)
    assert (ref - given(MeshData(**{**batch.to_dict(), "params": batch.params + 1}))
            ).abs().max() > 1e-3  # the conditions matter
    torch.testing.assert_close(on_inputs(batch), ref, rtol=1e-12, atol=1e-12)
    for s in samples:  # no params needed: the model reads the inputs
        del s.params
    torch.testing.assert_close(on_inputs(samples[1]), ref[30:], rtol=1e-12, atol=1e-12)
    assert fit_param_normalizer(on_inputs, samples)
    norm = on_inputs.conditioning.params_normalizer
    assert norm.mean.tolist() == [0.0, 0.0] and norm.std.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="condition_on_inputs needs input channels"):
        get_model("pit", in_channels=0, out_channels=1, condition_on_inputs=True)


def test_given_params_and_input_means_are_fitted_apart():
    model = get_model("pit", in_channels=1, out_channels=1, param_channels=2,
                      condition_on_inputs=True, **CONFIGS["pit"])
    assert model.conditioning.param_channels == 3 and model.conditioning.given == 2
    samples = [_sample(12, 2, k) for k in range(5)]
    assert fit_param_normalizer(model, samples)
    p = torch.cat([s.params for s in samples]).double()
    norm = model.conditioning.params_normalizer
    torch.testing.assert_close(norm.mean[:2].double(), p.mean(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm.std[:2].double(), p.std(0, unbiased=False), rtol=1e-6,
                               atol=1e-6)
    assert (norm.mean[2].item(), norm.std[2].item()) == (0.0, 1.0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_family_that_depends_on_the_params_only(name, one_thread):
    # u = p1 phi1 + p2 phi2 on one mesh, no input fields; the bound is the smallest mean
    # relative L2 error of any model without parameters (it predicts one field for all
    # samples), computed exactly (benchmarks.your_data.family)
    samples, bound = family()
    assert 0.3 < bound < 0.7           # the family is far from one fixed field
    errors = {k: fit_family(name, k, samples) for k in (2, 0)}   # with params: 0.03-0.09
    # without parameters every sample gets the same field: never below the bound
    assert errors[0] >= bound * (1 - 1e-6), errors
    # with them the model fits the family well below what any fixed field can reach
    assert errors[2] < bound / 3, (errors, bound)


# ----------------------------------------------------------- command line
def _write_param_folder(root: Path, n: int = 6, table: str = "csv") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pts, cells = square_mesh(4, "triangle")
    rows = {}
    for k in range(n):
        a, b = 1 + 0.2 * k, (-1) ** k * 0.5
        u = a * np.sin(np.pi * pts[:, 0]) + b * pts[:, 1] + 0.1
        write_mesh(root / f"s{k}.vtu", mesh_from_arrays(pts, cells, {"u": u}))
        rows[f"s{k}.vtu"] = {"a": a, "b": b}
    _write_table(root, table, rows)
    return root


SMALL = ["--model", "transformer_no", "--model-config", "width=8", "layers=1", "heads=2",
         "--epochs", "1", "--batch-size", "2"]


@pytest.fixture(scope="module")
def param_run(tmp_path_factory):
    data = _write_param_folder(tmp_path_factory.mktemp("params") / "data")
    out = tmp_path_factory.mktemp("prun") / "run"
    assert cli.main(["train", "--data", str(data), "--inputs", "", "--targets", "u",
                     "--params", "b,a", *SMALL, "--out", str(out)]) == 0
    return data, out


def test_train_records_the_parameters(param_run):
    data, out = param_run
    model = NeuralOperator.from_checkpoint(out / "best.pt")
    assert model.config["param_channels"] == 2
    assert model.metadata["params"] == ["b", "a"]
    import yaml
    assert yaml.safe_load((out / "config.yaml").read_text())["params"] == ["b", "a"]
    # the statistics are those of the training split
    split = model.metadata["split"]["train"]
    table = read_param_table(data)
    p = torch.tensor([[table.value(f, "b"), table.value(f, "a")] for f in split])
    assert torch.allclose(model.conditioning.params_normalizer.mean.double(), p.mean(0).double(),
                          atol=1e-6)


def test_predict_and_evaluate_read_the_parameters(param_run, tmp_path, capsys):
    data, out = param_run
    assert cli.main(["predict", str(out), str(data / "s3.vtu"), "-o", str(tmp_path)]) == 0
    model = NeuralOperator.from_checkpoint(out / "best.pt")
    mesh = read_mesh(data / "s3.vtu")
    s = MeshData(pos=mesh.pos.float(), weight=mesh.weight.float(), x=torch.zeros(len(mesh.pos), 0),
                 params=torch.tensor([[-0.5, 1.6]]))
    written = read_mesh(tmp_path / "s3.vtu")
    assert torch.allclose(written.fields["u_pred"].float(), model.predict(s)[:, 0], atol=1e-6)
    # without its row the mesh cannot be predicted: one line naming file and sample
    other = tmp_path / "other"
    other.mkdir()
    (other / "s3.vtu").write_bytes((data / "s3.vtu").read_bytes())
    (other / "params.csv").write_text("file,a,b\ns9.vtu,1,2\n")
    code = cli.main(["predict", str(out), str(other / "s3.vtu"), "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err)
    assert "params.csv: no entry for the sample 's3.vtu'" in err
    assert cli.main(["evaluate", str(out), "--data", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 6


def test_a_mesh_data_s_own_params_are_used(param_run):
    """Issue 38: predicting a MeshData that carries params looked them up in a params
    table (of the working folder) instead; its own are used, and win, with a warning,
    over other values its file's table gives."""
    data, out = param_run
    run = meshops.load_run(out, "cpu")
    model = NeuralOperator.from_checkpoint(out / "best.pt")
    mesh = read_mesh(data / "s3.vtu")
    ours = torch.tensor([[0.3, 1.2]], dtype=torch.float64)  # b, a: not s3's (-0.5, 1.6)

    def want(params):
        s = MeshData(pos=mesh.pos.float(), weight=mesh.weight.float(),
                     x=torch.zeros(len(mesh.pos), 0), params=params.float())
        return model.predict(s)[:, 0]

    built = MeshData(pos=mesh.pos, weight=mesh.weight, cells=mesh.cells, fields={},
                     params=ours)  # in Python: no file, no table
    got = run.predict(built)["u_pred"].float()
    assert torch.allclose(got, want(ours), atol=1e-6)
    assert not torch.allclose(got, want(torch.tensor([[-0.5, 1.6]])), atol=1e-3)
    mesh.params = ours
    with pytest.warns(UserWarning, match=r"s3\.vtu: MeshData\.params \[0\.3, 1\.2\] differ "
                                         r"from the file's parameters \[-0\.5, 1\.6\] \(b, "
                                         r"a\); using MeshData\.params"):
        got = run.predict(mesh)["u_pred"].float()
    assert torch.allclose(got, want(ours), atol=1e-6)
    built.params = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(MeshError, match=r"MeshData\.params holds \[1\.0, 2\.0, 3\.0\]; the "
                                        r"run takes 2 finite parameter\(s\) \(b, a\)"):
        run.predict(built)


@pytest.mark.parametrize("change,message", [
    ("missing", "params.csv: no entry for the sample 's2.vtu'"),
    ("nan", "params.csv: s2.vtu, column 'a': 'nan' is not finite"),
    ("twice", "params.csv: column 'a' appears twice in the header"),
])
def test_train_refuses_a_bad_parameter_file(tmp_path, capsys, change, message):
    data = _write_param_folder(tmp_path / "data", 4)
    lines = (data / "params.csv").read_text().splitlines()
    if change == "missing":
        lines = [ln for ln in lines if not ln.startswith("s2.vtu")]
    elif change == "twice":
        lines = [ln + (",a" if i == 0 else ",7") for i, ln in enumerate(lines)]
    else:
        lines = [("s2.vtu,nan," + ln.split(",")[2]) if ln.startswith("s2.vtu") else ln
                 for ln in lines]
    (data / "params.csv").write_text("\n".join(lines) + "\n")
    code = cli.main(["train", "--data", str(data), "--inputs", "", "--targets", "u",
                     "--params", "a,b", *SMALL, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err) and message in err, err
    assert not (tmp_path / "run").exists()


def test_params_from_a_config_file(tmp_path, capsys):
    data = _write_param_folder(tmp_path / "data", 4, table="json")
    (tmp_path / "train.yaml").write_text(f"data: {data}\ninputs: []\ntargets: [u]\n"
                                         f"params: [a, b]\n")
    assert cli.main(["train", "--config", str(tmp_path / "train.yaml"), *SMALL, "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "parameters a, b" in captured.err
    import yaml
    assert yaml.safe_load(captured.out)["params"] == ["a", "b"]


def test_export_to_folder_writes_the_parameters(tmp_path):
    from meshops.datasets.folder import export_to_folder

    pts, cells = square_mesh(3, "quad")
    samples = []
    for k in range(3):
        s = mesh_from_arrays(pts, cells, {"u": pts[:, 0] * k})
        s.params = torch.tensor([[0.1 * k, 1 / 3 + k]], dtype=torch.float64)
        samples.append(s)
    export_to_folder(samples, tmp_path, param_names=["a", "b"])
    ds = MeshFolderDataset(tmp_path, [], ["u"], dtype=torch.float64, params=["a", "b"])
    for k in range(3):
        assert torch.equal(ds[k].params, samples[k].params)   # bit for bit
    samples[1].params = torch.zeros(1, 3)
    with pytest.raises(MeshError, match=r"sample 1 has params \[1, 3\], not \[1, 2\]"):
        export_to_folder(samples, tmp_path / "other", param_names=["a", "b"])


def test_every_film_site_of_the_slice_transformer_acts(one_thread):
    # layers + 2 sites: the lifted features, each block's output and the decoder's
    # normalised features, where a parameter can scale the output itself (an answer
    # linear in a load; the norm before the head would undo a scale applied earlier).
    # Each site alone, the others at zero (the identity), must change the output.
    torch.manual_seed(0)
    model = get_model("slice_transformer", in_channels=1, out_channels=2, param_channels=3,
                      width=16, layers=2, heads=2, slices=4).eval()
    film = model.conditioning.film
    a = _sample(30, 3, 1)
    c = a.clone()
    c.params = c.params + 1.0
    assert model.conditioning.sites == 4
    for site in range(4):
        with torch.no_grad():
            film.weight.zero_()
            film.bias.zero_()
            rows = film.weight.view(4, 2, 16, -1)[site]
            rows.normal_(std=0.5)
        assert (model(c) - model(a)).abs().max() > 1e-3, site


def test_film_of_one_sample_is_the_gather_of_its_row():
    # one sample (batch None or all zeros) broadcasts its scale and shift; the value and
    # the gradients must be those of the per-point gather h * (1 + g[b(i)]) + s[b(i)]
    from meshops.models.conditioning import ParamConditioning

    torch.manual_seed(0)
    cond = ParamConditioning(3, 8, sites=2).double()
    torch.nn.init.normal_(cond.film.weight, std=0.5)
    film = cond.embed(torch.rand(1, 3, dtype=torch.float64))            # [1, 2, 2, 8]
    h = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    every = torch.zeros(50, dtype=torch.long)
    for batch in (None, every):
        out = cond(h, film, batch, 1)
        gb = film[:, 1][every]                                           # [N, 2, 8]
        ref = h * (1 + gb[:, 0]) + gb[:, 1]
        assert torch.allclose(out, ref, rtol=0, atol=1e-14)
        g_out = torch.autograd.grad(out.square().sum(), [h, cond.film.weight],
                                    retain_graph=True)
        g_ref = torch.autograd.grad(ref.square().sum(), [h, cond.film.weight],
                                    retain_graph=True)
        for a, b in zip(g_out, g_ref):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_global_inputs_enter_the_slice_transformer_only_through_their_means(one_thread):
    # a channel named in global_inputs is not read at the points: moving its values at
    # the points with the same quadrature mean changes nothing; another mean does
    torch.manual_seed(0)
    model = get_model("slice_transformer", in_channels=2, out_channels=2, width=16,
                      layers=2, heads=2, slices=4, condition_on_inputs=True,
                      global_inputs=[1]).eval()
    torch.nn.init.normal_(model.conditioning.film.weight, std=0.5)   # away from identity
    g = torch.Generator().manual_seed(5)
    n = 40
    base = MeshData(pos=torch.rand(n, 2, generator=g), weight=torch.full((n,), 1.0 / n),
                    x=torch.stack([torch.rand(n, generator=g), torch.full((n,), 2.0)], 1))
    moved = base.clone()
    moved.x[:, 1] = 2.0 + torch.linspace(-1, 1, n)          # the same mean, 2
    other = base.clone()
    other.x[:, 1] = 3.0
    torch.testing.assert_close(model(moved), model(base), rtol=1e-6, atol=1e-6)
    assert (model(other) - model(base)).abs().max() > 1e-3
    # the same model reading the channel at the points sees the move
    torch.manual_seed(0)
    plain = get_model("slice_transformer", in_channels=2, out_channels=2, width=16,
                      layers=2, heads=2, slices=4, condition_on_inputs=True).eval()
    assert (plain(moved) - plain(base)).abs().max() > 1e-4


def test_global_inputs_are_checked():
    with pytest.raises(ValueError, match="set condition_on_inputs=True"):
        get_model("slice_transformer", in_channels=2, out_channels=1, global_inputs=[1])
    with pytest.raises(ValueError, match=r"global_inputs \[2\] are not input channels 0..1"):
        get_model("slice_transformer", in_channels=2, out_channels=1,
                  condition_on_inputs=True, global_inputs=[2])
