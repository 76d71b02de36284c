"""The reduced basis on inputs it did not train on (issue 28): parameters kept in float64
from the file to the regression, validation meshes other than the training mesh
transferred (not compared node by node), parameter fields that vary over a mesh
refused at prediction as in training, and the options of gradient training refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _folders import run_cli
from _meshes import square_mesh
from _tiny_run import one_line_error

from meshops.mesh.io import mesh_from_arrays, read_mesh, write_mesh

pytestmark = pytest.mark.usefixtures("one_thread")

# A timestamp-like parameter: t = T0 + 100 a. In float32 (spacing 128 at 1.7e9) it is
# quantised to a few values over the whole study.
T0 = 1.7e9


def exact(pts, a, b):
    """Linear in the parameters: POD (3 modes) and the spline's linear part are exact."""
    x, y = pts[:, 0], pts[:, 1]
    return a * np.sin(np.pi * x) + b * x * y + 1.0


def write_study(root: Path, params: np.ndarray, how: str, n: int = 6,
                amount: float = 0.0) -> Path:
    """One mesh file per row ``(a, b)`` of ``params``, with u; the parameters t = T0 + 100 a
    and b as constant fields (``how="fields"``) or in params.csv (``"csv"``); the unit
    square in n x n cells (interior points moved by up to ``amount`` cells)."""
    root.mkdir(parents=True, exist_ok=True)
    pts, cells = square_mesh(n, "triangle", amount=amount, seed=3)
    rows = ["file,t,b"]
    for k, (a, b) in enumerate(params):
        fields = {"u": exact(pts, a, b)}
        if how == "fields":
            fields.update(t=np.full(len(pts), T0 + 100 * a), b=np.full(len(pts), b))
        rows.append(f"s{k:02d}.vtu,{float(T0 + 100 * a)!r},{float(b)!r}")
        write_mesh(root / f"s{k:02d}.vtu", mesh_from_arrays(pts, cells, fields))
    if how == "csv":
        (root / "params.csv").write_text("\n".join(rows) + "\n")
    return root


def draw(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform([0.0, -1.0], [1.0, 1.0], (n, 2))


def train_args(data: Path, out: Path, how: str, *extra) -> list:
    given = ["--inputs", "t,b"] if how == "fields" else ["--inputs", "", "--params", "t,b"]
    return ["train", "--data", data, *given, "--targets", "u", "--model", "reduced_basis",
            "--model-config", "regressors=rbf", "--out", out, *extra]


# ---------------------------------------------------------------- float64
@pytest.mark.parametrize("how", ["fields", "csv"])
def test_a_timestamp_like_parameter_is_not_quantised(tmp_path, capsys, how):
    """The family is linear in (t, b), so the reduced basis (3 modes, the spline's linear
    part) reproduces it to round-off; in float32 t took a handful of values and the
    validation error was 0.1. Trained and predicted: within 1e-6."""
    data = write_study(tmp_path / "data", draw(12, 0), how)
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, train_args(data, run, how))
    assert code == 0, err
    history = json.loads((run / "history.json").read_text())
    assert history["candidates"][0]["val_l2_mean"] < 1e-6, history
    test = write_study(tmp_path / "test", draw(3, 1), how)
    code, _, err = run_cli(capsys, ["predict", run, test, "-o", tmp_path / "pred"])
    assert code == 0, err
    for k in range(3):
        got = read_mesh(tmp_path / "pred" / f"s{k:02d}.vtu").fields
        u, pred = got["u"].numpy(), got["u_pred"].numpy()
        assert np.linalg.norm(pred - u) < 1e-6 * np.linalg.norm(u)


# ---------------------------------------------------------------- varying fields
def test_a_parameter_field_that_varies_over_the_mesh_is_refused(tmp_path, capsys):
    """Training refuses such data; predict and evaluate averaged the field silently.
    Now both refuse in one line naming the file and the field, and write nothing; the
    model itself refuses such a sample too."""
    import torch

    from meshops.models import NeuralOperator

    data = write_study(tmp_path / "data", draw(12, 0), "fields")
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, train_args(data, run, "fields"))
    assert code == 0, err
    test = write_study(tmp_path / "test", draw(12, 0)[3:4], "fields")   # a training sample
    mesh = read_mesh(test / "s00.vtu")
    b = mesh.fields["b"].numpy().copy()
    b[::2] += 0.01                                   # no longer one value over the mesh
    write_mesh(test / "s00.vtu", mesh, point_data={"b": b})
    for argv in (["predict", run, test, "-o", tmp_path / "pred"],
                 ["evaluate", run, "--data", test]):
        code, out, err = run_cli(capsys, argv)
        assert code == 2 and one_line_error(err), err
        assert f"{test / 's00.vtu'}: input field 'b' varies over the mesh" in err
    assert not (tmp_path / "pred").exists()
    model = NeuralOperator.from_checkpoint(run / "best.pt")
    from meshops.datasets.folder import add_inputs_targets

    sample = add_inputs_targets(read_mesh(test / "s00.vtu"), ["t", "b"], ["u"], torch.float64)
    with pytest.raises(ValueError, match="input channel 1 varies over sample 0"):
        model.predict(sample)


# ---------------------------------------------------------------- other meshes
def _sample(path: Path):
    import torch

    from meshops.datasets.folder import add_inputs_targets

    return add_inputs_targets(read_mesh(path), ["t", "b"], ["u"], torch.float64)


def _relative(pred, s) -> float:
    w = s.weight[:, None]
    return float(((w * (pred - s.y) ** 2).sum() / (w * s.y ** 2).sum()).sqrt())


@pytest.mark.parametrize("mesh", ["moved", "finer"])
def test_validation_on_another_mesh_is_transferred(tmp_path, capsys, mesh):
    """--val-data on the same square meshed otherwise: with the same point count the
    snapshots were compared node by node (error 1.57), with another a traceback. Now
    the candidates are scored on the validation meshes' own points (the basis carried
    over by moving least squares), as predict would; the refit uses the samples on the
    training mesh alone."""
    from meshops.models import NeuralOperator

    data = write_study(tmp_path / "data", draw(12, 0), "fields")
    val = write_study(tmp_path / "val", draw(4, 1), "fields",
                      **({"amount": 0.25} if mesh == "moved" else {"n": 9}))
    run = tmp_path / "run"
    code, out, err = run_cli(capsys, train_args(data, run, "fields", "--val-data", val))
    assert code == 0, err
    assert "refitted on the 12 samples on the training mesh (the 4 validation samples " \
           "are on other meshes)" in out
    history = json.loads((run / "history.json").read_text())
    model = NeuralOperator.from_checkpoint(run / "best.pt")
    expected = [_relative(model.predict(s), s)
                for s in map(_sample, sorted(val.glob("*.vtu")))]
    assert np.allclose(history["candidates"][0]["val_l2"], expected, rtol=1e-6, atol=0)
    assert max(expected) < 0.05          # the transfer's error, not a node-by-node mismatch


def test_a_grid_basis_refuses_a_validation_grid_of_another_size():
    """A basis of structured grids matches nodes by index: another point count has no
    meaning for it, and is refused naming the sample."""
    import torch

    from meshops.fitting.reduced_basis import fit_reduced_basis

    def grids(params, n, moved):
        out = []
        for k, (a, b) in enumerate(params):
            pts, cells = square_mesh(n, "triangle", amount=0.2 if moved else 0.0, seed=k)
            fields = {"t": np.full(len(pts), a), "b": np.full(len(pts), b),
                      "u": exact(pts, a, b)}
            from meshops.datasets.folder import add_inputs_targets

            s = add_inputs_targets(mesh_from_arrays(pts, cells, fields), ["t", "b"], ["u"],
                                   torch.float64, source=f"grid{n}-{k}")
            s.grid_shape = (n + 1, n + 1)
            out.append(s)
        return out

    train = grids(draw(10, 0), 6, True)
    with pytest.raises(ValueError, match=r"grid8-0: .*matches structured grids node by node: "
                                         r"it needs 49 points, got 81"):
        fit_reduced_basis(train, grids(draw(3, 1), 8, True), regressors=("rbf",))


# ---------------------------------------------------------------- options
def test_the_run_config_of_a_reduced_basis_is_its_own_options(tmp_path, capsys):
    """config.yaml recorded the model's internals (rank, num_points, ...) as
    model_config: as --config it was refused, and the same --model-config on the run
    folder was "another config". It now holds the options as given, with the MLP
    ensemble's size when the budget chose it, and reads back as itself."""
    import yaml

    data = write_study(tmp_path / "data", draw(12, 0), "fields")
    run = tmp_path / "run"
    args = train_args(data, run, "fields")
    code, _, err = run_cli(capsys, args)
    assert code == 0, err
    config = run / "config.yaml"
    assert yaml.safe_load(config.read_text())["model_config"] == {"regressors": "rbf"}
    code, out, err = run_cli(capsys, ["train", "--config", config, "--dry-run"])
    assert code == 0, err
    assert out == config.read_text()
    # a run that stopped before its model was written: the same command relaunches it
    for name in ("best.pt", "history.json"):
        (run / name).unlink()
    code, _, err = run_cli(capsys, args)
    assert code == 0, err


@pytest.mark.parametrize("flag", [["--ensemble", "3"], ["--amp", "bf16"], ["--compile"],
                                  ["--logger", "mlflow"], ["--checkpoint-blocks"]])
def test_options_of_gradient_training_are_refused_for_a_reduced_basis(tmp_path, capsys,
                                                                         flag):
    """They were recorded in config.yaml and silently ignored."""
    data = write_study(tmp_path / "data", draw(12, 0), "fields")
    code, out, err = run_cli(capsys, train_args(data, tmp_path / "run", "fields", *flag))
    assert code == 2 and one_line_error(err), err
    assert f"{flag[0]} does not apply to reduced_basis" in err
    assert not (tmp_path / "run").exists()


def test_logger_none_is_taken_for_a_reduced_basis(tmp_path, capsys):
    """Issue 38: --logger none was refused for a reduced basis; it asks for what the
    basis does anyway, nothing logged."""
    from meshops.models import NeuralOperator

    data = write_study(tmp_path / "data", draw(12, 0), "fields")
    code, out, err = run_cli(capsys, train_args(data, tmp_path / "run", "fields",
                                                "--logger", "none"))
    assert code == 0, err
    assert NeuralOperator.from_checkpoint(tmp_path / "run" / "best.pt").model_name == \
        "reduced_basis"
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_one_training_sample_is_called_one_training_sample(tmp_path, capsys):
    data = write_study(tmp_path / "data", draw(2, 0), "fields")
    code, _, err = run_cli(capsys, train_args(data, tmp_path / "run", "fields",
                                              "--val-fraction", "0.5"))
    assert code == 2 and one_line_error(err), err
    assert "one training sample" in err and "the same in every sample" not in err


def test_a_parameter_given_twice_counts_once():
    """Parameters given both as params and as constant input fields (a benchmark's
    params.json beside its fields): now that a constant field's mean is its value
    exactly, the two columns are equal, and a spline on both is singular. The repeat is
    dropped: the spline reproduces the linear family to round-off, and POD + RBF too."""
    import torch

    from meshops.datasets.folder import add_inputs_targets
    from meshops.fitting.reduced_basis import fit_reduced_basis
    from meshops.reduced.parameters import informative_columns
    from meshops.training.baselines import pod_rbf_baseline

    def both(params):
        pts, cells = square_mesh(6, "triangle")
        out = []
        for a, b in params:
            fields = {"a": np.full(len(pts), a), "b": np.full(len(pts), b),
                      "u": exact(pts, a, b)}
            out.append(add_inputs_targets(mesh_from_arrays(pts, cells, fields), ["a", "b"],
                                          ["u"], torch.float64,
                                          params=torch.tensor([[a, b]], dtype=torch.float64)))
        return out

    train, val = both(draw(10, 0)), both(draw(3, 1))
    p = torch.tensor([[1.0, 2.0, 1.0, 5.0], [2.0, 2.0, 2.0, 3.0], [4.0, 2.0, 4.0, 1.0]])
    assert informative_columns(p) == [0, 3]      # 1: constant, 2: column 0 again
    _, report = fit_reduced_basis(train, val, regressors=("rbf",))
    assert [c.name for c in report.candidates] == ["rbf"]
    assert report.candidates[0].mean < 1e-8
    base = pod_rbf_baseline(train, val)
    assert base.available and max(base.errors["l2"]) < 1e-8, base.note
