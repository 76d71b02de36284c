"""Training does not depend on the units of the fields (issue 20, item 4): the
normaliser's floor is relative and the relative loss is computed on scaled values, so a
target or input of order 1e-9 or 1e-20 (or 1e20) trains exactly like the same field of
order 1, and a field float32 cannot hold says that float32 is the limit and how to
train in float64."""

from __future__ import annotations

import json

import pytest
import torch
from _folders import run_cli, tiny_model, tiny_samples, train, write_folder

from meshops.datasets.normalizer import UnitGaussianNormalizer
from meshops.mesh.data import MeshData
from meshops.training import Trainer, relative_lp

pytestmark = pytest.mark.usefixtures("one_thread")

# Powers of two: scaling by them is exact in floating point, so a scale-free pipeline
# gives the very same numbers, and any difference is the pipeline's.
TINY, TINIER, HUGE = 2.0 ** -30, 2.0 ** -66, 2.0 ** 66   # ~9e-10, ~1.4e-20, ~7e19


@pytest.mark.parametrize("scale", [TINY, TINIER, HUGE])
def test_normaliser_is_scale_free(scale):
    torch.manual_seed(0)
    x = torch.randn(50, 3, dtype=torch.float64) * torch.tensor([1.0, 0.3, 2.0]) + 0.5
    w = torch.rand(50, dtype=torch.float64)
    plain = UnitGaussianNormalizer(3).fit([MeshData(x=x, weight=w)], "x")
    scaled = UnitGaussianNormalizer(3).fit([MeshData(x=x * scale, weight=w)], "x")
    assert torch.equal(scaled.encode(x * scale), plain.encode(x))
    z = torch.randn(20, 3, dtype=torch.float64)
    assert torch.equal(scaled.decode(z), plain.decode(z) * scale)


def test_normaliser_floor_maps_constant_and_zero_channels_to_zero():
    x = torch.tensor([[3.0, 0.0], [3.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    n = UnitGaussianNormalizer(2).fit([MeshData(x=x, weight=torch.ones(3))], "x")
    assert torch.equal(n.encode(x), torch.zeros_like(x))
    assert n.std.tolist() == pytest.approx([3e-6, 1.0])


def test_scaled_norms_equal_the_plain_formula_in_float64():
    """lp_norms divides by each sample's largest value and multiplies back: the same
    numbers as sqrt(sum_i w_i |e_i|^2) computed plainly."""
    from meshops.training.loss import lp_norms

    g = torch.Generator().manual_seed(3)
    y = torch.randn(30, 3, dtype=torch.float64, generator=g) * 7
    pred = y + torch.randn(30, 3, dtype=torch.float64, generator=g)
    w = torch.rand(30, dtype=torch.float64, generator=g)
    b = torch.tensor([0] * 10 + [1] * 20)
    num, den = lp_norms(pred, y, w, b)
    for k, rows in enumerate((slice(0, 10), slice(10, 30))):
        e, t, wk = (pred - y)[rows].numpy(), y[rows].numpy(), w[rows].numpy()
        assert num[k].item() == pytest.approx(float((wk * (e ** 2).sum(1)).sum() ** 0.5),
                                              rel=1e-14)
        assert den[k].item() == pytest.approx(float((wk * (t ** 2).sum(1)).sum() ** 0.5),
                                              rel=1e-14)


@pytest.mark.parametrize("scale", [TINIER, 2.0 ** -120, HUGE, 2.0 ** 120])
def test_relative_loss_is_the_same_number_at_every_magnitude_float32_holds(scale):
    torch.manual_seed(1)
    y = torch.randn(40, 2)
    pred = y + 0.1 * torch.randn(40, 2)
    w, b = torch.rand(40), torch.arange(40) // 20
    ref = relative_lp(pred, y, w, b, reduction="none")
    got = relative_lp(pred * scale, y * scale, w, b, reduction="none")
    assert torch.allclose(got, ref, rtol=1e-6, atol=0)
    # and the gradient of the scaled problem is the scaled gradient
    p1, p2 = pred.clone().requires_grad_(), (pred * scale).requires_grad_()
    relative_lp(p1, y, w, b).backward()
    relative_lp(p2, y * scale, w, b).backward()
    assert torch.allclose(p2.grad * scale, p1.grad, rtol=1e-5, atol=0)


def _history(capsys, tmp_path, name, **scales):
    data = write_folder(tmp_path / f"d{name}", n=6, **scales)
    code, _, err = run_cli(capsys, ["train", "--data", data, "--inputs", "f", "--targets", "u",
                                    "--model", "transformer_no", "--model-config", "width=8",
                                    "layers=1", "heads=2", "--epochs", "3", "--batch-size",
                                    "2", "--seed", "1", "--threads", "1",
                                    "--out", tmp_path / f"r{name}"])
    assert code == 0, err
    hist = json.loads((tmp_path / f"r{name}" / "history.json").read_text())
    return [v for h in hist for v in (h["train_loss"], h["val_l2"])]


def test_tiny_and_huge_fields_train_exactly_like_order_one(tmp_path, capsys):
    ref = _history(capsys, tmp_path, "1")
    assert ref[-1] < 1.5
    for name, kw in (("t", {"scale": TINY}), ("tt", {"scale": TINIER, "input_scale": TINIER}),
                     ("h", {"scale": HUGE})):
        got = _history(capsys, tmp_path, name, **kw)
        assert got == pytest.approx(ref, rel=1e-5), name


def test_a_target_below_float32_says_float32_is_the_limit(tmp_path, capsys):
    data = write_folder(tmp_path / "d", n=4, scale=1e-44)
    code, _, err = train(capsys, data, tmp_path / "r")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{data / 's0.vtu'}: target field 'u' is at most" in err
    assert "below the normal range of torch.float32" in err and "--dtype float64" in err
    assert not (tmp_path / "r").exists()
    code, _, err = train(capsys, data, tmp_path / "r64", "--dtype", "float64")
    assert code == 0, err


def test_an_overflowing_loss_names_float32_when_the_data_are_near_its_limit():
    model = tiny_model()
    inf_loss = (lambda pred, y, w, b: (pred * 0).sum() + float("inf"))
    for scale, hint in ((1.0, "lower lr"), (1e37, "train in float64")):
        data = tiny_samples(2, scale=scale)
        tr = Trainer(model, data, epochs=1, batch_size=2, loss=inf_loss, progress=False,
                     log=None)
        with pytest.raises(FloatingPointError, match=hint):
            tr.fit()
