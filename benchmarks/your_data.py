"""``python -m benchmarks.your_data``: the figures of ``docs/your-data.md``.

1. **Midpoint rule on cells** (:mod:`meshops.mesh.cells`): the error of ``sum_c |K_c|
   f(x_c)`` against the exact integral of ``f = exp(x) sin(pi y)`` (2-D) and ``exp(x)
   sin(pi y) cos(z)`` (3-D) on randomly distorted meshes of the unit square / cube
   (the generators of ``tests/_meshes.py``), refined 4 -> 32 (2-D) and 2 -> 8 (3-D)
   cells per side, and the observed order (least-squares slope).
2. **Parameter conditioning** (:mod:`meshops.models.conditioning`): a family whose
   target depends on the parameters only, ``u = p1 sin(pi x) sin(pi y) + p2 (x - 1/2)``
   on one 49-node mesh, no input fields, 12 samples; each model with and without
   ``param_channels=2``, 150 full-batch Adam steps at 1e-2 (seed 0, one thread); the
   mean relative L2 error (quadrature-weighted) against the smallest error any model
   without parameters can reach (one field for all samples: the minimum over the span
   of the two modes). ``tests/datasets/test_params.py`` runs the same fit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

# Small configurations of the four models for the conditioning fit (in/out channels
# given per call); PiT's latent mesh is the input points (49), whose balls of 10 % of
# the measure resolve the two modes.
CONFIGS = {
    "pit": dict(width=32, heads=2, blocks=1, latent="input", quantile_in=0.1, quantile_out=0.1),
    "transformer_no": dict(width=32, layers=1, heads=2),
    "galerkin_transformer": dict(width=32, layers=1, heads=2),
    "patched_transformer": dict(width=32, layers=1, heads=2, num_patches=2),
}


def _meshes():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import _meshes

    return _meshes


def midpoint_orders() -> list[tuple[str, list[int], list[float], float]]:
    """``(mesh, sizes, errors, order)`` of the midpoint rule on cells."""
    from meshops.mesh.cells import cell_points
    from meshops.mesh.io import mesh_from_arrays

    m = _meshes()
    f2 = lambda p: np.exp(p[:, 0]) * np.sin(np.pi * p[:, 1])  # noqa: E731
    f3 = lambda p: f2(p) * np.cos(p[:, 2])  # noqa: E731
    cases = [(f"{k} (distorted)", [4, 8, 16, 32],
              (lambda n, k=k: m.square_mesh(n, k, amount=0.25, seed=n)), f2,
              (np.e - 1) * 2 / np.pi) for k in ("quad", "triangle", "mixed")]
    cases += [(name, [2, 4, 8], (lambda n, g=g: g(n, amount=0.2, seed=n)), f3,
               (np.e - 1) * 2 / np.pi * np.sin(1.0))
              for name, g in (("hexahedra + pyramids + wedges", m.cube_mesh),
                              ("tetrahedra", m.tetra_cube))]
    out = []
    for name, ns, gen, f, exact in cases:
        errs = []
        for n in ns:
            cp = cell_points(mesh_from_arrays(*gen(n)))
            errs.append(abs(float((cp.measure * f(cp.centroid)).sum()) - exact))
        out.append((name, ns, errs, -np.polyfit(np.log(ns), np.log(errs), 1)[0]))
    return out


def family(num: int = 12, seed: int = 0):
    """The samples of the conditioning family and the bound of any unconditioned
    model (see the module docstring): the best fixed field lies in span{phi1, phi2}
    (projection), so the bound is a 2-D minimisation with the weighted Gram matrix."""
    from scipy.optimize import minimize

    from meshops.mesh.data import MeshData
    from meshops.mesh.io import mesh_from_arrays

    pts, cells = _meshes().square_mesh(6, "triangle")
    mesh = mesh_from_arrays(pts, cells)
    w = mesh.weight.numpy()
    phi = np.stack([np.sin(np.pi * pts[:, 0]) * np.sin(np.pi * pts[:, 1]), pts[:, 0] - 0.5], 1)
    rng = np.random.default_rng(seed)
    P = np.stack([rng.uniform(0.5, 1.5, num), rng.uniform(-1, 1, num)], 1)
    G = phi.T @ (w[:, None] * phi)

    def mean_rel(c):
        d = P - c
        return np.mean(np.sqrt(np.einsum("si,ij,sj->s", d, G, d))
                       / np.sqrt(np.einsum("si,ij,sj->s", P, G, P)))

    bound = minimize(mean_rel, P.mean(0), method="Nelder-Mead",
                     options=dict(xatol=1e-10, fatol=1e-12)).fun
    samples = [MeshData(pos=torch.from_numpy(pts).float(), weight=mesh.weight.float(),
                        x=torch.zeros(len(pts), 0), y=torch.from_numpy(phi @ p).float()[:, None],
                        params=torch.from_numpy(p).float()[None]) for p in P]
    return samples, float(bound)


def mean_relative_error(model, samples) -> float:
    """Mean over the samples of the quadrature-weighted relative L2 error (float64)."""
    errs = []
    for s in samples:
        pred, u, w = model.predict(s)[:, 0].double(), s.y[:, 0].double(), s.weight.double()
        errs.append(float(((w * (pred - u) ** 2).sum() / (w * u ** 2).sum()).sqrt()))
    return float(np.mean(errs))


def fit_family(name: str, param_channels: int, samples, steps: int = 150) -> float:
    """Train ``name`` on the family (full batch, Adam 1e-2, seed 0) and return its mean
    relative L2 error on the samples."""
    from torch_geometric.loader import DataLoader

    from meshops.models import get_model
    from meshops.models.conditioning import fit_param_normalizer
    from meshops.training.loss import RelativeLpLoss
    from meshops.training.seed import seed_everything

    seed_everything(0)
    model = get_model(name, in_channels=0, out_channels=1, param_channels=param_channels,
                      **CONFIGS[name])
    fit_param_normalizer(model, samples)
    transform = model.mesh_transform()
    batch = next(iter(DataLoader([transform(s.clone()) if transform else s for s in samples],
                                 batch_size=len(samples))))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = RelativeLpLoss()
    for _ in range(steps):
        opt.zero_grad()
        loss(model(batch), batch.y, batch.weight, batch.batch).backward()
        opt.step()
    return mean_relative_error(model, samples)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("# midpoint rule on cells: |sum_c |K_c| f(x_c) - integral f|")
    for name, ns, errs, order in midpoint_orders():
        print(f"{name:<32} n={ns} errors={['%.3e' % e for e in errs]} order={order:.2f}")
    samples, bound = family()
    print(f"# conditioning family: bound of any model without params {bound:.4f}; "
          f"{args.steps} full-batch Adam steps")
    for name in CONFIGS:
        t = time.perf_counter()
        without, with_ = fit_family(name, 0, samples, args.steps), fit_family(name, 2, samples,
                                                                               args.steps)
        print(f"{name:<22} without params {without:.4f}  with params {with_:.4f}  "
              f"({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
