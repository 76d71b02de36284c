"""Zero-shot mesh transfer of trained models.

Problem (known solution operator): Gaussian smoothing on the unit square,

    u(x) = ∫ k(x, y) f(y) dy / ∫ k(x, y) dy,    k(x, y) = exp(-|x - y|² / (2 σ²)),  σ = 0.2,

with random smooth inputs ``f(y) = Σ_{k,l<4} a_kl cos(π k y1) cos(π l y2)``,
``a_kl ~ N(0, 1) / (1 + k + l)``. The kernel and the cosines are separable, so ``u`` is
exact to ~1e-12 at any point (1-D Gauss-Legendre in each coordinate).

Each model is trained for a minute or so on coarse perturbed triangulations (12x12 to
16x16 cells, 169-289 points, quadrature weights from ``meshops.quadrature_weights``)
and evaluated, without retraining, on the same test functions on

* fresh meshes of the training resolution,
* meshes refined 4x (48x48 to 64x64 cells, up to 4,225 points),
* a strongly graded 40x40 tensor mesh (spacing ratio ~12 per axis, ~150 in area).

Errors are quadrature-weighted relative L2 norms (the same number on any mesh of the
same functions). The refined/training and graded/training error ratios must stay
<= 1.5: the operator the model learned is a property of the functions, not of the
mesh. A control shows the test can fail: the same trained model fed uniform weights
``1/N`` on the graded mesh (i.e. Monte Carlo attention, quadrature ignored) is far off.

Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

from meshops import MeshData
from meshops.mesh.quadrature import quadrature_weights
from meshops.models import get_model
from meshops.training.loss import relative_lp

K = 4                 # cosine modes per axis
SIGMA = 0.2           # kernel width
_T, _W = np.polynomial.legendre.leggauss(96)
_T, _W = (_T + 1) / 2, _W / 2


def coefficients(rng: np.random.Generator) -> np.ndarray:
    k = np.arange(K)
    return rng.standard_normal((K, K)) / (1.0 + k[:, None] + k[None, :])


def _smoothed_modes(t: np.ndarray) -> np.ndarray:
    """``[N, K]``: ∫_0^1 exp(-(t-s)²/2σ²) cos(π k s) ds for k < K (column 0 is the
    kernel's own integral)."""
    ker = np.exp(-(t[:, None] - _T[None, :]) ** 2 / (2 * SIGMA ** 2)) * _W
    return ker @ np.cos(np.pi * _T[:, None] * np.arange(K))


def fields(pts: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Input ``f`` and exact output ``u`` at the points ``[N, 2]``."""
    k = np.arange(K)
    f = np.einsum("nk,kl,nl->n", np.cos(np.pi * pts[:, :1] * k), a,
                  np.cos(np.pi * pts[:, 1:] * k))
    gx, gy = _smoothed_modes(pts[:, 0]), _smoothed_modes(pts[:, 1])
    u = np.einsum("nk,kl,nl->n", gx, a, gy) / (gx[:, 0] * gy[:, 0])
    return f, u


def tensor_triangulation(xs: np.ndarray, ys: np.ndarray):
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    pts = np.stack([X.ravel(), Y.ravel()], 1)
    idx = np.arange(len(xs) * len(ys)).reshape(len(xs), len(ys))
    q = np.stack([idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]], -1).reshape(-1, 4)
    return pts, np.concatenate([q[:, [0, 1, 2]], q[:, [0, 2, 3]]])


def perturbed_mesh(n: int, rng: np.random.Generator, amount: float = 0.2):
    """``n x n`` cells, interior nodes moved by up to ``amount`` cell sizes.

    ``amount <= 0.2`` keeps every triangle positively oriented (a node and the
    opposite edge approach each other by at most ``4 * amount / sqrt(2) < 1 / sqrt(2)``
    cell sizes, the smallest height); 0.3 turned a few triangles over, and such
    overlapping meshes are refused.
    """
    g = np.linspace(0, 1, n + 1)
    pts, tri = tensor_triangulation(g, g)
    inner = ((pts > 1e-12) & (pts < 1 - 1e-12)).all(1)
    pts[inner] += rng.uniform(-amount, amount, (int(inner.sum()), 2)) / n
    return pts, tri


def graded_mesh(n: int = 40, a: float = 2.5):
    """Tensor mesh clustered at the origin: spacing ratio e^a ~ 12 per axis."""
    g = np.expm1(a * np.linspace(0, 1, n + 1)) / np.expm1(a)
    return tensor_triangulation(g, g)


def sample(mesh, a: np.ndarray) -> MeshData:
    pts, tri = mesh
    f, u = fields(pts, a)
    return MeshData(pos=torch.tensor(pts, dtype=torch.float32),
                    weight=quadrature_weights(pts, [("triangle", tri)]).float(),
                    x=torch.tensor(f, dtype=torch.float32)[:, None],
                    y=torch.tensor(u, dtype=torch.float32)[:, None])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    train = [sample(perturbed_mesh(int(rng.integers(12, 17)), rng), coefficients(rng))
             for _ in range(128)]
    coeffs = [coefficients(rng) for _ in range(16)]
    sizes = [int(rng.integers(12, 17)) for _ in coeffs]
    return {
        "train": train,
        "coarse": [sample(perturbed_mesh(n, rng), a) for n, a in zip(sizes, coeffs)],
        "refined": [sample(perturbed_mesh(4 * n, rng), a) for n, a in zip(sizes, coeffs)],
        "graded": [sample(graded_mesh(), a) for a in coeffs],
    }


pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


# model, config, Adam steps, peak learning rate, training-resolution error bound
MODELS = {
    "transformer_no": (dict(width=32, layers=1, heads=2, pos_encoding=3), 600, 4e-3, 0.10),
    "pit": (dict(width=64, heads=4, num_latent=128), 400, 2e-3, 0.10),
    "pit-sites": (dict(width=64, heads=4, num_latent=128, latent="sites"), 400, 2e-3, 0.10),
    "galerkin_transformer": (dict(width=32, layers=2, heads=2, pos_encoding=3), 1000, 4e-3,
                             0.15),
    "patched_transformer": (dict(width=32, layers=2, heads=2, num_patches=4,
                                 pattern="alternate", pos_encoding=3), 1000, 4e-3, 0.15),
}


def train(model, samples, steps: int, lr: float, batch_size: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.1)
    model.train()
    for _ in range(steps):
        idx = torch.randperm(len(samples), generator=gen)[:batch_size].tolist()
        b = Batch.from_data_list([samples[i] for i in idx])
        loss = relative_lp(model(b), b.y, b.weight, b.batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


@torch.no_grad()
def error(model, samples, uniform: bool = False) -> float:
    """Mean quadrature-weighted relative L2 error; ``uniform`` feeds the model
    weights ``|D|/N`` instead of the mesh's quadrature rule (the error is still
    measured with the true rule)."""
    errs = []
    for s in samples:
        inp = s
        if uniform:
            inp = s.clone()
            inp.weight = torch.full_like(s.weight, float(s.weight.sum()) / s.weight.numel())
        errs.append(float(relative_lp(model(inp), s.y, s.weight)))
    return float(np.mean(errs))


@pytest.mark.parametrize("name", list(MODELS))
def test_zero_shot_transfer_to_refined_and_graded_meshes(name, data):
    cfg, steps, lr, bound = MODELS[name]
    torch.manual_seed(0)
    model = train(get_model(name.split("-")[0], in_channels=1, out_channels=1, **cfg),
                  data["train"], steps, lr)
    e_train = error(model, data["coarse"])
    e_fine = error(model, data["refined"])
    e_graded = error(model, data["graded"])
    e_uniform = error(model, data["graded"], uniform=True)
    print(f"\n{name}: relative L2 at training resolution {e_train:.4f}, 4x refined "
          f"{e_fine:.4f} (ratio {e_fine / e_train:.2f}), graded {e_graded:.4f} "
          f"(ratio {e_graded / e_train:.2f}); graded with uniform weights {e_uniform:.4f} "
          f"(ratio {e_uniform / e_train:.2f})")
    assert e_train < bound, "the model did not learn the operator well enough for the test"
    assert e_fine / e_train <= 1.5
    assert e_graded / e_train <= 1.5
    # control: without the quadrature weights the same model fails on the graded mesh
    assert e_uniform > 2 * e_graded
