"""A transient **stand-in** whose geometry changes between trajectories: a hot spot
spreading in a heated plate with a cooled hole, one mesh per trajectory.

Synthetic data. Trajectory ``s`` solves, with P1 finite elements (scikit-fem) and
implicit Euler in time, on the unit square minus a disc ``|x - c| < r``,

    u_t = laplace(u) + q                    (uniform heating q),
    u = 0                                   on the hole (cooled),
    du/dn + Bi * u = 0                      on the square's sides (convective cooling),
    u(x, 0) = exp(-|x - p|^2 / (2 w^2))     (a hot spot at p, zero on the hole),

with six parameters ``(cx, cy, r, Bi, px, py)``: the hole (as in
:mod:`data_adapters.standins.hole`), the Biot number and the hot spot's centre (uniform
in the square, at least ``w`` outside the hole). The states are saved every ``dt``
(``steps`` of them after the initial one), each computed with ``substeps`` implicit
Euler steps. Each trajectory has its own quality mesh (``triangle``, 30 degrees; about
200-400 nodes with the default sizes), so a reduced basis of one mesh does not apply: a
surrogate must read the geometry, and a next-step model learns the local law (the
spot spreads, the hole and the sides cool, the plate heats) that holds on every shape.

The heat equation's decay of one eigenmode checks the time stepping in the tests: on
the mesh, ``u0`` an eigenvector of the generalised problem ``K v = lambda M v`` decays
exactly by ``(1 + lambda dt / n)^(-n)`` per saved step with ``q = 0``
(:func:`evolve`).

:func:`write_transient_hole_series` writes the trajectories as time-series folders
(``OUT/train/traj_000/u_0000.vtu`` ..., ``params.csv``; ``OUT/test/...``) for
``meshops train --series``::

    python -m data_adapters.standins.transient_hole heat-hole/
    meshops train --series --data heat-hole/train --inputs "" --targets u \\
        --params cx,cy,r,Bi,px,py
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from data_adapters.standins.hole import MARGIN, SQUARE, heat_operators, mesh_with_hole
from meshops.errors import MeshError

PARAMS = ("cx", "cy", "r", "Bi", "px", "py")
FIELD = "u"
#: The hot spot's width, the heating, the time between saved states, their number,
#: and the implicit Euler steps per saved step.
SPOT_WIDTH = 0.1
HEATING = 4.0
DT = 0.002
STEPS = 40
SUBSTEPS = 4


def sample_params(count: int, seed: int = 0) -> np.ndarray:
    """``[count, 6]`` parameters ``(cx, cy, r, Bi, px, py)`` drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        r = rng.uniform(0.08, 0.2)
        lo, hi = MARGIN + r, 1.0 - MARGIN - r
        cx, cy = lo + (hi - lo) * rng.uniform(size=2)
        bi = math.exp(rng.uniform(math.log(0.1), math.log(10.0)))
        while True:  # a hot spot clear of the hole
            px, py = rng.uniform(0.1, 0.9, 2)
            if math.hypot(px - cx, py - cy) > r + 2 * SPOT_WIDTH:
                break
        out.append([cx, cy, r, bi, px, py])
    return np.asarray(out)


def evolve(K, M, fixed, u0, heating: float, dt: float, steps: int, substeps: int
           ) -> np.ndarray:
    """``[steps + 1, N]`` states of ``M u' = -K u + M q`` (``u = 0`` at ``fixed``) by
    implicit Euler, ``substeps`` per saved step of ``dt``."""
    from scipy.sparse.linalg import splu

    n = K.shape[0]
    free = np.setdiff1d(np.arange(n), fixed)
    h = dt / substeps
    A = (M + h * K)[free][:, free].tocsc()
    lu = splu(A)
    Mf = M[free][:, free]
    load = h * heating * np.asarray(M[free].sum(axis=1)).ravel()  # M @ (q * ones)
    u = np.array(u0, np.float64)
    u[fixed] = 0.0
    out = [u.copy()]
    for _ in range(steps):
        for _ in range(substeps):
            u[free] = lu.solve(Mf @ u[free] + load)
        out.append(u.copy())
    return np.stack(out)


def make_trajectory(params, h: float = 0.08, h_hole: float = 0.03, steps: int = STEPS):
    """One trajectory: ``(points [N, 2], triangles [M, 3], u [steps + 1, N])``."""
    cx, cy, r, bi, px, py = (float(v) for v in params)
    points, triangles = mesh_with_hole(SQUARE, (cx, cy), r, h, h_hole)
    K, M, fixed, _ = heat_operators(points, triangles, (cx, cy), r, bi)
    K, M = K.tocsc(), M.tocsc()
    d2 = ((points - [px, py]) ** 2).sum(1)
    u0 = np.exp(-d2 / (2 * SPOT_WIDTH ** 2))
    return points, triangles, evolve(K, M, fixed, u0, HEATING, DT, steps, SUBSTEPS)


def write_transient_hole_series(out, n_train: int = 48, n_test: int = 12, seed: int = 0,
                                overwrite: bool = False, steps: int = STEPS
                                ) -> dict[str, list[Path]]:
    """Write ``n_train + n_test`` trajectories of ``steps + 1`` states (parameters from
    ``seed``, the first ``n_train`` for training) as time-series folders ``out/train``
    and ``out/test``,
    each folder completely or not at all. The files store no time: step ``k`` is at
    time ``k`` for ``meshops`` (``k * DT`` in the equation's units).

    Raises:
        MeshError: ``out`` already holds an export (unless ``overwrite``).
    """
    from meshops.datasets.params import write_param_table
    from meshops.mesh.io import mesh_from_arrays, write_mesh
    from meshops.utils.atomic import atomic_folder

    out = Path(out)
    if not overwrite and any((out / split).exists() for split in ("train", "test")):
        raise MeshError(f"{out}: already holds an export (train/ or test/); pass "
                        f"overwrite=True (--overwrite) or choose another folder")
    params = sample_params(n_train + n_test, seed)
    written: dict[str, list[Path]] = {"train": [], "test": []}
    rows: dict[str, dict] = {"train": {}, "test": {}}
    for i, p in enumerate(params):
        split = "train" if i < n_train else "test"
        points, triangles, u = make_trajectory(p, steps=steps)
        mesh = mesh_from_arrays(points, [("triangle", triangles)])
        name = f"traj_{i:03d}"

        def write_steps(tmp: str, u=u, mesh=mesh) -> None:
            for k, uk in enumerate(u):
                write_mesh(Path(tmp) / f"{FIELD}_{k:04d}.vtu", mesh, point_data={FIELD: uk})

        written[split].append(atomic_folder(out / split / name, write_steps))
        rows[split][name] = p
    for split in ("train", "test"):
        write_param_table(out / split, list(PARAMS), rows[split])
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m data_adapters.standins.transient_hole",
        description="Write the transient plate-with-a-hole stand-in as time-series folders "
                    "(train/ and test/, params.csv) for meshops train --series.")
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--n-train", type=int, default=48)
    p.add_argument("--n-test", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    w = write_transient_hole_series(args.out, args.n_train, args.n_test, args.seed,
                                    args.overwrite)
    print(f"wrote {len(w['train'])} training and {len(w['test'])} test series to {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
