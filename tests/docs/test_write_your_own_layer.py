"""A new layer is one copied file (README, "Write your own layer"): copy
``examples/layer_template.py``, rename its class, and the layer has the flat, cross,
dense, validated and compiled forms of every meshops layer.  Checked numerically:
against a written-out sum, and as a quadrature of a Gaussian integral known in closed
form (second-order convergence of the midpoint rule)."""

import importlib.util
import math
import pathlib
import shutil
import sys

import pytest
import torch

from meshops.nn import batch_points

DT = torch.float64
TEMPLATE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "layer_template.py"


@pytest.fixture(scope="module")
def MyLayer(tmp_path_factory):
    """The template copied to a new module and its class renamed, as a user would."""
    path = tmp_path_factory.mktemp("user") / "my_layer.py"
    shutil.copy(TEMPLATE, path)
    path.write_text(path.read_text().replace("GaussianIntegral", "MyLayer"))
    spec = importlib.util.spec_from_file_location("my_layer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_layer"] = module          # an ordinary import (torch.compile needs it)
    spec.loader.exec_module(module)
    yield module.MyLayer
    del sys.modules["my_layer"]


def _identity_layer(cls, sigma):
    """One channel, one head, W_V = W_O = 1: the layer is the bare kernel integral."""
    layer = cls(1, 1, heads=1, sigma=sigma).to(DT)
    with torch.no_grad():
        for lin in (layer.lin_v, layer.lin_out):
            lin.weight.fill_(1.0)
            lin.bias.zero_()
    return layer


def _grid(n):
    """Midpoints of an n x n grid on the unit square, each with weight 1/n^2."""
    t = (torch.arange(n, dtype=DT) + 0.5) / n
    pos = torch.cartesian_prod(t, t)
    return pos, torch.full((n * n,), 1.0 / (n * n), dtype=DT)


def _gaussian_integral(x, sigma):
    """int_{[0,1]^2} exp(-|x - y|^2 / (2 sigma^2)) dy, a product of error functions."""
    s = math.sqrt(2) * sigma
    per_axis = math.sqrt(math.pi / 2) * sigma * (torch.erf((1 - x) / s) + torch.erf(x / s))
    return per_axis.prod(-1)


def test_copied_layer_is_a_quadrature_of_the_integral(MyLayer):
    sigma = 0.2
    layer = _identity_layer(MyLayer, sigma)
    x_dst = torch.tensor([[0.5, 0.5], [0.1, 0.3], [0.9, 0.95]], dtype=DT)
    exact = _gaussian_integral(x_dst, sigma)
    errors = []
    for n in (16, 32, 64):
        pos, w = _grid(n)
        u = torch.ones(n * n, 1, dtype=DT)
        out = layer((u, torch.zeros(3, 1, dtype=DT)), (pos, x_dst), w)[:, 0]
        errors.append((out - exact).abs().max().item())
    # midpoint rule: error ~ h^2 |f''| / 24 per unit area with |f''| <= 1 / sigma^2
    assert errors[-1] <= (1 / 64) ** 2 / (24 * sigma ** 2)
    assert errors[0] / errors[1] > 3.5 and errors[1] / errors[2] > 3.5   # second order


def test_copied_layer_matches_a_written_out_sum(MyLayer):
    torch.manual_seed(0)
    layer = MyLayer(3, 4, heads=2, sigma=[0.1, 0.4]).to(DT)
    g = torch.Generator().manual_seed(1)
    sizes = [6, 9]
    batch = torch.arange(2).repeat_interleave(torch.tensor(sizes))
    pos = torch.rand(15, 2, generator=g, dtype=DT)
    w = torch.rand(15, generator=g, dtype=DT)
    x = torch.randn(15, 3, generator=g, dtype=DT)
    out = layer(x, pos, w, batch)
    v = layer.lin_v(x).view(15, 2, 2)
    ref = torch.zeros(15, 4, dtype=DT)
    for i in range(15):
        for h, s in enumerate((0.1, 0.4)):
            for j in range(15):
                if batch[j] == batch[i]:
                    k = math.exp(-float(((pos[i] - pos[j]) ** 2).sum()) / (2 * s * s))
                    ref[i, 2 * h:2 * h + 2] += w[j] * k * v[j, h]
    ref = layer.lin_out(ref)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    # the base's other forms give the same numbers
    pts = batch_points(pos, w, batch)
    torch.testing.assert_close(layer(x, pts), out, rtol=0, atol=0)
    dense = layer.dense(pts.to_dense(x), pts.to_dense(pos), pts.to_dense(w), pts.mask)
    torch.testing.assert_close(pts.to_flat(dense), out, rtol=0, atol=1e-12)
    torch._dynamo.reset()
    compiled = torch.compile(lambda: layer(x, pts), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(), out, rtol=0, atol=1e-12)
    assert repr(layer) == "MyLayer(3, 4, heads=2, sigma=[0.1, 0.4])"
    with pytest.raises(ValueError, match="needs the positions"):
        layer(x, None, w, batch)
