"""Library-level checks of field values: non-finite inputs/targets refused by
``assemble`` (naming sample, field and point), and targets that are zero everywhere
(``relative_lp``/``RelativeLpLoss`` refuse them; ``lp_errors``, ``summarize_errors``
and ``Trainer.evaluate`` report the relative error as undefined and give the
absolute error)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _meshes import square_mesh
from torch import nn

from meshops import MeshError
from meshops.mesh.io import mesh_from_arrays
from meshops.models import NeuralOperator, register_model
from meshops.training import (
    RelativeLpLoss,
    Trainer,
    assemble,
    lp_errors,
    relative_lp,
    summarize_errors,
)
from meshops.training.dataset import check_finite_fields
from meshops.training.loss import zero_target

DT = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


def _ragged(seed=0, sizes=(3, 7, 5)):
    g = torch.Generator().manual_seed(seed)
    P = torch.randn(sum(sizes), 2, generator=g, dtype=DT)
    T = torch.randn(sum(sizes), 2, generator=g, dtype=DT)
    W = torch.rand(sum(sizes), generator=g, dtype=DT) + 0.1
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return P, T, W, batch


# ------------------------------------------------------------------ zero targets
def test_relative_loss_refuses_an_all_zero_target():
    """||e|| / 0 is undefined: a ValueError naming the sample of the batch, not
    ||e|| / 1e-12 (a loss of ~1e12 and gradients to match)."""
    P, T, W, batch = _ragged()
    T[batch == 1] = 0.0
    P.requires_grad_()
    with pytest.raises(ValueError, match=r"target of sample 1 of the batch is zero everywhere"):
        relative_lp(P, T, W, batch)
    with pytest.raises(ValueError, match=r"sample 1 .* zero everywhere"):
        RelativeLpLoss(quadrature=False)(P, T, W, batch)
    # a target that is non-zero only at zero-weight points has a zero weighted norm
    T2 = T.clone()
    T2[batch == 1] = 1.0
    W2 = torch.where(batch == 1, torch.zeros_like(W), W)
    with pytest.raises(ValueError, match="sample 1"):
        relative_lp(P, T2, W2, batch)
    assert torch.isfinite(relative_lp(P, T2, None, batch))  # unweighted: defined


def test_lp_errors_match_hand_computation_and_mark_zero_targets():
    P, T, W, batch = _ragged(1)
    T[batch == 2] = 0.0
    res = lp_errors(P, T, W, batch)
    assert res["zero_target"].tolist() == [False, False, True]
    for k in range(3):
        p, t, w = P[batch == k].numpy(), T[batch == k].numpy(), W[batch == k].numpy()
        absolute = math.sqrt(float((w[:, None] * (p - t) ** 2).sum()))
        assert float(res["absolute"][k]) == pytest.approx(absolute, rel=1e-12)
        if k < 2:
            ref = math.sqrt(float((w[:, None] * t ** 2).sum()))
            assert float(res["relative"][k]) == pytest.approx(absolute / ref, rel=1e-12)
    assert math.isnan(float(res["relative"][2]))
    # the defined ones are what relative_lp gives on those samples alone
    keep = batch < 2
    torch.testing.assert_close(res["relative"][:2], relative_lp(P[keep], T[keep], W[keep],
                                                                batch[keep], reduction="none"))


def test_zero_target_tolerance():
    norms = torch.tensor([0.0, 1e-310, 1e-300, 1e-6], dtype=DT)
    # default: zero or below the smallest normal float64 (an underflowed denormal)
    assert zero_target(norms).tolist() == [True, True, False, False]
    assert zero_target(norms, eps=1e-5).tolist() == [True, True, True, True]
    assert zero_target(norms.float()).tolist() == [True, True, True, False]  # float32 tiny


def test_summarize_errors_reports_over_defined_samples_with_the_rest_named():
    st = summarize_errors([0.2, float("nan"), 0.1, 0.4], ["a", "b", "c", "d"])
    assert st["n"] == 3 and st["undefined"] == ["b"]
    assert st["mean"] == pytest.approx(0.7 / 3, rel=1e-15)
    assert st["median"] == 0.2 and st["median_sample"] == "a"
    assert st["max"] == 0.4 and st["worst_sample"] == "d"
    none = summarize_errors([float("nan")], ["z"])
    assert none["mean"] is None and none["worst_sample"] is None and none["undefined"] == ["z"]


# -------------------------------------------------------------- Trainer.evaluate
@register_model("_test_pointwise_fc")
class Pointwise(NeuralOperator):
    """A pointwise linear map of [x, pos]: enough for evaluate()."""

    def __init__(self, in_channels: int = 1, out_channels: int = 1, dim: int = 2) -> None:
        super().__init__()
        self.lin = nn.Linear(in_channels + dim, out_channels)

    def forward(self, data):
        return self.lin(torch.cat([data.x, data.pos.to(data.x.dtype)], -1))


def _meshes(n, zero=()):
    out = []
    for i in range(n):
        pts, cells = square_mesh(3 + i, "triangle", amount=0.2, seed=i)
        a = np.sin(np.pi * pts[:, 0]) + i
        u = np.zeros(len(pts)) if i in zero else a * (1 + pts[:, 1])
        out.append(mesh_from_arrays(pts, cells, {"a": a, "u": u}, source=f"m{i}.vtu"))
    return out


def test_trainer_evaluate_leaves_zero_targets_out_and_reports_absolute_error():
    torch.manual_seed(0)
    train = [assemble(m, ["a"], ["u"], DT) for m in _meshes(3)]
    val = [assemble(m, ["a"], ["u"], DT) for m in _meshes(4, zero=(2,))]
    model = Pointwise().double()
    trainer = Trainer(model, train, val, epochs=1, batch_size=2, progress=False, log=None)
    with pytest.warns(UserWarning, match=r"1 sample\(s\) have a target that is zero "
                                         r"everywhere.*: m2\.vtu"):
        res = trainer.evaluate()
    rel, absolute = [], []
    for s in val:
        pred = model.predict(s).numpy()
        y, w = s.y.numpy(), s.weight.numpy()[:, None]
        absolute.append(math.sqrt(float((w * (pred - y) ** 2).sum())))
        ref = math.sqrt(float((w * y ** 2).sum()))
        if ref > 0:
            rel.append(absolute[-1] / ref)
    assert res["n"] == 4 and res["l2_undefined"] == 1 and len(rel) == 3
    assert res["l2_mean"] == pytest.approx(np.mean(rel), rel=1e-10)
    assert res["l2_max"] == pytest.approx(max(rel), rel=1e-10)
    assert res["abs_l2_mean"] == pytest.approx(np.mean(absolute), rel=1e-10)


# -------------------------------------------------------------- non-finite fields
def test_assemble_refuses_non_finite_fields_naming_sample_field_and_point():
    mesh = _meshes(1)[0]
    mesh.fields["a"][4] = float("nan")
    with pytest.raises(MeshError, match=r"^m0\.vtu: input field 'a' has a non-finite value "
                                        r"\(nan\) at point 4$"):
        assemble(mesh, ["a"], ["u"])
    mesh = _meshes(1)[0]
    mesh.fields["u"][[2, 6]] = float("inf")
    with pytest.raises(MeshError, match=r"^m0\.vtu: target field 'u' has a non-finite value "
                                        r"\(inf\) at point 2 \(2 non-finite values"):
        assemble(mesh, ["a"], ["u"])


def test_check_finite_fields_on_vectors_arrays_and_integers():
    v = np.zeros((5, 3))
    v[3, 2] = -np.inf
    with pytest.raises(MeshError, match=r"^f\.vtu: field 'v' has a non-finite value \(-inf\) "
                                        r"at point 3, component 2$"):
        check_finite_fields({"v": v, "k": np.arange(5)}, ["k", "v"], "f.vtu")
    check_finite_fields({"k": np.arange(5), "v": np.ones((5, 2, 2))}, ["k", "v"], "f.vtu")


def test_values_beyond_the_training_dtype_are_refused_before_the_cast():
    """1e300 is finite in the file (float64) but inf in float32: refused when the sample
    is assembled in float32, naming field and point; accepted in float64."""
    pts, cells = square_mesh(4)
    f = np.ones(len(pts))
    f[3] = 1e300
    mesh = mesh_from_arrays(pts, cells, {"f": f, "u": np.ones(len(pts))}, source="s.vtu")
    with pytest.raises(MeshError, match=r"s\.vtu: input field 'f' has a value \(1e\+300\) at "
                                        r"point 3 beyond the range of torch\.float32"):
        assemble(mesh, ["f"], ["u"], dtype=torch.float32)
    assert bool(torch.isfinite(assemble(mesh, ["f"], ["u"], dtype=torch.float64).x).all())
    with pytest.raises(MeshError, match="beyond the range of torch.float32"):
        check_finite_fields({"f": torch.tensor([1.0, -1e39], dtype=torch.float64)}, ["f"],
                            "a", "input", torch.float32)
