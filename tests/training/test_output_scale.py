"""Outputs scaled by a global input (issue 37, item 2): where the targets are
proportional to an input constant over each mesh (a load), the output normaliser is
fitted on the targets per unit of it and the model's outputs are multiplied by it, so
a family linear in the load becomes one that does not depend on it."""

from __future__ import annotations

import pytest
import torch
from _meshes import square_mesh

from meshops.datasets.normalizer import UnitGaussianNormalizer, decode_outputs, output_scale
from meshops.mesh.io import mesh_from_arrays
from meshops.training import Trainer, assemble, fit_normalizers


def _loaded(k: int, load: float):
    """Unit square k with a field input f, a load c constant over it, and the target
    u = c * (f * y + x^2 / 2): linear in the load."""
    import numpy as np

    pts, cells = square_mesh(5, "triangle", amount=0.2, seed=k)
    x, y = pts[:, 0], pts[:, 1]
    f = np.sin((1 + 0.3 * k) * np.pi * x) * np.cos(np.pi * y)
    mesh = mesh_from_arrays(pts, cells, {"f": f, "c": np.full(len(x), load),
                                         "u": load * (f * y + 0.5 * x ** 2)})
    return assemble(mesh, ["f", "c"], ["u"], torch.float64)


def test_the_normaliser_of_scaled_outputs_is_the_one_per_unit_load():
    """Fitted with scale_by, the statistics are those of the targets divided by the
    load: the same as for the same meshes at load 1."""
    loaded = [_loaded(k, c) for k, c in enumerate([0.5, 2.0, 7.0])]
    unit = [_loaded(k, 1.0) for k in range(3)]
    _, per_load = fit_normalizers(loaded, scale_by=1)
    _, plain = fit_normalizers(unit)
    torch.testing.assert_close(per_load.mean, plain.mean.to(per_load.mean.dtype))
    torch.testing.assert_close(per_load.std, plain.std.to(per_load.std.dtype))
    assert int(per_load.scale_by) == 1 and int(plain.scale_by) == -1
    with pytest.raises(ValueError, match="scale_by=2 is not one of the 2 input channels"):
        fit_normalizers(loaded, scale_by=2)
    with pytest.raises(ValueError, match="input channel 1, which is 0 there"):
        fit_normalizers([_loaded(0, 0.0)], scale_by=1)


def test_outputs_take_each_samples_load_at_nodes_and_queries():
    norm = UnitGaussianNormalizer(1).set_scale_by(1)
    model = torch.nn.Module()
    model.output_normalizer = norm
    x = torch.tensor([[0.1, 2.0], [0.2, 2.0], [0.3, 5.0]])
    y = torch.ones(3, 1)
    torch.testing.assert_close(decode_outputs(model, y, output_scale(model, x, 3)),
                               torch.tensor([[2.0], [2.0], [5.0]]))
    # two query points of sample 1, one of sample 0
    s = output_scale(model, x, 3, torch.tensor([0, 0, 1]), torch.tensor([1, 1, 0]))
    torch.testing.assert_close(s, torch.tensor([[5.0], [5.0], [2.0]]))
    model.output_normalizer = UnitGaussianNormalizer(1)
    assert output_scale(model, x, 3) is None


def test_a_model_trained_per_unit_load_predicts_any_load_exactly_as_it_scales(tmp_path):
    """The network sees the load as an input yet predicts per unit load: its
    prediction at load c is c times its prediction per unit, to rounding, whatever
    c (also far outside the training loads); saved and loaded, it still scales."""
    from meshops.models import NeuralOperator, get_model

    torch.manual_seed(0)
    model = get_model("transformer_no", in_channels=2, out_channels=1, pos_dim=2, width=8,
                      layers=1, heads=2).double()
    train = [_loaded(k, c) for k, c in enumerate([0.5, 1.0, 2.0, 4.0])]
    Trainer(model, train, train[:1], epochs=2, batch_size=2, normalize=1, progress=False,
            log=None, out_dir=tmp_path).fit()
    assert int(model.output_normalizer.scale_by) == 1
    # the same mesh at two loads: the per-unit network differs only through its input c
    a, b = _loaded(7, 1.0), _loaded(7, 1.0)
    b.x = b.x.clone()
    b.x[:, 1] = 30.0
    pa, pb = model.predict(a), model.predict(b)
    net_a = model.output_normalizer.decode(model(_encoded(model, a)))
    net_b = model.output_normalizer.decode(model(_encoded(model, b)))
    torch.testing.assert_close(pa, net_a)
    torch.testing.assert_close(pb, 30.0 * net_b)
    model.save(tmp_path / "model.pt")
    loaded = NeuralOperator.from_checkpoint(tmp_path / "model.pt")
    torch.testing.assert_close(loaded.double().predict(b), pb)


def _encoded(model, data):
    from meshops.datasets.normalizer import encode_inputs

    d = data.clone()
    d.x = encode_inputs(model, data.x)
    return d


def test_a_model_saved_before_scale_by_loads_and_predicts_as_it_did(tmp_path):
    from meshops.models import NeuralOperator, get_model

    torch.manual_seed(0)
    model = get_model("transformer_no", in_channels=2, out_channels=1, pos_dim=2, width=8,
                      layers=1, heads=2).double()
    model.set_normalizers(*fit_normalizers([_loaded(k, 1.0 + k) for k in range(3)]))
    state = model.checkpoint_state()
    state["state_dict"] = {k: v for k, v in state["state_dict"].items()
                           if not k.endswith("scale_by")}
    torch.save(state, tmp_path / "old.pt")
    old = NeuralOperator.from_checkpoint(tmp_path / "old.pt").double()
    assert old.output_normalizer.scale_channel == -1
    torch.testing.assert_close(old.predict(_loaded(5, 3.0)), model.predict(_loaded(5, 3.0)))


def test_a_checkpoint_from_before_scale_by_loads_scaling_by_nothing():
    norm = UnitGaussianNormalizer(2)
    state = {k: v for k, v in norm.state_dict().items() if k != "scale_by"}
    again = UnitGaussianNormalizer(2).set_scale_by(0)
    again.load_state_dict(state)
    assert int(again.scale_by) == -1 and again.scale_channel == -1
    again.load_state_dict(UnitGaussianNormalizer(2).set_scale_by(1).state_dict())
    assert again.scale_channel == 1


def test_meshops_train_scales_by_a_load_the_targets_are_proportional_to(tmp_path):
    """A folder of meshes whose target is linear in a load: the run's model learns it
    per unit load (its output normaliser scales by the load's channel), and says so;
    without the load in the targets, it does not."""
    import numpy as np

    import meshops
    from meshops.inference.predict import load_model
    from meshops.mesh.io import write_mesh

    def folder(name, linear):
        root = tmp_path / name
        root.mkdir()
        for k, c in enumerate(np.linspace(0.5, 3.0, 8)):
            pts, cells = square_mesh(4, "triangle", amount=0.2, seed=k)
            f = np.sin((1 + 0.3 * k) * np.pi * pts[:, 0])
            u = (c if linear else 1.0) * (f * pts[:, 1] + 0.5 * pts[:, 0] ** 2 + 1)
            write_mesh(root / f"s{k}.vtu",
                       mesh_from_arrays(pts, cells, {"f": f, "c": np.full(len(f), c),
                                                     "u": u, "v": 2 * u}))
        return root

    for linear, expect in ((True, 1), (False, -1)):
        data = folder(f"linear{linear}", linear)
        meshops.fit(data, ["f", "c"], ["u", "v"], out=tmp_path / f"run{linear}", epochs=1,
                    model="slice_transformer", model_config={"width": 8, "layers": 1,
                                                            "heads": 2, "slices": 4},
                    verbose=False)
        model = load_model(tmp_path / f"run{linear}")[0]
        assert model.output_normalizer.scale_channel == expect
