"""meshops.inference.predict: load a run, check a mesh against it, predict and split the
output into named fields, as library calls (the CLI's predict/evaluate use them)."""

import numpy as np
import pytest
import torch
from _meshes import square_mesh

import meshops
from meshops import CheckpointError, MeshError, RunSpec, load_model, predict_mesh
from meshops.mesh.data import MeshData
from meshops.models import get_model


@pytest.fixture
def run(tmp_path):
    """A run folder whose model maps f (scalar) and g (2-vector) to u (2-vector) and
    p (scalar), saved with the metadata meshops train records."""
    torch.manual_seed(0)
    model = get_model("transformer_no", in_channels=3, out_channels=3, pos_dim=2, width=8,
                      layers=1, heads=2).double()
    folder = tmp_path / "run"
    model.save(folder / "best.pt", inputs=["f", "g"], targets=["u", "p"],
               field_shapes={"f": [], "g": [2], "u": [2], "p": []},
               in_channels=3, out_channels=3, pos_dim=2)
    return folder


def _mesh(**drop):
    pts, cells = square_mesh(4, "triangle")
    rng = np.random.default_rng(1)
    n = len(pts)
    fields = {"f": rng.normal(size=n), "g": rng.normal(size=(n, 2))}
    for k in drop:
        fields.pop(k)
    return meshops.mesh_from_arrays(pts, cells, fields, source="case.vtu")


def test_prediction_is_the_models_on_the_named_fields_split_by_shape(run):
    model, ckpt, meta = load_model(run, "cpu")
    assert ckpt == run / "best.pt" and meta["targets"] == ["u", "p"]
    spec = RunSpec(model, ckpt, meta)
    mesh = _mesh()
    spec.check_mesh(mesh, "case.vtu")
    out = predict_mesh(model, spec, mesh)
    # The inputs in the recorded order, f then the two components of g.
    x = torch.cat([mesh.fields["f"].reshape(-1, 1), mesh.fields["g"]], 1).double()
    with torch.no_grad():
        expected = model.predict(MeshData(pos=mesh.pos.double(), weight=mesh.weight.double(),
                                          x=x))
    assert out.shape == (mesh.pos.shape[0], 3)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    fields = spec.split(out)
    assert fields["u"].shape == (mesh.pos.shape[0], 2) and fields["p"].shape == (
        mesh.pos.shape[0],)
    torch.testing.assert_close(fields["u"], out[:, :2], rtol=0, atol=0)
    torch.testing.assert_close(fields["p"], out[:, 2], rtol=0, atol=0)
    assert spec.target_slices() == {"u": slice(0, 2), "p": slice(2, 3)}


def test_a_mesh_without_an_input_field_is_a_mesh_error_naming_it(run):
    model, ckpt, meta = load_model(run, "cpu")
    with pytest.raises(MeshError, match=r"^case\.vtu: input field 'g' not found .*available "
                                        r"point fields: f$"):
        RunSpec(model, ckpt, meta).check_mesh(_mesh(g=True), "case.vtu")


def test_a_mesh_of_another_dimension_is_named_as_such(tmp_path):
    """Issue 38: a 3-D run given a 2-D mesh was refused for the shape of geo:direction
    (computed from the mesh: 2 per point); the dimension is what is wrong."""
    model = get_model("transformer_no", in_channels=3, out_channels=1, pos_dim=3, width=8,
                      layers=1, heads=2).double()
    model.save(tmp_path / "run" / "best.pt", inputs=["geo:direction"], targets=["u"],
               field_shapes={"geo:direction": [3], "u": []}, in_channels=3, out_channels=1,
               pos_dim=3)
    pts, cells = square_mesh(4, "triangle")
    meshops.write_mesh(tmp_path / "case.vtu", meshops.mesh_from_arrays(pts, cells, {}))
    run = meshops.load_run(tmp_path / "run", "cpu")
    with pytest.raises(MeshError) as e:
        run.predict(tmp_path / "case.vtu")
    assert str(e.value) == (f"{tmp_path / 'case.vtu'}: the mesh is 2-D but the model in "
                            f"{tmp_path / 'run' / 'best.pt'} was trained on 3-D meshes")


def test_missing_runs_and_checkpoints_are_named(tmp_path, run):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'nope'}: no such run folder"):
        load_model(tmp_path / "nope")
    (run / "best.pt").rename(run / "last.pt")
    with pytest.raises(FileNotFoundError, match=r"no best\.pt in this run folder; .*last\.pt "
                                                r"holds the latest epoch"):
        load_model(run)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=str(bad)):
        load_model(bad, "cpu")


def test_the_field_names_must_agree_with_the_checkpoint(tmp_path, run):
    model, ckpt, meta = load_model(run, "cpu")
    with pytest.raises(CheckpointError, match="trained with inputs f,g, not f"):
        RunSpec(model, ckpt, meta, inputs=["f"])
    bare = tmp_path / "bare.pt"
    model.save(bare)  # no field metadata
    m2, c2, meta2 = load_model(bare, "cpu")
    with pytest.raises(CheckpointError, match="does not record its inputs"):
        RunSpec(m2, c2, meta2)
    # Given the names, one field per role takes all its channels.
    spec = RunSpec(m2, c2, meta2, inputs=["a"], targets=["b"])
    assert spec.shapes == {"a": [3], "b": [3]}
